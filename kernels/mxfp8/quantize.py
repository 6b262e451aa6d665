"""Triton MX quantization (rules in ``kernels/mxfp8/__init__.py``), bit-exact with ``reference.quantize_ref``.

All kernels work on the oriented view ``x_t [rows, n]`` (``x`` itself for ``dim=1``, ``x.t()``
for ``dim=0``: read through strides, the transpose is never materialised), load in the input
dtype, compute in fp32, reduce |x| over each block of 32, derive the E8M0 exponent from amax's
bits, scale by the exact power of two and cast with round-to-nearest-even. Memory-bound: one read
of the input, one write of the fp8 data and the scale bytes, so what limits them on an H200 is
the instruction count and shared-memory traffic per element (the 2026-11-30 kernel at its best
launches: 17.5 SASS instructions per element for ``dim=1``, 26 plus byte-wide shared-memory
transposes for ``dim=0``; ``bench_quantize --compile-only`` prints them):

- ``tile`` (``_quantize_kernel``, the 2026-11-30 kernel): ``BR`` rows × ``G`` blocks, any strides.
- ``rows`` / ``rows4``: block dim contiguous. A ``[NB, 32]`` tile of whole blocks, one reduction
  over axis 1, no reshape. ``rows4`` splits each group of 4 elements in registers, casts them 2 at
  a time and stores 4 fp8 per int32 (8.5 instructions per element).
- ``cols`` / ``cols4``: block dim strided, the other contiguous (``dim=0`` of a row-major x, the
  orientation dgrad/wgrad need). Tiles contiguous along the other dim; a block is 32 rows of one
  column, reduced along axis 0. The output layout (block dim last, ``[C, K32]``) needs a transpose:
  ``cols`` transposes the fp8 bytes, ``cols4`` loads 4 row-slices so each thread packs 4
  consecutive-K fp8 values into an int32 and transposes words (7-8.5 instructions per element).

``VARIANTS`` / ``DEFAULT`` below are the launch table.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.mx_triton import fp8_round_rne as _fp8_round_rne
from kernels.common.mx_triton import scale_code as _scale_code
from kernels.mxfp8 import BLOCK, ELEMENTS
from kernels.mxfp8.reference import FP8, check_elem, padded


@triton.jit
def _fp8_bits_rne(y, MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr, SUB_UP: tl.constexpr):
    """fp32 ``y`` (finite, ``|y| <= max_elem``) → fp8 bits, round-to-nearest-even, in integer and
    exact fp32 arithmetic only (the Triton interpreter's own fp8 cast does not round to nearest
    even, nor carry into the exponent, nor make subnormals)."""
    ybits = y.to(tl.int32, bitcast=True)
    sign = (ybits >> 24) & 0x80
    r = _fp8_round_rne(tl.abs(y), MBITS, EMIN)
    rb = r.to(tl.int32, bitcast=True)
    Er = ((rb >> 23) & 0xFF) - 127
    normal = ((Er + BIAS) << MBITS) | ((rb >> (23 - MBITS)) & ((1 << MBITS) - 1))
    sub = (r * SUB_UP).to(tl.int32)  # SUB_UP = 2^(MBITS-EMIN): subnormal quanta, exact integers
    return (tl.where(Er >= EMIN, normal, sub) | sign).to(tl.uint8)


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, s_ptr, rows, n, n32, s_row, s_col,
                     EMAX: tl.constexpr, E5M2: tl.constexpr, SOFT_CAST: tl.constexpr,
                     MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr, SUB_UP: tl.constexpr,
                     BR: tl.constexpr, G: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    r = pid_r * BR + tl.arange(0, BR)
    c = pid_c * (G * 32) + tl.arange(0, G * 32)
    rmask = r < rows
    mask = rmask[:, None] & (c < n)[None, :]
    x = tl.load(x_ptr + r[:, None].to(tl.int64) * s_row + c[None, :].to(tl.int64) * s_col, mask=mask, other=0.0)
    x = tl.reshape(x.to(tl.float32), (BR, G, 32))
    ax = tl.abs(x)
    bad = tl.max(((ax == float("inf")) | (x != x)).to(tl.int32), axis=2)
    amax = tl.max(tl.where(x != x, 0.0, ax), axis=2)
    amax = tl.where(bad != 0, 0.0, amax)
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 - EMAX + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    e = tl.minimum(tl.maximum(e, -127), 127)
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2^-e, e in [-127, 120]: a normal fp32
    y = x * inv[:, :, None]
    y = tl.reshape(y, (BR, G * 32))
    q = _cast(y, E5M2, SOFT_CAST, MBITS, EMIN, BIAS, SUB_UP)
    nanblk = tl.reshape(tl.broadcast_to((bad != 0)[:, :, None], (BR, G, 32)), (BR, G * 32))
    q = tl.where(nanblk, 0x7F, q).to(tl.uint8)
    omask = rmask[:, None] & (c < n32)[None, :]
    tl.store(q_ptr + r[:, None].to(tl.int64) * n32 + c[None, :], q, mask=omask)
    code = tl.where(bad != 0, 255, e + 127).to(tl.uint8)
    sb = pid_c * G + tl.arange(0, G)
    nb = n32 // 32
    tl.store(s_ptr + r[:, None].to(tl.int64) * nb + sb[None, :], code, mask=rmask[:, None] & (sb < nb)[None, :])


@triton.jit
def _cast(y, E5M2: tl.constexpr, SOFT_CAST: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
          BIAS: tl.constexpr, SUB_UP: tl.constexpr):
    if SOFT_CAST:
        q = _fp8_bits_rne(y, MBITS, EMIN, BIAS, SUB_UP)
    elif E5M2:
        q = y.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    else:
        q = y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    return q


@triton.jit
def _load_row_blocks(x_ptr, nblocks, nb, n, s_row, NB: tl.constexpr, FLAT: tl.constexpr, EVEN: tl.constexpr):
    """This program's ``[NB, 32]`` tile of whole blocks along a contiguous dim: ``(b, j, bmask, x)``
    with ``b`` the flat block ids, ``j`` the element in the block. ``FLAT``: x contiguous with
    ``n % 32 == 0`` (no division, no column mask); ``EVEN``: also no block mask."""
    b = tl.program_id(0).to(tl.int64) * NB + tl.arange(0, NB)
    j = tl.arange(0, 32)
    bmask = b < nblocks
    if FLAT:
        if EVEN:
            x = tl.load(x_ptr + (b[:, None] * 32 + j[None, :]))
        else:
            x = tl.load(x_ptr + (b[:, None] * 32 + j[None, :]), mask=bmask[:, None], other=0.0)
    else:
        b32 = tl.program_id(0) * NB + tl.arange(0, NB)  # rows·nb < 2^31: divide in int32
        row = (b32 // nb).to(tl.int64)
        col = (b32 % nb) * 32
        x = tl.load(x_ptr + (row[:, None] * s_row + col[:, None] + j[None, :]),
                    mask=bmask[:, None] & ((col[:, None] + j[None, :]) < n), other=0.0)
    return b, j, bmask, x


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, nblocks, nb, n, s_row,
                          EMAX: tl.constexpr, E5M2: tl.constexpr, SOFT_CAST: tl.constexpr,
                          MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr, SUB_UP: tl.constexpr,
                          NB: tl.constexpr, FLAT: tl.constexpr):
    """Block dim contiguous (``x_t.stride(1) == 1``): the tile is ``[NB blocks, 32]``, block ``b`` =
    row ``b // nb``, columns ``32·(b % nb) + [0, 32)``; the output ``q [rows, nb·32]`` is then the
    flat ``b·32 + j`` and the scales the flat ``b``. ``FLAT`` (x contiguous, ``n % 32 == 0``): the
    input is flat too, no division, no column mask. One reduction over axis 1, no reshape."""
    b, j, bmask, x = _load_row_blocks(x_ptr, nblocks, nb, n, s_row, NB, FLAT, False)
    xf = x.to(tl.float32)
    amax = tl.max(xf.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
    bad, e, inv = _scale_code(amax, EMAX)
    q = _cast(xf * inv[:, None], E5M2, SOFT_CAST, MBITS, EMIN, BIAS, SUB_UP)
    q = tl.where(bad[:, None], 0x7F, q).to(tl.uint8)
    tl.store(q_ptr + (b[:, None] * 32 + j[None, :]), q, mask=bmask[:, None])
    tl.store(s_ptr + b, tl.where(bad, 255, e + 127).to(tl.uint8), mask=bmask)


@triton.jit
def _quantize_cols_kernel(x_ptr, q_ptr, s_ptr, K, C, n32, s_k,
                          EMAX: tl.constexpr, E5M2: tl.constexpr, SOFT_CAST: tl.constexpr,
                          MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr, SUB_UP: tl.constexpr,
                          G: tl.constexpr, BC: tl.constexpr):
    """Block dim strided, the other contiguous (``x_t.stride(0) == 1``; ``dim=0`` of a row-major
    ``x``): read ``x_t.t() [K, C]`` (``K`` the block dim, stride ``s_k``) as ``[32·G, BC]`` tiles
    contiguous along ``C``; a block is 32 rows of one column, so its amax is a reduction over axis
    1 of the ``[G, 32, BC]`` view. The fp8 tile is transposed as bytes (``[BC, 32·G]``) and stored
    contiguous along ``K`` into ``q [C, n32]``."""
    pid_k = tl.program_id(0)
    pid_c = tl.program_id(1)
    k = pid_k * (32 * G) + tl.arange(0, 32 * G)
    c = pid_c * BC + tl.arange(0, BC)
    cmask = c < C
    x = tl.load(x_ptr + (k[:, None].to(tl.int64) * s_k + c[None, :]), mask=(k < K)[:, None] & cmask[None, :], other=0.0)
    xf = tl.reshape(x.to(tl.float32), (G, 32, BC))
    amax = tl.max(xf.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)  # [G, BC]
    bad, e, inv = _scale_code(amax, EMAX)
    q = _cast(xf * inv[:, None, :], E5M2, SOFT_CAST, MBITS, EMIN, BIAS, SUB_UP)
    q = tl.where(bad[:, None, :], 0x7F, q).to(tl.uint8)
    qt = tl.trans(tl.reshape(q, (32 * G, BC)))  # [BC, 32·G]
    tl.store(q_ptr + (c[:, None].to(tl.int64) * n32 + k[None, :]), qt, mask=cmask[:, None] & (k < n32)[None, :])
    sb = pid_k * G + tl.arange(0, G)
    nbk = n32 // 32
    code = tl.trans(tl.where(bad, 255, e + 127).to(tl.uint8))  # [BC, G]
    tl.store(s_ptr + (c[:, None].to(tl.int64) * nbk + sb[None, :]), code, mask=cmask[:, None] & (sb < nbk)[None, :])


@triton.jit
def _absmax4(x0, x1, x2, x3):
    """Elementwise max of |x0..x3| (fp32); NaN wins (``max.NaN``), so a NaN/Inf anywhere shows in the bits."""
    a = tl.maximum(tl.abs(x0), tl.abs(x1), propagate_nan=tl.PropagateNan.ALL)
    b = tl.maximum(tl.abs(x2), tl.abs(x3), propagate_nan=tl.PropagateNan.ALL)
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _word4(y0, y1, y2, y3, bad, E5M2: tl.constexpr, CAST: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
           BIAS: tl.constexpr, SUB_UP: tl.constexpr):
    """fp32 ``y0..y3`` (already scaled) → one int32 holding their fp8 bytes in memory order (``y0`` the
    lowest byte); ``bad`` (broadcastable) → 0x7F7F7F7F (the element NaN four times).
    ``CAST``: 0 Triton's fp8 conversion, 1 inline PTX ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` (two
    per instruction, packed in registers; the same rounding Triton emits), 2 the integer soft cast."""
    if CAST == 1:
        if E5M2:
            w = tl.inline_asm_elementwise(
                "{ .reg .b16 lo, hi; cvt.rn.satfinite.e5m2x2.f32 lo, $2, $1; "
                "cvt.rn.satfinite.e5m2x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }",
                "=r,r,r,r,r", [y0, y1, y2, y3], dtype=tl.int32, is_pure=True, pack=1)
        else:
            w = tl.inline_asm_elementwise(
                "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
                "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }",
                "=r,r,r,r,r", [y0, y1, y2, y3], dtype=tl.int32, is_pure=True, pack=1)
    else:
        if CAST == 2:
            b0 = _fp8_bits_rne(y0, MBITS, EMIN, BIAS, SUB_UP).to(tl.int32)
            b1 = _fp8_bits_rne(y1, MBITS, EMIN, BIAS, SUB_UP).to(tl.int32)
            b2 = _fp8_bits_rne(y2, MBITS, EMIN, BIAS, SUB_UP).to(tl.int32)
            b3 = _fp8_bits_rne(y3, MBITS, EMIN, BIAS, SUB_UP).to(tl.int32)
        else:
            b0 = _cast(y0, E5M2, False, MBITS, EMIN, BIAS, SUB_UP).to(tl.int32)
            b1 = _cast(y1, E5M2, False, MBITS, EMIN, BIAS, SUB_UP).to(tl.int32)
            b2 = _cast(y2, E5M2, False, MBITS, EMIN, BIAS, SUB_UP).to(tl.int32)
            b3 = _cast(y3, E5M2, False, MBITS, EMIN, BIAS, SUB_UP).to(tl.int32)
        w = b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)
    return tl.where(bad, 0x7F7F7F7F, w)


@triton.jit
def _quantize_rows4_kernel(x_ptr, q_ptr, s_ptr, nblocks, nb, n, s_row,
                           EMAX: tl.constexpr, E5M2: tl.constexpr, CAST: tl.constexpr,
                           MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr, SUB_UP: tl.constexpr,
                           NB: tl.constexpr, FLAT: tl.constexpr, EVEN: tl.constexpr):
    """``_quantize_rows_kernel`` writing 4 fp8 bytes per int32 (``q_ptr``: the output as int32
    ``[rows·nb·8]``): the ``[NB, 32]`` tile is split in registers into the 4 elements of each
    group of 4 (``[NB, 8]`` each), cast and packed 2 by 2, so no byte is ever moved alone."""
    b, j, bmask, x = _load_row_blocks(x_ptr, nblocks, nb, n, s_row, NB, FLAT, EVEN)
    x02, x13 = tl.split(tl.reshape(x.to(tl.float32), (NB, 8, 2, 2)))  # [NB, 8, 2]: elements 4w+{0,2}, 4w+{1,3}
    x0, x2 = tl.split(x02)
    x1, x3 = tl.split(x13)
    amax = tl.reduce(_absmax4(x0, x1, x2, x3), 1, _max_nan).to(tl.int32, bitcast=True)  # [NB]
    bad, e, inv = _scale_code(amax, EMAX)
    s = inv[:, None]
    w = _word4(x0 * s, x1 * s, x2 * s, x3 * s, bad[:, None], E5M2, CAST, MBITS, EMIN, BIAS, SUB_UP)
    # word offsets written as pairs (contiguity 2): the store then keeps the split's layout (2 words
    # per thread) instead of converting through shared memory to 4
    t = tl.arange(0, 8)
    wo = b[:, None] * 8 + ((t // 2) * 2 + t % 2)[None, :]
    code = tl.where(bad, 255, e + 127).to(tl.uint8)
    if EVEN:
        tl.store(q_ptr + wo, w)
        tl.store(s_ptr + b, code)
    else:
        tl.store(q_ptr + wo, w, mask=bmask[:, None])
        tl.store(s_ptr + b, code, mask=bmask)


@triton.jit
def _quantize_cols4_kernel(x_ptr, q_ptr, s_ptr, K, C, n32, s_k,
                           EMAX: tl.constexpr, E5M2: tl.constexpr, CAST: tl.constexpr,
                           MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr, SUB_UP: tl.constexpr,
                           G: tl.constexpr, BC: tl.constexpr, VEC: tl.constexpr, EVEN: tl.constexpr):
    """``_quantize_cols_kernel`` with the packing done before the transpose: four loads of
    ``[8·G, BC]`` (rows ``k = 4m + i``, ``i = 0..3``, each contiguous along ``C``) put the 4
    consecutive-``k`` elements of one column in the same thread, so each is cast and packed into
    one int32 there; the transpose then moves ``[8·G, BC]`` int32 words (4× fewer items than
    bytes) to ``[BC, 8·G]``, stored contiguous along ``K`` (``q_ptr``: the output as int32
    ``[C, n32/4]``). ``VEC``: the loads' contiguity along ``C`` as Triton sees it, hence the
    elements per thread along ``C``; with ``BC = VEC·32·num_warps`` every warp lies along ``C`` and
    holds all ``32·G`` rows of its columns, so the block amax is reduced inside each thread."""
    pid_k = tl.program_id(0)
    pid_c = tl.program_id(1)
    m = pid_k * (8 * G) + tl.arange(0, 8 * G)  # word index along K
    t = tl.arange(0, BC)
    c = pid_c * BC + ((t // VEC) * VEC + t % VEC)  # = pid_c·BC + t, contiguous in runs of VEC only
    cmask = c < C
    k0 = 4 * m
    p = x_ptr + (k0[:, None].to(tl.int64) * s_k + c[None, :])
    if EVEN:  # K % (32·G) == 0 and C % BC == 0: no masks
        x0 = tl.load(p).to(tl.float32)
        x1 = tl.load(p + s_k).to(tl.float32)
        x2 = tl.load(p + 2 * s_k).to(tl.float32)
        x3 = tl.load(p + 3 * s_k).to(tl.float32)
    else:
        x0 = tl.load(p, mask=(k0 < K)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        x1 = tl.load(p + s_k, mask=(k0 + 1 < K)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        x2 = tl.load(p + 2 * s_k, mask=(k0 + 2 < K)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        x3 = tl.load(p + 3 * s_k, mask=(k0 + 3 < K)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    a = tl.reshape(_absmax4(x0, x1, x2, x3), (G, 8, BC))
    amax = tl.reduce(a, 1, _max_nan).to(tl.int32, bitcast=True)  # [G, BC]
    bad, e, inv = _scale_code(amax, EMAX)
    s = tl.reshape(tl.broadcast_to(inv[:, None, :], (G, 8, BC)), (8 * G, BC))
    nan = tl.reshape(tl.broadcast_to(bad[:, None, :], (G, 8, BC)), (8 * G, BC))
    w = _word4(x0 * s, x1 * s, x2 * s, x3 * s, nan, E5M2, CAST, MBITS, EMIN, BIAS, SUB_UP)
    wt = tl.trans(w)  # [BC, 8·G]
    n4 = n32 // 4
    sb = pid_k * G + tl.arange(0, G)
    nbk = n32 // 32
    code = tl.trans(tl.where(bad, 255, e + 127).to(tl.uint8))  # [BC, G]
    if EVEN:
        tl.store(q_ptr + (c[:, None].to(tl.int64) * n4 + m[None, :]), wt)
        tl.store(s_ptr + (c[:, None].to(tl.int64) * nbk + sb[None, :]), code)
    else:
        tl.store(q_ptr + (c[:, None].to(tl.int64) * n4 + m[None, :]), wt, mask=cmask[:, None] & (m < n4)[None, :])
        tl.store(s_ptr + (c[:, None].to(tl.int64) * nbk + sb[None, :]), code,
                 mask=cmask[:, None] & (sb < nbk)[None, :])


# Launch table. A variant names a kernel and its launch; ``DEFAULT`` picks one per layout of the
# oriented view ``x_t [rows, n]`` (``n`` the block dim): "rows" when the block dim is contiguous
# (``dim=1`` of a row-major x), "cols" when the other dim is (``dim=0``: the transposed
# orientation), "tile" (the 2026-11-30 kernel, any strides) otherwise. ``kernel`` "rows4"/"cols4"
# are the packed kernels of those layouts; ``cast`` (packed kernels, CUDA, hardware cast) is
# "asm" (inline PTX cvt, pairs packed in registers) or "triton" (Triton's conversion, then
# packed). ``bench_quantize`` checks and times every variant; the defaults are chosen from
# instruction counts (SASS for sm_90 compiled without a GPU, ``bench_quantize --compile-only``)
# until a GPU run measures them.
VARIANTS: dict[str, dict] = {
    # the 2026-11-30 kernel at its best measured launches: dim=1 3.008 TB/s, dim=0 1.121 TB/s (16384²)
    "tile_br64_g4_w8": dict(kernel="tile", BR=64, G=4, num_warps=8),
    "tile_br128_g1_w4": dict(kernel="tile", BR=128, G=1, num_warps=4),
    # block dim contiguous: NB blocks of 32 per program, one byte per element, no inline asm
    "rows_nb256_w8": dict(kernel="rows", NB=256, num_warps=8),
    # ... packed: 4 fp8 per int32
    "rows4_nb128_w4": dict(kernel="rows4", NB=128, num_warps=4, cast="asm"),
    "rows4_nb256_w8": dict(kernel="rows4", NB=256, num_warps=8, cast="asm"),
    "rows4_nb512_w8": dict(kernel="rows4", NB=512, num_warps=8, cast="asm"),
    "rows4_nb512_w16": dict(kernel="rows4", NB=512, num_warps=16, cast="asm"),
    "rows4_nb256_w8_tcast": dict(kernel="rows4", NB=256, num_warps=8, cast="triton"),
    # block dim strided: [32·G, BC] tiles transposed as bytes, no inline asm
    "cols_g1_bc256_w4": dict(kernel="cols", G=1, BC=256, num_warps=4),
    # ... packed before the transpose (int32 words); VEC elements per thread along C
    "cols4_g1_bc256_v8_w4": dict(kernel="cols4", G=1, BC=256, VEC=8, num_warps=4, cast="asm"),
    "cols4_g1_bc256_v2_w4": dict(kernel="cols4", G=1, BC=256, VEC=2, num_warps=4, cast="asm"),
    "cols4_g2_bc256_v2_w4": dict(kernel="cols4", G=2, BC=256, VEC=2, num_warps=4, cast="asm"),
    "cols4_g1_bc512_v4_w4": dict(kernel="cols4", G=1, BC=512, VEC=4, num_warps=4, cast="asm"),
    "cols4_g1_bc128_v2_w2": dict(kernel="cols4", G=1, BC=128, VEC=2, num_warps=2, cast="asm"),
    "cols4_g2_bc128_v2_w2": dict(kernel="cols4", G=2, BC=128, VEC=2, num_warps=2, cast="asm"),
    "cols4_g1_bc256_v4_w2": dict(kernel="cols4", G=1, BC=256, VEC=4, num_warps=2, cast="asm"),
    "cols4_g1_bc256_v2_w4_tcast": dict(kernel="cols4", G=1, BC=256, VEC=2, num_warps=4, cast="triton"),
}
DEFAULT = {"rows": "rows4_nb256_w8", "cols": "cols4_g2_bc256_v2_w4", "tile": "tile_br64_g4_w8"}  # H200: hwmodels/data/runs/2026-11-30-mxfp8/bench_quantize.md
FAMILY = {"tile": "tile", "rows": "rows", "rows4": "rows", "cols": "cols", "cols4": "cols"}


def layout_kind(xt: Tensor) -> str:
    """Which kernel family fits the oriented view ``xt [rows, n]`` (block dim last)."""
    if xt.stride(1) == 1 or xt.shape[1] == 1:
        return "rows"
    if xt.stride(0) == 1 or xt.shape[0] == 1:
        return "cols"
    return "tile"


def quantize(x: Tensor, dim: int = 1, elem: str = "e4m3", *, variant: str | None = None,
             BR: int | None = None, G: int | None = None, num_warps: int | None = None,
             soft_cast: bool | None = None) -> tuple[Tensor, Tensor]:
    """MX-quantize 2-D ``x`` along ``dim`` with a Triton kernel; same contract as ``quantize_ref``.

    ``variant``: a key of ``VARIANTS`` (default: ``DEFAULT`` for the layout, see ``layout_kind``);
    a "rows"/"cols" variant on a layout it does not fit is an error. ``BR``/``G`` without
    ``variant`` select the "tile" kernel with that tile (the 2026-11-30 interface); ``num_warps``
    overrides the variant's. ``soft_cast``: round to fp8 with integer arithmetic
    (``_fp8_bits_rne``) instead of the hardware conversion; default on for CPU tensors (the
    interpreter), off on CUDA. All are bit-exact against the reference.
    """
    check_elem(elem)
    if x.dim() != 2:
        raise ValueError(f"mxfp8 quantize needs a 2-D tensor; got shape {tuple(x.shape)} (reshape to [rows, cols])")
    if dim not in (0, 1, -1, -2):
        raise ValueError(f"mxfp8 quantize dim={dim} is out of range for a 2-D tensor; use 0 or 1")
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"mxfp8 quantize variant '{variant}' is unknown; use one of {', '.join(VARIANTS)}")
    xt = x if dim in (1, -1) else x.t()
    rows, n = xt.shape
    n32 = padded(n)
    data = torch.empty((rows, n32), dtype=FP8[elem], device=x.device)
    if soft_cast is None:
        soft_cast = x.device.type != "cuda"  # the interpreter
    scale = torch.empty((rows, n32 // BLOCK), dtype=torch.uint8, device=x.device)
    if rows == 0 or n32 == 0:
        return data, scale
    if x.device.type != "cuda" and xt.dtype in (torch.bfloat16, torch.float16):
        # The interpreter (triton 3.7) widens 16-bit subnormals wrongly (a bf16 6.6e-39 read as a
        # quarter of its value); torch widens exactly, and the kernel then sees the same fp32.
        xt = xt.float()
    kind = layout_kind(xt)
    if variant is None:
        variant = DEFAULT["tile"] if (BR is not None or G is not None) else DEFAULT[kind]
    cfg = dict(VARIANTS[variant])
    kernel = cfg.pop("kernel")
    if FAMILY[kernel] not in ("tile", kind):
        raise ValueError(f"mxfp8 quantize variant '{variant}' needs a '{FAMILY[kernel]}' layout; this input is "
                         f"'{kind}' (dim={dim}, strides {tuple(x.stride())}); use a '{kind}' or 'tile' variant")
    warps = num_warps if num_warps is not None else cfg["num_warps"]
    fmt = elem_constexprs(elem)
    q = data.view(torch.uint8)
    nb = n32 // BLOCK
    if kernel in ("rows", "rows4"):
        nblocks = rows * nb
        flat = n == n32 and (rows == 1 or xt.stride(0) == n) and xt.stride(1) == 1
        grid = (triton.cdiv(nblocks, cfg["NB"]),)
        if kernel == "rows":
            _quantize_rows_kernel[grid](xt, q, scale, nblocks, nb, n, xt.stride(0), **fmt, SOFT_CAST=soft_cast,
                                        NB=cfg["NB"], FLAT=flat, num_warps=warps)
        else:
            _quantize_rows4_kernel[grid](xt, q.view(torch.int32), scale, nblocks, nb, n, xt.stride(0), **fmt,
                                         CAST=_cast_mode(cfg, soft_cast), NB=cfg["NB"], FLAT=flat,
                                         EVEN=flat and nblocks % cfg["NB"] == 0, num_warps=warps)
    elif kernel in ("cols", "cols4"):
        G_ = min(cfg["G"], 1 << (nb.bit_length() - 1))  # no wider than the block dim (a power of 2)
        grid = (triton.cdiv(n32, BLOCK * G_), triton.cdiv(rows, cfg["BC"]))
        if kernel == "cols":
            _quantize_cols_kernel[grid](xt, q, scale, n, rows, n32, xt.stride(1), **fmt, SOFT_CAST=soft_cast,
                                        G=G_, BC=cfg["BC"], num_warps=warps)
        else:
            _quantize_cols4_kernel[grid](xt, q.view(torch.int32), scale, n, rows, n32, xt.stride(1), **fmt,
                                         CAST=_cast_mode(cfg, soft_cast), G=G_, BC=cfg["BC"], VEC=cfg["VEC"],
                                         EVEN=n % (BLOCK * G_) == 0 and rows % cfg["BC"] == 0, num_warps=warps)
    else:
        BR = BR if BR is not None else cfg["BR"]
        G = min(G if G is not None else cfg["G"], nb)
        G = 1 << (G.bit_length() - 1)  # a power of two
        grid = (triton.cdiv(rows, BR), triton.cdiv(nb, G))
        _quantize_kernel[grid](xt, q, scale, rows, n, n32, xt.stride(0), xt.stride(1), **fmt, SOFT_CAST=soft_cast,
                               BR=BR, G=G, num_warps=warps)
    return data, scale


def elem_constexprs(elem: str) -> dict:
    """The element format's constexprs, as the kernels here (and ``fake_quantize``'s) take them."""
    mbits, emin, bias = (3, -6, 7) if elem == "e4m3" else (2, -14, 15)
    return dict(EMAX=ELEMENTS[elem][1], E5M2=elem == "e5m2", MBITS=mbits, EMIN=emin, BIAS=bias,
                SUB_UP=2.0 ** (mbits - emin))


def _cast_mode(cfg: dict, soft_cast: bool) -> int:
    """``CAST`` of the packed kernels: 2 soft (integer) cast, 1 inline PTX, 0 Triton's conversion."""
    return 2 if soft_cast else (1 if cfg.get("cast", "asm") == "asm" else 0)


__all__ = ["DEFAULT", "VARIANTS", "elem_constexprs", "layout_kind", "quantize"]
