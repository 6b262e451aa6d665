"""Fused bias + exact GELU, forward and backward, with the bias gradient fused into the backward.

In the sequence FFN ``ffn2(gelu(ffn1(x)))`` (T = 196,608 tokens × hidden 2048, bf16) Inductor's
kernels measured on the H200 per layer: GELU forward 0.599 ms (reads h, writes a: 1.61 GB, 2.7 TB/s
against a 4.05 TB/s copy), GELU backward 0.813 ms (reads h and dA, writes dH and recomputes
``a = gelu(h)`` for ffn2's weight gradient), then a column sum of dH for ffn1's bias gradient,
0.214 ms (reads dH again). Here ``h0`` is ffn1's matmul output *without* its bias ``b``:

- forward ``a = gelu(h0 + b)``: reads ``h0`` (and ``b`` once per program), writes ``a``;
- backward: reads ``dA`` and ``h0``, writes ``dH = dA · gelu'(h0 + b)`` and the fp32 column sums
  of dH (before rounding) as per-program partials ``[row programs, H]``, summed by torch in a fixed
  order (deterministic, no atomics). No recompute of ``a`` (autograd keeps the op's output for
  ffn2's weight gradient), no second read of dH.

Exact GELU in fp32: ``gelu(x) = x·Φ(x) = 0.5·x·(1 + erf(x/√2))`` and
``gelu'(x) = Φ(x) + x·φ(x) = 0.5·(1 + erf(x/√2)) + x·exp(-x²/2)/√(2π)``. ``tl.math.erf`` (the same
function as ``tl.erf``) is libdevice's ``erff`` on CUDA and ``math.erf`` in the interpreter. Where
``erf(x/√2) → -1`` (x < -4) ``1 + erf`` cancels in fp32, here as in ``F.gelu``: those tiny values
carry ~1e-7 absolute error, so two correct fp32 implementations can differ there by a few bf16 ulps.

Cost: compiled for sm_90 the forward is ~37 SASS instructions per element and the backward's loop
~50 (``erff`` alone ~25: a coefficient select, 7 FMAs, an ``ex2``). At the H200's issue rate
(132 SMs × 128 lanes × ~1.98 GHz) that is ~0.45 ms and ~0.60 ms at T·H = 196608·2048, about the
copy-rate time of the bytes (0.40 ms and 0.60 ms): the kernels sit at the edge of issue-bound.

Layers, top to bottom: the kernels and their launch tables; ``bias_gelu_fwd`` / ``bias_gelu_bwd``
(shape checks, then the kernels on CUDA, or on CPU under ``TRITON_INTERPRET=1``, else the torch
references ``bias_gelu_fwd_ref`` / ``bias_gelu_bwd_ref``); the custom ops ``gemtwin::bias_gelu``
and ``gemtwin::bias_gelu_bwd`` with fakes and autograd, so ``torch.compile`` traces ``bias_gelu``
without a graph break. Mixed dtypes are fine (autocast: ``h0`` bf16, ``b`` an fp32 Parameter):
``a`` and ``dH`` come in the activation's dtype, ``db`` in ``b``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _rcp(x, APPROX: tl.constexpr):
    """``1/x``; ``APPROX`` (CUDA only): PTX ``rcp.approx.ftz.f32``, one MUFU.RCP (≤ 1 ulp), where
    ``div.full.f32`` adds ~7 range checks and scalings per element."""
    if APPROX:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    return 1.0 / x


@triton.jit
def _cdf_fast(x, APPROX_RCP: tl.constexpr = False):
    """``(Φ(x), exp(-x²/2))`` of fp32 ``x`` from Abramowitz & Stegun 7.1.26: for ``z = |x|/√2``,
    ``erfc(z) ≈ t·(a1 + t·(a2 + … + t·a5))·exp(-z²)`` with ``t = 1/(1 + p·z)``, absolute error
    ≤ 1.5e-7 (fp32 rounding of ``1 + erf`` near -1 is of the same order). One ``rcp``, one ``ex2``
    and ~10 FMAs, against libdevice ``erff``'s ~25 instructions; the ``exp`` is the one ``φ(x)``
    needs in the backward, and ``Φ`` for x < 0 is ``erfc/2`` directly, with no cancellation.
    Constants folded: ``p/√2``; ``aᵢ/2`` (so the polynomial gives ``erfc/2``); ``exp(-x²/2)`` as
    ``exp2(x²·(-log2(e)/2))``."""
    t = _rcp(1.0 + 0.23164190372 * tl.abs(x), APPROX_RCP)  # p/√2, p = 0.3275911
    e = tl.exp2(x * x * -0.7213475204444817)  # -log2(e)/2
    half_erfc = t * (0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145)))) * e
    return tl.where(x < 0, half_erfc, 1.0 - half_erfc), e


@triton.jit
def _gelu(x, FAST_ERF: tl.constexpr):
    """Exact GELU of fp32 ``x``: ``x·Φ(x) = 0.5·x·(1 + erf(x/√2))`` (``FAST_ERF``: ``_cdf_fast``)."""
    if FAST_ERF:
        return x * _cdf_fast(x, FAST_ERF == 2)[0]
    return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))


@triton.jit
def _gelu_grad(x, FAST_ERF: tl.constexpr):
    """``gelu'(x) = Φ(x) + x·φ(x)`` of fp32 ``x``, with ``φ(x) = exp(-x²/2)/√(2π)``."""
    if FAST_ERF:
        cdf, e = _cdf_fast(x, FAST_ERF == 2)
        return cdf + x * (e * 0.3989422804014327)
    cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
    return cdf + x * (tl.exp(-0.5 * x * x) * 0.3989422804014327)


@triton.jit
def _bias_gelu_fwd_kernel(h_ptr, b_ptr, a_ptr,  # h0, a: contiguous [T, H]; b: [H]
                T, H,
                BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, FAST_ERF: tl.constexpr = False):
    """Program ``(i, j)``: rows ``[i·BLOCK_T, (i+1)·BLOCK_T)`` × columns ``[j·BLOCK_H, (j+1)·BLOCK_H)``,
    both masked; ``a = gelu(h0 + b)`` in fp32, stored in ``a``'s dtype. The bias row is loaded once;
    the tile's offsets are int32 from an int64 row base."""
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cmask = cols < H
    bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    r = tl.program_id(0).to(tl.int64) * BLOCK_T
    i = tl.arange(0, BLOCK_T)
    p = i[:, None] * H + cols[None, :]
    m = (i < T - r)[:, None] & cmask[None, :]
    x = tl.load(h_ptr + r * H + p, mask=m, other=0.0).to(tl.float32) + bias[None, :]
    tl.store(a_ptr + r * H + p, _gelu(x, FAST_ERF).to(a_ptr.dtype.element_ty), mask=m)


@triton.jit
def _bias_gelu_bwd_kernel(da_ptr, h_ptr, b_ptr, dh_ptr,  # dA, h0, dH: contiguous [T, H]; b: [H]
                part_ptr,  # fp32 [cdiv(T, BLOCK_T·ROWS_PER_PROGRAM), H]: this program's column sums
                T, H,
                BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
                FAST_ERF: tl.constexpr = False):
    """Program ``(i, j)``: the columns of block ``j`` over up to ``ROWS_PER_PROGRAM`` row tiles of
    ``BLOCK_T`` rows from row ``i·BLOCK_T·ROWS_PER_PROGRAM`` (the loop stops at ``T``). Per tile
    ``dH = dA·gelu'(h0 + b)`` in fp32, stored in ``dH``'s dtype and added to an fp32 register tile;
    at the end its column sums go to row ``i`` of the partials."""
    pid = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cmask = cols < H
    bias = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    i = tl.arange(0, BLOCK_T)
    p = i[:, None] * H + cols[None, :]
    row0 = pid.to(tl.int64) * (BLOCK_T * ROWS_PER_PROGRAM)
    n_tiles = tl.minimum(tl.cdiv(T - row0, BLOCK_T), ROWS_PER_PROGRAM).to(tl.int32)
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    for k in range(n_tiles):
        r = row0 + k * BLOCK_T
        m = (i < T - r)[:, None] & cmask[None, :]
        da = tl.load(da_ptr + r * H + p, mask=m, other=0.0).to(tl.float32)
        x = tl.load(h_ptr + r * H + p, mask=m, other=0.0).to(tl.float32) + bias[None, :]
        dh = da * _gelu_grad(x, FAST_ERF)  # masked: dA = 0, x = b (finite, or the column is NaN anyway)
        tl.store(dh_ptr + r * H + p, dh.to(dh_ptr.dtype.element_ty), mask=m)
        acc += dh
    tl.store(part_ptr + pid.to(tl.int64) * H + cols, tl.sum(acc, axis=0), mask=cmask)


# Launch tables (``bench_bias_gelu`` checks and times every entry at T=196608, H=2048 bf16).
# Elements per thread = BLOCK_T·BLOCK_H / (32·num_warps), in the comments with the registers
# ptxas gives for sm_90 (``bench_bias_gelu --compile-only``); 64 per thread takes 155 (fwd) to 255
# (bwd) registers, too few warps per SM to hide memory latency. Backward programs at that shape:
# T / (BLOCK_T·ROWS_PER_PROGRAM) row programs × H / BLOCK_H column blocks (the H200 has 132 SMs);
# partials = row programs × H × 4 B, written once and summed by torch.
# Measured (s17, ``bench_bias_gelu``, libdevice erf, T=196608 × 2048 bf16; copy 0.383 ms): forward
# t16_h256_w4 0.548 ms (best; Inductor's gelu(h) 0.577), backward t8_h256_r32_w4 0.825 ms (best,
# r64 0.827; Inductor's gelu backward with its GELU recompute and the bias sum 1.075). Both run at
# ~2.9 TB/s, below the copy's 4.2: issue-bound (~37 and ~50 SASS instructions per element),
# hence the fast erf (``_cdf_fast``), on by default for 16-bit activations. With it (s18, same
# bench, one run): forward t16_h256_w4 0.413 ms (3.9 TB/s; its libdevice twin 0.566, Inductor
# 0.575), backward t2_h1024_r128_w4 0.722 ms (best; t8_h256_r32_w4 0.819, its libdevice twin 0.966,
# Inductor 1.073): per layer 1.13 ms against Inductor's 1.65 (hwmodels/data/runs/h200-2026-11-30-ffn/).
FWD_CONFIGS: dict[str, dict] = {
    "t8_h256_w4": dict(BLOCK_T=8, BLOCK_H=256, num_warps=4),  # 16 per thread, 42 registers
    "t2_h1024_w4": dict(BLOCK_T=2, BLOCK_H=1024, num_warps=4),  # 16, 32
    "t16_h256_w4": dict(BLOCK_T=16, BLOCK_H=256, num_warps=4),  # 32, 72
    "t4_h1024_w4": dict(BLOCK_T=4, BLOCK_H=1024, num_warps=4),  # 32, 72
    "t16_h512_w8": dict(BLOCK_T=16, BLOCK_H=512, num_warps=8),  # 32, 73
    "t32_h256_w8": dict(BLOCK_T=32, BLOCK_H=256, num_warps=8),  # 32, 75
}
BWD_CONFIGS: dict[str, dict] = {  # elements per thread, registers; row programs × column blocks
    "t8_h256_r32_w4": dict(BLOCK_T=8, BLOCK_H=256, ROWS_PER_PROGRAM=32, num_warps=4),  # 16, 95; 768 × 8
    "t8_h256_r64_w4": dict(BLOCK_T=8, BLOCK_H=256, ROWS_PER_PROGRAM=64, num_warps=4),  # 16, 95; 384 × 8
    "t4_h512_r64_w4": dict(BLOCK_T=4, BLOCK_H=512, ROWS_PER_PROGRAM=64, num_warps=4),  # 16, 80; 768 × 4
    "t2_h1024_r128_w4": dict(BLOCK_T=2, BLOCK_H=1024, ROWS_PER_PROGRAM=128, num_warps=4),  # 16, 72; 768 × 2
    "t16_h256_r32_w8": dict(BLOCK_T=16, BLOCK_H=256, ROWS_PER_PROGRAM=32, num_warps=8),  # 16, 80; 384 × 8
    "t16_h256_r32_w4": dict(BLOCK_T=16, BLOCK_H=256, ROWS_PER_PROGRAM=32, num_warps=4),  # 32, 165; 384 × 8
}
# libdevice erff on 16-bit activations too, for the bench's side-by-side with the fast erf
FWD_CONFIGS["t16_h256_w4_libdevice"] = dict(FWD_CONFIGS["t16_h256_w4"], FAST_ERF=False)
BWD_CONFIGS["t8_h256_r32_w4_libdevice"] = dict(BWD_CONFIGS["t8_h256_r32_w4"], FAST_ERF=False)
DEFAULT = {"fwd": "t16_h256_w4", "bwd": "t2_h1024_r128_w4"}

# The kernels run on CPU tensors only when ``@triton.jit`` made interpreted functions (the
# ``TRITON_INTERPRET=1`` it reads when this module is imported).
_INTERPRETED = not isinstance(_bias_gelu_fwd_kernel, triton.runtime.JITFunction)


def _config(config: str | dict | None, table: dict[str, dict], kind: str) -> dict:
    if config is None:
        return table[DEFAULT[kind]]
    if isinstance(config, str):
        if config not in table:
            raise ValueError(f"bias_gelu_{kind}: config {config!r} is not one of {sorted(table)}; "
                             "pass a name or a dict")
        return table[config]
    return config


def _fast_erf(cfg: dict, act: Tensor) -> bool:
    """``cfg["FAST_ERF"]`` if given, else on for 16-bit activations (``_cdf_fast``'s 1.5e-7 is far
    below half a bf16/fp16 ulp of Φ) and off for fp32 (libdevice ``erff``). ``act`` is the caller's
    tensor, not the interpreter's fp32 copy (``_kernel_io``)."""
    return bool(cfg.get("FAST_ERF", act.element_size() == 2))


def _check(h0: Tensor, b: Tensor, da: Tensor | None = None, *, contiguous: bool = True) -> None:
    """One-line ValueErrors naming the argument, its shape and the fix."""
    if h0.dim() != 2:
        raise ValueError(f"bias_gelu: h0 must be 2-D [T, H]; got shape {tuple(h0.shape)} (reshape it to [-1, H])")
    if b.dim() != 1 or b.shape[0] != h0.shape[1]:
        raise ValueError(f"bias_gelu: b must be [H] = [{h0.shape[1]}] to match h0 {tuple(h0.shape)}; "
                         f"got shape {tuple(b.shape)}")
    if da is not None and da.shape != h0.shape:
        raise ValueError(f"bias_gelu_bwd: da must have h0's shape {tuple(h0.shape)}; got shape {tuple(da.shape)}")
    for name, t in (("h0", h0), ("b", b), ("da", da)):
        if t is None:
            continue
        if not t.is_floating_point():
            raise ValueError(f"bias_gelu: {name} must be floating point; got {t.dtype} of shape {tuple(t.shape)}")
        if t.device != h0.device:
            raise ValueError(f"bias_gelu: {name} is on {t.device}, h0 on {h0.device}; move them to one device")
        if contiguous and name != "b" and not t.is_contiguous():
            raise ValueError(f"bias_gelu: {name} of shape {tuple(t.shape)} must be contiguous; "
                             f"pass {name}.contiguous()")


def _runs_triton(*ts: Tensor) -> bool:
    """The kernels take the tensors: fp32/bf16/fp16 on CUDA, or on CPU under the interpreter."""
    on_device = ts[0].is_cuda or (_INTERPRETED and ts[0].device.type == "cpu")
    return on_device and all(t.dtype in _KERNEL_DTYPES for t in ts)


def _kernel_io(t: Tensor) -> Tensor:
    """The tensor a kernel reads: in the interpreter, 16-bit inputs widened to fp32 (triton 3.7's
    interpreter widens 16-bit subnormals wrongly; ``fake_quantize._prepare`` does the same), and
    the kernel writes fp32 that torch rounds."""
    return t.float() if not t.is_cuda and t.dtype != torch.float32 else t


def bias_gelu_fwd_ref(h0: Tensor, b: Tensor) -> Tensor:
    """``gelu(h0 + b)`` (exact) in fp32 (fp64 for fp64 inputs), returned in ``h0``'s dtype."""
    wide = torch.promote_types(h0.dtype, torch.float32)
    return F.gelu(h0.to(wide) + b.to(wide)).to(h0.dtype)


def bias_gelu_bwd_ref(da: Tensor, h0: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``(dH, db)``: ``dH = dA·gelu'(h0 + b)`` in fp32 (fp64 for fp64 inputs) returned in ``da``'s
    dtype, and ``db`` its column sums (before rounding) in ``b``'s dtype."""
    wide = torch.promote_types(h0.dtype, torch.float32)
    x = h0.to(wide) + b.to(wide)
    cdf = 0.5 * (1.0 + torch.erf(x * 0.7071067811865476))
    dh = da.to(wide) * (cdf + x * torch.exp(-0.5 * x * x) * 0.3989422804014327)
    return dh.to(da.dtype), dh.sum(0).to(b.dtype)


def bias_gelu_fwd(h0: Tensor, b: Tensor, *, config: str | dict | None = None) -> Tensor:
    """``a = gelu(h0 + b)`` for ``h0 [T, H]`` (contiguous) and ``b [H]``, in ``h0``'s dtype: the
    Triton kernel where it can run (``_runs_triton``), else ``bias_gelu_fwd_ref``. ``config``: a
    name of ``FWD_CONFIGS`` or a dict of the same keys. No autograd (``bias_gelu`` has it)."""
    _check(h0, b)
    if not _runs_triton(h0, b):
        return bias_gelu_fwd_ref(h0, b)
    cfg = _config(config, FWD_CONFIGS, "fwd")
    T, H = h0.shape
    hk = _kernel_io(h0)
    a = torch.empty_like(hk)
    if T and H:
        grid = (triton.cdiv(T, cfg["BLOCK_T"]), triton.cdiv(H, cfg["BLOCK_H"]))
        _bias_gelu_fwd_kernel[grid](hk, _kernel_io(b.contiguous()), a, T, H, BLOCK_T=cfg["BLOCK_T"],
                                    BLOCK_H=cfg["BLOCK_H"], FAST_ERF=_fast_erf(cfg, h0), num_warps=cfg["num_warps"])
    return a.to(h0.dtype)


def bias_gelu_bwd(da: Tensor, h0: Tensor, b: Tensor, *, config: str | dict | None = None) -> tuple[Tensor, Tensor]:
    """``(dH, db)`` of ``a = gelu(h0 + b)`` given ``dA``: ``dH`` in ``da``'s dtype, ``db`` (the fp32
    column sums of dH before rounding) in ``b``'s. The Triton kernel where it can run, else
    ``bias_gelu_bwd_ref``. ``config``: a name of ``BWD_CONFIGS`` or a dict of the same keys."""
    _check(h0, b, da)
    if not _runs_triton(h0, b, da):
        return bias_gelu_bwd_ref(da, h0, b)
    cfg = _config(config, BWD_CONFIGS, "bwd")
    T, H = h0.shape
    dak = _kernel_io(da)
    dh = torch.empty_like(dak)
    rows = cfg["BLOCK_T"] * cfg["ROWS_PER_PROGRAM"]  # per program; each writes its row of partials
    partial = torch.empty((triton.cdiv(T, rows), H), dtype=torch.float32, device=h0.device)
    if T and H:
        grid = (partial.shape[0], triton.cdiv(H, cfg["BLOCK_H"]))
        _bias_gelu_bwd_kernel[grid](dak, _kernel_io(h0), _kernel_io(b.contiguous()), dh, partial, T, H,
                                    BLOCK_T=cfg["BLOCK_T"], BLOCK_H=cfg["BLOCK_H"],
                                    ROWS_PER_PROGRAM=cfg["ROWS_PER_PROGRAM"], FAST_ERF=_fast_erf(cfg, da),
                                    num_warps=cfg["num_warps"])
    return dh.to(da.dtype), partial.sum(0).to(b.dtype)


# ---- the custom ops: torch.compile traces them as single nodes -------------------------------
@torch.library.custom_op("gemtwin::bias_gelu", mutates_args=())
def _bias_gelu_op(h0: Tensor, b: Tensor) -> Tensor:
    """``gelu(h0 + b)`` (``bias_gelu_fwd``; inputs made contiguous, a no-op for a matmul output)."""
    return bias_gelu_fwd(h0.contiguous(), b)


@_bias_gelu_op.register_fake
def _(h0, b):
    _check(h0, b, contiguous=False)
    return h0.new_empty(h0.shape)


@torch.library.custom_op("gemtwin::bias_gelu_bwd", mutates_args=())
def _bias_gelu_bwd_op(da: Tensor, h0: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``(dH, db)`` (``bias_gelu_bwd``; inputs made contiguous)."""
    return bias_gelu_bwd(da.contiguous(), h0.contiguous(), b)


@_bias_gelu_bwd_op.register_fake
def _(da, h0, b):
    _check(h0, b, da, contiguous=False)
    return da.new_empty(da.shape), b.new_empty(b.shape)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)  # h0, b: the backward needs x = h0 + b, not the output


def _backward(ctx, da):
    h0, b = ctx.saved_tensors
    return _bias_gelu_bwd_op(da, h0, b)


_bias_gelu_op.register_autograd(_backward, setup_context=_setup_context)


def bias_gelu(h0: Tensor, b: Tensor) -> Tensor:
    """``gelu(h0 + b)`` (exact GELU) for ``h0 [T, H]`` (ffn1's matmul output without its bias) and
    ``b [H]``, with autograd: the backward gives ``dh`` and ``db`` from one pass over ``dA`` and
    ``h0``. In ``h0``'s dtype; ``b`` may be wider (an fp32 Parameter under bf16 autocast)."""
    _check(h0, b, contiguous=False)
    return _bias_gelu_op(h0, b)


__all__ = ["BWD_CONFIGS", "DEFAULT", "FWD_CONFIGS", "bias_gelu", "bias_gelu_bwd", "bias_gelu_bwd_ref",
           "bias_gelu_fwd", "bias_gelu_fwd_ref"]
