"""The Triton core of the jagged attention family: ``attention_fwd`` and ``attention_bwd``.

Semantics and calling convention: ``kernels/ATTENTION.md``; design, tiles and measurements:
``NOTES.md`` beside this file. The family's op (``kernels/attention/op.py``) calls these two
functions; dense sides reach them as jagged tensors with ``offsets = arange(B+1) * N``.

Nothing here is kept between calls or read from the environment: the variants and tile
overrides come in ``flash`` (``options.FlashOptions``), the work lists in the caller's ``cache``
(``work.WorkCache``), ``poison_outputs`` and ``launched`` are arguments. The table of tiles is
``tiles.py``, the work lists ``work.py``, the kernels ``_kernels.py`` and ``_block.py``.

On CPU tensors the kernels run under Triton's interpreter, which must be switched on
(``TRITON_INTERPRET=1``) before this module is imported (``tests/conftest.py`` does it).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.flash import _block as KB
from kernels.flash import _kernels as K
from kernels.flash import _tma as KT
from kernels.flash import tiles as TT
from kernels.flash.options import Config, FlashOptions, Tiles, weight_code
from kernels.flash.work import WorkCache, work

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
LOG2E = 1.4426950408889634
#: The kernels were decorated under the interpreter (``TRITON_INTERPRET=1`` at import): Triton's
#: own type for them, rather than the environment variable read again.
INTERPRETED = isinstance(K._fwd_kernel, InterpretedFunction)


class _Launch(NamedTuple):
    """What one call launches with (none of it changes what is computed)."""

    flash: FlashOptions
    cache: WorkCache | None
    poison: bool  # outputs filled with NaN before the kernels run (unwritten rows then show)
    launched: dict | None  # name -> compiled kernel of each launch (tests, resources)

    def work(self, own_off, other_off, tile, max_len, total, reverse):
        return work(own_off, other_off, tile, int(max_len), total, reverse, self.cache)

    def record(self, name: str, kernel) -> None:
        if self.launched is not None:
            self.launched[name] = kernel

    def empty(self, like: Tensor, dtype=None) -> Tensor:
        out = torch.empty_like(like, dtype=dtype)
        return out.fill_(float("nan")) if self.poison else out


# ---- checks -------------------------------------------------------------------------------------
def _check(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, weight: str,
           causal: bool, block: int, quant_p: bool = False) -> None:
    weight_code(weight)  # a one-line error for an unknown weight
    if quant_p and (weight == "softmax" or block):
        raise ValueError(f"quant_p (MXFP8 P·V) is for activation weights without a block mask; got weight "
                         f"'{weight}', block {block}")
    _check_tensors(q, k, v)
    _check_offsets(q, q_offsets, kv_offsets)
    if block < 0:
        raise ValueError(f"block={block} must be >= 0 (0 = no block mask)")
    if (causal or block) and q.shape[0] != k.shape[0]:
        raise ValueError(f"causal/block masks are for self attention (q_offsets == kv_offsets); got "
                         f"{q.shape[0]} query rows and {k.shape[0]} key rows")
    if not q.is_cuda and not INTERPRETED:
        raise ValueError(f"q is on {q.device}: the Triton core runs on CUDA, or on CPU with TRITON_INTERPRET=1 "
                         "set before kernels.flash is imported")


def _check_tensors(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or q.shape[1:] != k.shape[1:]:
        raise ValueError(f"q must be [Tq, H, D] and k, v [Tk, H, D] with the same H, D; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    D = q.shape[2]
    if D < 16 or D > 128 or D & (D - 1):
        raise ValueError(f"head dim D={D} is not supported; use a power of two in 16..128")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v dtypes {q.dtype}, {k.dtype}, {v.dtype} must be one of bf16, fp16, fp32")


def _check_offsets(q: Tensor, q_offsets: Tensor, kv_offsets: Tensor) -> None:
    for name, off in (("q_offsets", q_offsets), ("kv_offsets", kv_offsets)):
        if off.dim() != 1 or off.numel() < 1 or off.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be a 1-D int32/int64 tensor [B+1]; got {off.dtype} of shape "
                             f"{tuple(off.shape)}")
        if off.device != q.device:
            raise ValueError(f"{name} is on {off.device}; put it on q's device {q.device}")
    if q_offsets.numel() != kv_offsets.numel():
        raise ValueError(f"q_offsets has {q_offsets.numel() - 1} samples and kv_offsets "
                         f"{kv_offsets.numel() - 1}; both must describe the same batch")


def _flags(q: Tensor, weight: str, causal: bool, block: int) -> dict:
    interp = not q.is_cuda
    return dict(
        WEIGHT=weight_code(weight), CAUSAL=bool(causal), BLOCK_W=int(block),
        USE_ASM=not interp and q.dtype != torch.float32,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "upcast" if interp else "default",
    )


def _rows(t: Tensor) -> Tensor:
    """``t [T, H, D]`` as the kernels take it: any row and head strides, head dim contiguous
    (so q, k, v can be views into one fused qkv projection without a copy)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides(*ts: Tensor) -> list[int]:
    """Row and head strides of each ``[T, H, D]`` tensor, in order."""
    return [s for t in ts for s in (t.stride(0), t.stride(1))]


def _zero_outside(t: Tensor, offsets: Tensor) -> Tensor:
    """Zero, in place, the rows of ``t [T, H, D]`` outside ``offsets[0]:offsets[-1]``: rows that
    belong to no sample (a static-shape batch's padding) come back as zeros, never as whatever the
    allocator held, so padded rows carry finite values forward and zero gradients backward. One
    small launch; no host sync."""
    T = t.shape[0]
    if T == 0 or t.numel() == 0:
        return t
    W = t.shape[1] * t.shape[2]
    if t.stride(2) != 1 or t.stride(1) != t.shape[2]:  # rows not contiguous inside: never for our outputs
        rows = torch.arange(T, device=t.device)
        outside = (rows < offsets[0]) | (rows >= offsets[-1])
        return t.masked_fill_(outside[:, None, None], 0)
    BR = 64
    K._zero_outside_kernel[(-(-T // BR),)](t, offsets, offsets.numel(), T, t.stride(0), W=W, BR=BR,
                                           BW=min(triton.next_power_of_2(W), 512), num_warps=4)
    return t


def _zero_grads(dq, dk, dv, q_offsets, kv_offsets):
    return _zero_outside(dq, q_offsets), _zero_outside(dk, kv_offsets), _zero_outside(dv, kv_offsets)


# ---- forward ------------------------------------------------------------------------------------
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
                  max_q: int, max_kv: int, *, weight: str, scale: float, causal: bool = False,
                  block: int = 0, quant_p: bool = False, flash: FlashOptions = FlashOptions(),
                  cache: WorkCache | None = None, poison_outputs: bool = False,
                  launched: dict | None = None) -> tuple[Tensor, Tensor]:
    """Attention of jagged queries over jagged keys/values, sample by sample.

    ``q [Tq, H, D]``, ``k, v [Tk, H, D]`` (bf16/fp16/fp32, D a power of two 16..128); sample ``b``
    owns query rows ``q_offsets[b]:q_offsets[b+1]`` and key rows ``kv_offsets[b]:kv_offsets[b+1]``
    (``[B+1]`` int32/int64; a dense side of N rows per sample is ``arange(B+1) * N``).
    ``max_q``/``max_kv`` bound the lengths (they size the grid; no host sync).

    ``weight="softmax"``: ``O = softmax(Q Kᵀ · scale + mask) V``; a row with no key gets 0.
    Otherwise ``O = (act(Q Kᵀ) · scale · mask) V`` with act = weight (silu, gelu in its tanh
    form, relu, relu2 = relu², identity). Masks, self attention only: ``causal`` (key j <= query
    i, positions from the sample's start) and ``block=W>0`` (``i // W == j // W``).

    Returns ``(o [Tq, H, D] in q.dtype, lse [H, Tq] fp32)``; ``lse`` is the natural-log
    log-sum-exp of each row's scaled scores (-inf for a row with no key) for softmax, and an
    empty tensor for the activation weights. fp32 accumulation throughout.

    ``quant_p`` (activation weights only): P is MX-quantized (E4M3, E8M0 scales) per 32 keys of
    each row, counted from the sample's first key, and dequantized before P·V — the MXFP8 P·V of
    ``kernels.mxfp8.gdpa`` (which quantizes q, k, v itself). Key tiles are then 32 rows.

    Launch only (the result is the same): ``flash`` the variants and tile overrides, ``cache``
    the work lists to reuse (None: built for this call), ``poison_outputs`` fills the outputs with
    NaN first, ``launched`` (a dict) gets each kernel launched under its name.
    """
    _check(q, k, v, q_offsets, kv_offsets, weight, causal, block, quant_p)
    run = _Launch(flash, cache, poison_outputs, launched)
    q, k, v = _rows(q), _rows(k), _rows(v)
    Tq, H, _ = q.shape
    o = run.empty(q)
    lse = (run.empty(q.new_empty((H, Tq), dtype=torch.float32)) if weight == "softmax"
           else q.new_empty((0,), dtype=torch.float32))
    fwd = _block_fwd if TT.use_block_local(q_offsets, kv_offsets, block, flash) else _fa2_fwd
    fwd(run, q, k, v, o, lse, q_offsets, kv_offsets, max_q, max_kv, weight, scale, causal, block, quant_p)
    return _zero_outside(o, q_offsets), lse


def _block_fwd(run, q, k, v, o, lse, q_offsets, kv_offsets, max_q, max_kv, weight, scale, causal, block, quant_p):
    """The block-local forward (``_block.py``): one pass per block."""
    Tq, H, D = q.shape
    bt = TT.block_local_tiles(q, block, run.flash)[0]
    bm = TT.block_tile_rows(bt, block)
    items = run.work(q_offsets, q_offsets, bm * bt.groups, max_q, Tq, reverse=False)
    if items is None or H == 0:
        return
    run.record("block_fwd", KB._block_fwd_kernel[(items[0], H)](
        q, k, v, o, lse, items[1], Tq, *_strides(q, k, v, o), float(scale), float(scale) * LOG2E,
        BM=bm, G=bt.groups, D=D, num_warps=bt.warps, num_stages=bt.stages, **_flags(q, weight, causal, block),
    ))


def _fa2_fwd(run, q, k, v, o, lse, q_offsets, kv_offsets, max_q, max_kv, weight, scale, causal, block, quant_p):
    """The FA2-style forward (``_kernels._fwd_kernel``) over the table's (or the given) tiles."""
    Tq, H, D = q.shape
    short = min(int(max_q), int(max_kv))
    cfg = TT.mx_config(q, run.flash) if quant_p else TT.config(q, int(max_kv), block, causal, weight, short, run.flash)
    tiles, aligned = TT.block_clamped(cfg.fwd, block)
    items = run.work(q_offsets, kv_offsets, tiles.own, max_q, Tq, reverse=causal)
    if items is None or H == 0:
        return
    if not quant_p and TT.use_tma(q, run.flash, k, v):
        run.record("fwd", KT._fwd_kernel[(items[0], H)](
            _desc(q, tiles.own), _desc(k, tiles.other), _desc(v, tiles.other), o, lse, items[1], Tq, o.stride(0),
            o.stride(1), float(scale), float(scale) * LOG2E, ALIGNED=aligned, BM=tiles.own, BN=tiles.other, D=D,
            num_warps=tiles.warps, num_stages=tiles.stages, **_flags(q, weight, causal, block),
        ))
        return
    run.record("fwd", K._fwd_kernel[(items[0], H)](
        q, k, v, o, lse, items[1], Tq, *_strides(q, k, v, o), float(scale), float(scale) * LOG2E,
        ALIGNED=aligned, BM=tiles.own, BN=tiles.other, D=D, QUANT_P=quant_p,
        num_warps=tiles.warps, num_stages=tiles.stages, **_flags(q, weight, causal, block),
    ))


def _desc(t: Tensor, rows: int) -> TensorDescriptor:
    """A TMA descriptor over ``t [T, H, D]`` seen as ``[T, H·D]`` (heads contiguous), loading
    ``[rows, D]`` tiles; rows past ``T`` read as zeros (``tiles.use_tma`` has checked that ``t`` has rows)."""
    T, H, D = t.shape
    return TensorDescriptor(t, shape=[T, H * D], strides=[t.stride(0), 1], block_shape=[rows, D])


# ---- backward -----------------------------------------------------------------------------------
class _Bwd(NamedTuple):
    """One backward call's problem, as its kernels take it."""

    do: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    o: Tensor
    lse: Tensor
    q_offsets: Tensor
    kv_offsets: Tensor
    max_q: int
    max_kv: int
    weight: str
    scale: float
    causal: bool
    block: int
    quant_p: bool


def attention_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                  q_offsets: Tensor, kv_offsets: Tensor, max_q: int, max_kv: int, *,
                  weight: str, scale: float, causal: bool = False, block: int = 0,
                  out: tuple[Tensor, Tensor, Tensor] | None = None, quant_p: bool = False,
                  flash: FlashOptions = FlashOptions(), cache: WorkCache | None = None,
                  poison_outputs: bool = False, launched: dict | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients ``(dq, dk, dv)`` of ``attention_fwd`` (same arguments) for the output gradient
    ``do [Tq, H, D]``; ``o`` and ``lse`` are the forward's outputs (used for softmax only; pass
    anything, e.g. empty tensors, for the activation weights).

    FlashAttention-2 style: softmax first computes ``delta = rowsum(dO ∘ O)``; one kernel walks
    the key tiles (longest sample first) and accumulates dK, dV over the query tiles that attend
    to them, a second walks the query tiles for dQ (deterministic, no atomics). Activation
    weights need no lse/delta: ``dS = (dO Vᵀ) ∘ act'(S) · scale ∘ mask`` with the exact
    derivatives (gelu: of its tanh form). Gradients come back in the inputs' dtype.

    Block masks (``block`` a power of two <= 128, one offsets tensor for both sides) take the
    block-local path instead (``_block.py``): one pass per block, softmax recomputed from the
    scores, so ``o`` and ``lse`` are not read. A cross attention with a side of at most
    ``tiles.SHORT_SIDE`` rows a sample runs its backward in one kernel (``flash.fused_short``).

    ``out``: write ``(dq, dk, dv)`` there (shapes of q, k, v; any row and head strides, head dim
    contiguous), e.g. views into one packed ``[T, 3, H, D]`` gradient, so nothing is stacked after.
    ``flash``, ``cache``, ``poison_outputs``, ``launched``: as for ``attention_fwd``.
    """
    _check(q, k, v, q_offsets, kv_offsets, weight, causal, block, quant_p)
    if do.shape != q.shape:
        raise ValueError(f"do has shape {tuple(do.shape)}; it must match q {tuple(q.shape)}")
    run = _Launch(flash, cache, poison_outputs, launched)
    p = _Bwd(_rows(do), _rows(q), _rows(k), _rows(v), o, lse, q_offsets, kv_offsets, int(max_q), int(max_kv),
             weight, float(scale), causal, block, quant_p)
    dq, dk, dv = _grad_outputs(run, p.q, p.k, p.v, out)
    H = p.q.shape[1]
    if H == 0 or (p.q.shape[0] == 0 and p.k.shape[0] == 0):
        return dq, dk, dv
    cfg = _bwd_config(run, p)
    if cfg.fused_short is not None and min(p.max_q, p.max_kv) <= TT.SHORT_SIDE and not (causal or block or quant_p):
        return _short_bwd(run, p, dq, dk, dv, cfg.fused_short)
    if TT.use_block_local(q_offsets, kv_offsets, block, flash):
        return _block_bwd(run, p, dq, dk, dv)
    return _fa2_bwd(run, p, dq, dk, dv, cfg)


def _grad_outputs(run: _Launch, q: Tensor, k: Tensor, v: Tensor, out) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)``: new tensors, or ``out``'s after checking them (poisoned if asked)."""
    if out is None:
        return run.empty(q), run.empty(k), run.empty(v)
    for name, t, like in zip(("dq", "dk", "dv"), out, (q, k, v)):
        if t.shape != like.shape or t.dtype != like.dtype or t.stride(-1) != 1:
            raise ValueError(f"out {name}: {tuple(t.shape)} {t.dtype} stride {t.stride()}; expected "
                             f"{tuple(like.shape)} {like.dtype} with the head dim contiguous")
        if run.poison:
            t.fill_(float("nan"))
    return out


def _bwd_config(run: _Launch, p: _Bwd) -> Config:
    """The dK/dV kernel's tiles (it loops over the queries) with the dQ kernel's (over the keys)."""
    if p.quant_p:
        return TT.mx_config(p.q, run.flash)
    short = min(p.max_q, p.max_kv)
    cfg = TT.config(p.q, p.max_q, p.block, p.causal, p.weight, short, run.flash)
    dq = TT.config(p.q, p.max_kv, p.block, p.causal, p.weight, short, run.flash).dq
    return cfg if dq == cfg.dq else Config(cfg.fwd, cfg.dkdv, dq, cfg.atomic_dq, cfg.fused_short)


def _check_lse(p: _Bwd) -> None:
    H, Tq = p.q.shape[1], p.q.shape[0]
    if p.weight == "softmax" and p.lse.shape != (H, Tq):
        raise ValueError(f"lse has shape {tuple(p.lse.shape)}; softmax needs [H, Tq] = {(H, Tq)}")


def _block_bwd(run: _Launch, p: _Bwd, dq: Tensor, dk: Tensor, dv: Tensor):
    """The block-local backward: one pass per block, softmax recomputed (no o or lse read)."""
    _check_lse(p)
    Tq, H, D = p.q.shape
    bt = TT.block_local_tiles(p.q, p.block, run.flash)[1]
    bm = TT.block_tile_rows(bt, p.block)
    items = run.work(p.q_offsets, p.q_offsets, bm * bt.groups, p.max_q, Tq, reverse=False)
    if items is not None:
        run.record("block_bwd", KB._block_bwd_kernel[(items[0], H)](
            p.q, p.k, p.v, p.do, dq, dk, dv, items[1], Tq, *_strides(p.q, p.k, p.v, p.do, dq, dk, dv),
            p.scale, p.scale * LOG2E, BM=bm, G=bt.groups, D=D, num_warps=bt.warps, num_stages=bt.stages,
            **_flags(p.q, p.weight, p.causal, p.block),
        ))
    return _zero_grads(dq, dk, dv, p.q_offsets, p.kv_offsets)


def _delta(p: _Bwd) -> tuple[Tensor, Tensor]:
    """``(lse, delta)`` for the FA2 kernels: softmax's ``delta = rowsum(dO ∘ O)`` (one kernel);
    placeholders for the activation weights (their backward reads neither)."""
    Tq, H, D = p.q.shape
    if p.weight != "softmax":
        none = torch.empty((1,), dtype=torch.float32, device=p.q.device)
        return none, none
    _check_lse(p)
    o = p.o.contiguous()
    delta = torch.empty((H, Tq), dtype=torch.float32, device=p.q.device)
    if Tq:
        K._delta_kernel[(-(-Tq // 64), H)](o, p.do, delta, Tq, *_strides(o, p.do), BR=64, D=D, num_warps=4)
    return p.lse, delta


def _fa2_bwd(run: _Launch, p: _Bwd, dq: Tensor, dk: Tensor, dv: Tensor, cfg: Config):
    """FA2-style: delta, then dK/dV over key tiles, then dQ over query tiles (or by atomics)."""
    lse, delta = _delta(p)
    flags = _flags(p.q, p.weight, p.causal, p.block)
    dq_target = torch.zeros(p.q.shape, dtype=torch.float32, device=p.q.device) if cfg.atomic_dq else dq
    Tq, H, D = p.q.shape
    tiles, aligned = TT.block_clamped(cfg.dkdv, p.block)
    items = run.work(p.kv_offsets, p.q_offsets, tiles.own, p.max_kv, p.k.shape[0], reverse=False)
    if items is not None and not (cfg.atomic_dq or p.quant_p) and TT.use_tma(p.q, run.flash, p.k, p.v, p.do):
        run.record("dkdv", KT._dkdv_kernel[(items[0], H)](
            _desc(p.q, tiles.other), _desc(p.k, tiles.own), _desc(p.v, tiles.own), _desc(p.do, tiles.other), lse,
            delta, dk, dv, items[1], Tq, *_strides(dk, dv), p.scale, p.scale * LOG2E, ALIGNED=aligned, BN=tiles.own,
            BM=tiles.other, D=D, num_warps=tiles.warps, num_stages=tiles.stages, **flags,
        ))
    elif items is not None:
        run.record("dkdv", K._dkdv_kernel[(items[0], H)](
            p.q, p.k, p.v, p.do, lse, delta, dk, dv, dq_target, items[1], Tq,
            *_strides(p.q, p.k, p.v, p.do, dk, dv, dq_target), p.scale, p.scale * LOG2E,
            ALIGNED=aligned, ATOMIC_DQ=cfg.atomic_dq, BN=tiles.own, BM=tiles.other, D=D, QUANT_P=p.quant_p,
            num_warps=tiles.warps, num_stages=tiles.stages, **flags,
        ))
    if cfg.atomic_dq:
        dq.copy_(dq_target)
        return _zero_grads(dq, dk, dv, p.q_offsets, p.kv_offsets)
    tiles, aligned = TT.block_clamped(cfg.dq, p.block)
    items = run.work(p.q_offsets, p.kv_offsets, tiles.own, p.max_q, Tq, reverse=p.causal)
    if items is not None:
        run.record("dq", K._dq_kernel[(items[0], H)](
            p.q, p.k, p.v, p.do, lse, delta, dq, items[1], Tq, *_strides(p.q, p.k, p.v, p.do, dq),
            p.scale, p.scale * LOG2E, ALIGNED=aligned, BM=tiles.own, BN=tiles.other, D=D,
            num_warps=tiles.warps, num_stages=tiles.stages, **flags,
        ))
    return _zero_grads(dq, dk, dv, p.q_offsets, p.kv_offsets)


def _short_bwd(run: _Launch, p: _Bwd, dq: Tensor, dk: Tensor, dv: Tensor, tiles: Tiles):
    """The backward of a cross attention whose shorter side has at most ``SHORT_SIDE`` rows a
    sample (``Config.fused_short``): ``_short_bwd_kernel``, one program per (sample, head),
    walking the long side in ``tiles.own``-row tiles."""
    _check_lse(p)
    Tq, H, D = p.q.shape
    long_q = p.max_q >= p.max_kv
    max_long, max_short = max(p.max_q, p.max_kv), min(p.max_q, p.max_kv)
    S = max(16, 1 << max(max_short - 1, 0).bit_length())
    softmax = p.weight == "softmax"
    o = p.o if softmax and not long_q else p.q  # O is read only for the short query side's delta
    lse = p.lse if softmax else torch.empty((1,), dtype=torch.float32, device=p.q.device)
    # a sample whose long side is empty has no work item: its short side's gradients stay zero
    for t in (dk, dv) if long_q else (dq,):
        t.zero_()
    long_off, short_off = (p.q_offsets, p.kv_offsets) if long_q else (p.kv_offsets, p.q_offsets)
    items = run.work(long_off, short_off, max(max_long, 1), max_long, Tq if long_q else p.k.shape[0], reverse=False)
    if items is not None:
        flags = _flags(p.q, p.weight, False, 0)
        run.record("short_bwd", K._short_bwd_kernel[(items[0], H)](
            p.q, p.k, p.v, p.do, o, lse, dq, dk, dv, items[1], Tq, *_strides(p.q, p.k, p.v, p.do, o, dq, dk, dv),
            p.scale, p.scale * LOG2E, WEIGHT=flags["WEIGHT"], USE_ASM=flags["USE_ASM"], DOT_PREC=flags["DOT_PREC"],
            LONG_Q=long_q, BL=tiles.own, S=S, D=D, num_warps=tiles.warps, num_stages=tiles.stages,
        ))
    return _zero_grads(dq, dk, dv, p.q_offsets, p.kv_offsets)
