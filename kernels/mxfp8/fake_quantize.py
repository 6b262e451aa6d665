"""Fused Triton MX fake quantization: read ``x`` once, write ``dequantize(quantize(x))`` once.

The values are ``gdpa.fake_quantize_last_ref`` / ``gdpa.fake_quantize_keys_ref`` bit for bit (the
quantizer of ``kernels/mxfp8/__init__.py``, then ``fp32(element) · 2^e``), cast to the output
dtype; no fp8 bytes, no scales, no padded buffer ever reach memory. The scale rule and the
rounding are ``kernels/common/mx_triton.py``'s (``scale_code``: E8M0 rounded up; ``fp8_round_rne`` in the
interpreter, the hardware RNE conversion on CUDA). A block holding NaN/Inf comes back all NaN.

- ``fake_quantize_last_triton``: 32-blocks along the last dim (Q and K along the head dim). A
  ``[NB, 32]`` tile of whole blocks, one reduction over axis 1.
- ``fake_quantize_keys_triton``: blocks of 32 rows counted from each sample's first row
  (``offsets [B+1]``), V along the keys; rows outside ``[offsets[0], offsets[B])`` are copied.

  Design (no host sync, every block read once): program ``(w, c)`` owns the global 32-row window
  ``[32w, 32w+32)`` and the columns ``c``; it handles every block whose **first row** lies in its
  window (each block has exactly one first row, so each is handled once). It finds the sample
  holding row ``32w`` by a binary search over ``offsets`` (``log2 B`` scalar loads that hit L1),
  then walks the samples that start inside the window: for each, the block start is the first
  ``offsets[s] + 32k >= 32w``, and the block is the ``[32, BC]`` tile of rows
  ``[start, min(start + 32, offsets[s+1]))``, masked past the sample's end (zeros: a short last
  block's scale comes from its real rows, as the zero-padded reference). The block's amax is a
  reduction over the rows, inside each thread (``BC = VEC·32·num_warps``: every warp lies along
  the columns), and the output has the input's layout, so nothing is transposed. A window
  holds about one block start on average (``ceil(T/32) + B`` blocks at most in all), so the
  grid is ``(ceil(T/32), ceil(C/BC))``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.mx_triton import fp8_round_rne as _fp8_round_rne
from kernels.common.mx_triton import scale_code as _scale_code
from kernels.mxfp8.quantize import elem_constexprs
from kernels.mxfp8.reference import check_elem


@triton.jit
def _exp2(e):
    """``2^e`` as fp32 for integer ``e`` in [-127, 127] (2^-127 is the subnormal 0x00400000)."""
    return tl.where(e > -127, (127 + e) << 23, 0x400000).to(tl.float32, bitcast=True)


@triton.jit
def _fake_cast(xf, amax, EMAX: tl.constexpr, E5M2: tl.constexpr, SOFT_CAST: tl.constexpr, MBITS: tl.constexpr,
               EMIN: tl.constexpr, AXIS: tl.constexpr):
    """fp32 ``xf`` and its blocks' ``amax`` bits (reduced over ``AXIS`` of a 2-D tile) → the
    dequantized values in fp32: ``rne_fp8(x · 2^-e) · 2^e``, NaN in a NaN/Inf block (its scale is
    NaN). Both products are exact (powers of two; a nonzero result is at least 2^-143, an fp32
    subnormal), so they are the reference's ``fp32(fp8) · scale`` bit for bit."""
    bad, e, inv = _scale_code(amax, EMAX)
    scale = tl.where(bad, float("nan"), _exp2(e))
    if AXIS == 1:
        inv, scale = inv[:, None], scale[:, None]
    else:
        inv, scale = inv[None, :], scale[None, :]
    y = xf * inv
    if SOFT_CAST:  # the interpreter: its fp8 conversion does not round to nearest even
        yb = y.to(tl.int32, bitcast=True)
        r = _fp8_round_rne(tl.abs(y), MBITS, EMIN).to(tl.int32, bitcast=True)
        r = (r | ((yb >> 31) << 31)).to(tl.float32, bitcast=True)
    elif E5M2:
        r = y.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.float32)
    else:
        r = y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.float32)
    return r * scale


@triton.jit
def _fake_quantize_last_kernel(x_ptr, y_ptr, nblocks, nb, n,
                               EMAX: tl.constexpr, E5M2: tl.constexpr, SOFT_CAST: tl.constexpr,
                               MBITS: tl.constexpr, EMIN: tl.constexpr,
                               NB: tl.constexpr, FLAT: tl.constexpr, EVEN: tl.constexpr):
    """``x``, ``y``: contiguous ``[rows, n]``; ``NB`` of the ``nblocks = rows·nb`` blocks of 32 per
    program (block ``b``: row ``b // nb``, columns ``32·(b % nb) + [0, 32)``). ``FLAT``
    (``n % 32 == 0``): block ``b`` is the flat ``b·32 + [0, 32)``; ``EVEN``: also no block mask."""
    b = tl.program_id(0).to(tl.int64) * NB + tl.arange(0, NB)
    j = tl.arange(0, 32)
    if FLAT:
        off = b[:, None] * 32 + j[None, :]
        mask = (b < nblocks)[:, None]
    else:
        col = (b % nb) * 32
        off = (b // nb)[:, None] * n + col[:, None] + j[None, :]
        mask = (b < nblocks)[:, None] & ((col[:, None] + j[None, :]) < n)
    if EVEN:
        x = tl.load(x_ptr + off)
    else:
        x = tl.load(x_ptr + off, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    amax = tl.max(xf.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
    y = _fake_cast(xf, amax, EMAX, E5M2, SOFT_CAST, MBITS, EMIN, 1).to(y_ptr.dtype.element_ty)
    if EVEN:
        tl.store(y_ptr + off, y)
    else:
        tl.store(y_ptr + off, y, mask=mask)


@triton.jit
def _fake_quantize_row_block(x_ptr, y_ptr, start, n, c, cmask, C: tl.constexpr,
                             EMAX: tl.constexpr, E5M2: tl.constexpr, SOFT_CAST: tl.constexpr,
                             MBITS: tl.constexpr, EMIN: tl.constexpr):
    """The block of rows ``[start, start + n)`` (``n <= 32``) over the columns ``c``: int64 base,
    int32 offsets inside the block (with ``C`` a constexpr, each row's address is an immediate)."""
    i = tl.arange(0, 32)
    p = i[:, None] * C + c[None, :]
    m = (i < n)[:, None] & cmask[None, :]
    xf = tl.load(x_ptr + start * C + p, mask=m, other=0.0).to(tl.float32)
    amax = tl.max(xf.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=0)
    y = _fake_cast(xf, amax, EMAX, E5M2, SOFT_CAST, MBITS, EMIN, 0)
    tl.store(y_ptr + start * C + p, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _fake_quantize_keys_kernel(x_ptr, y_ptr, off_ptr, T, B, C: tl.constexpr,
                               EMAX: tl.constexpr, E5M2: tl.constexpr, SOFT_CAST: tl.constexpr,
                               MBITS: tl.constexpr, EMIN: tl.constexpr, BC: tl.constexpr, VEC: tl.constexpr):
    """``x``, ``y``: contiguous ``[T, C]``; ``off_ptr``: int64 ``offsets [B+1]``. Program ``(w, ·)``
    handles the blocks whose first row lies in ``[32w, 32w + 32)`` and copies the window's rows
    outside the samples (module docstring). ``VEC``: the columns' contiguity as Triton sees it,
    hence the columns per thread; with ``BC = VEC·32·num_warps`` each thread holds all 32 rows."""
    r0 = tl.program_id(0).to(tl.int64) * 32
    t = tl.arange(0, BC)
    c = tl.program_id(1) * BC + ((t // VEC) * VEC + t % VEC)  # = pid·BC + t, contiguous in runs of VEC
    cmask = c < C
    first = tl.load(off_ptr)
    last = tl.load(off_ptr + B)
    if (r0 < first) | (r0 + 32 > last):  # rows outside the samples: copied
        i = tl.arange(0, 32)  # row r0 + i; int32 bounds relative to r0
        n_before = tl.minimum(tl.maximum(first - r0, 0), 32).to(tl.int32)
        n_in = tl.minimum(tl.maximum(last - r0, 0), 32).to(tl.int32)
        n_all = tl.minimum(T - r0, 32).to(tl.int32)
        m = ((i < n_before) | ((i >= n_in) & (i < n_all)))[:, None] & cmask[None, :]
        p = i[:, None] * C + c[None, :]
        tl.store(y_ptr + r0 * C + p, tl.load(x_ptr + r0 * C + p, mask=m), mask=m)
    lo = 0  # the last s with offsets[s] <= r0 (0 if none): the sample holding row r0
    hi = B
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tl.load(off_ptr + mid) <= r0:
            lo = mid
        else:
            hi = mid - 1
    s = lo
    a = tl.load(off_ptr + s)
    while (s < B) & (a < r0 + 32):  # sample s starts before the window ends
        b = tl.load(off_ptr + s + 1)
        start = a + 32 * (tl.maximum(r0 - a + 31, 0) // 32)  # its first block start >= r0 (< r0 + 32)
        if start < b:
            _fake_quantize_row_block(x_ptr, y_ptr, start, tl.minimum(b - start, 32).to(tl.int32), c, cmask, C,
                                     EMAX, E5M2, SOFT_CAST, MBITS, EMIN)
        s += 1
        a = b


# Launch tables (``bench_fake_quantize`` checks and times every entry). Defaults: the fastest of
# each table on the H200 at [196608, 4, 128] bf16 (hwmodels/data/runs/2026-11-30-mxfp8/s6-bench-fake-quantize.md, 2026-11-30:
# last nb64_w4 0.099 ms = copy's 0.099 ms; keys bc256_v4_w2 0.108 ms, 3.72 TB/s).
LAST_VARIANTS: dict[str, dict] = {
    "nb64_w4": dict(NB=64, num_warps=4),
    "nb128_w4": dict(NB=128, num_warps=4),
    "nb256_w8": dict(NB=256, num_warps=8),
}
KEYS_VARIANTS: dict[str, dict] = {
    "bc128_v1_w4": dict(BC=128, VEC=1, num_warps=4),
    "bc256_v2_w4": dict(BC=256, VEC=2, num_warps=4),
    "bc512_v4_w4": dict(BC=512, VEC=4, num_warps=4),
    "bc256_v4_w2": dict(BC=256, VEC=4, num_warps=2),
}
DEFAULT = {"last": "nb64_w4", "keys": "bc256_v4_w2"}


def _prepare(x: Tensor, elem: str, out_dtype: torch.dtype | None, soft_cast: bool | None):
    """(contiguous input, output buffer, final dtype, constexprs). In the interpreter the kernel
    reads and writes fp32 (triton 3.7 widens 16-bit subnormals wrongly) and torch casts."""
    check_elem(elem)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    cuda = x.device.type == "cuda"
    xc = x.detach().contiguous()
    if not cuda and xc.dtype in (torch.bfloat16, torch.float16):
        xc = xc.float()
    y = torch.empty(x.shape, dtype=out_dtype if cuda else torch.float32, device=x.device)
    fmt = {k: v for k, v in elem_constexprs(elem).items() if k in ("EMAX", "E5M2", "MBITS", "EMIN")}
    fmt["SOFT_CAST"] = (not cuda) if soft_cast is None else soft_cast
    return xc, y, out_dtype, fmt


def fake_quantize_last_triton(x: Tensor, elem: str = "e4m3", *, out_dtype: torch.dtype | None = None,
                              variant: str | None = None, soft_cast: bool | None = None) -> Tensor:
    """``x`` MX-quantized in 32-blocks along its last dim and dequantized, in ``out_dtype``
    (default ``x.dtype``), one fused kernel; the values of ``gdpa.fake_quantize_last_ref``. No
    autograd. ``soft_cast``: the integer RNE instead of the hardware conversion (default: on off
    CUDA, the interpreter)."""
    cfg = LAST_VARIANTS[variant or DEFAULT["last"]]
    xc, y, out_dtype, fmt = _prepare(x, elem, out_dtype, soft_cast)
    n = x.shape[-1] if x.dim() else 1
    if xc.numel():
        nb = triton.cdiv(n, 32)
        nblocks = xc.numel() // n * nb
        flat = n % 32 == 0
        _fake_quantize_last_kernel[(triton.cdiv(nblocks, cfg["NB"]),)](
            xc, y, nblocks, nb, n, **fmt, NB=cfg["NB"], FLAT=flat, EVEN=flat and nblocks % cfg["NB"] == 0,
            num_warps=cfg["num_warps"])
    return y.to(out_dtype)


def fake_quantize_keys_triton(x: Tensor, offsets: Tensor, elem: str = "e4m3", *, out_dtype: torch.dtype | None = None,
                              variant: str | None = None, soft_cast: bool | None = None) -> Tensor:
    """``x [T, ...]`` MX-quantized along the rows in blocks of 32 rows counted from each sample's
    first row (``offsets [B+1]``, on ``x``'s device) and dequantized, in ``out_dtype`` (default
    ``x.dtype``); rows outside ``[offsets[0], offsets[B])`` are copied. One fused kernel, no host
    sync; the values of ``gdpa.fake_quantize_keys_ref``. No autograd."""
    cfg = KEYS_VARIANTS[variant or DEFAULT["keys"]]
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"fake_quantize_keys: offsets must be 1-D [B+1]; got shape {tuple(offsets.shape)}")
    xc, y, out_dtype, fmt = _prepare(x, elem, out_dtype, soft_cast)
    T = x.shape[0]
    C = xc.numel() // T if T else 0
    if T and C:
        off = offsets.to(device=x.device, dtype=torch.int64).contiguous()
        grid = (triton.cdiv(T, 32), triton.cdiv(C, cfg["BC"]))
        _fake_quantize_keys_kernel[grid](xc, y, off, T, offsets.numel() - 1, C=C, **fmt, BC=cfg["BC"],
                                         VEC=cfg["VEC"], num_warps=cfg["num_warps"])
    return y.to(out_dtype)


__all__ = ["DEFAULT", "KEYS_VARIANTS", "LAST_VARIANTS", "fake_quantize_keys_triton", "fake_quantize_last_triton"]
