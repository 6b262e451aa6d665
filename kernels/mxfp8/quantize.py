"""Triton MX quantization (rules in ``kernels/mxfp8/__init__.py``), bit-exact with ``reference.quantize_ref``.

One program quantizes a tile of ``BR`` rows × ``G`` blocks of 32 along the block dim of the
oriented view ``x_t [rows, n]`` (``x`` itself for ``dim=1``, ``x.t()`` for ``dim=0``: the kernel
reads through strides, so the transpose is never materialised). It loads in the input dtype,
computes in fp32, reduces |x| over each block, derives the E8M0 exponent from amax's bits,
scales by the exact power of two and casts with round-to-nearest-even. Memory-bound: one read
of the input, one write of the fp8 data and the scale bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.mxfp8 import BLOCK, ELEMENTS
from kernels.mxfp8.reference import FP8, check_elem, padded


@triton.jit
def _fp8_bits_rne(y, MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr, SUB_UP: tl.constexpr):
    """fp32 ``y`` (finite, ``|y| <= max_elem``) → fp8 bits, round-to-nearest-even, in integer and
    exact fp32 arithmetic only (the Triton interpreter's own fp8 cast does not round to nearest
    even, nor carry into the exponent, nor make subnormals)."""
    ybits = y.to(tl.int32, bitcast=True)
    sign = (ybits >> 24) & 0x80
    ay = tl.abs(y)
    E = tl.maximum(((ay.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, EMIN)
    up = ((127 + MBITS - E) << 23).to(tl.float32, bitcast=True)  # 2^(MBITS-E): quanta per unit
    down = ((127 - MBITS + E) << 23).to(tl.float32, bitcast=True)
    v = ay * up  # < 2^(MBITS+1), exact
    v = (v + 12582912.0) - 12582912.0  # rint, ties to even (1.5·2^23 magic)
    r = v * down  # the rounded magnitude, exact
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
    if SOFT_CAST:
        q = _fp8_bits_rne(y, MBITS, EMIN, BIAS, SUB_UP)
    elif E5M2:
        q = y.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    else:
        q = y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    nanblk = tl.reshape(tl.broadcast_to((bad != 0)[:, :, None], (BR, G, 32)), (BR, G * 32))
    q = tl.where(nanblk, 0x7F, q).to(tl.uint8)
    omask = rmask[:, None] & (c < n32)[None, :]
    tl.store(q_ptr + r[:, None].to(tl.int64) * n32 + c[None, :], q, mask=omask)
    code = tl.where(bad != 0, 255, e + 127).to(tl.uint8)
    sb = pid_c * G + tl.arange(0, G)
    nb = n32 // 32
    tl.store(s_ptr + r[:, None].to(tl.int64) * nb + sb[None, :], code, mask=rmask[:, None] & (sb < nb)[None, :])


def quantize(x: Tensor, dim: int = 1, elem: str = "e4m3", *, BR: int | None = None, G: int | None = None,
             num_warps: int = 4, soft_cast: bool | None = None) -> tuple[Tensor, Tensor]:
    """MX-quantize 2-D ``x`` along ``dim`` with the Triton kernel; same contract as ``quantize_ref``.

    ``soft_cast``: round to fp8 with integer arithmetic (``_fp8_bits_rne``) instead of the
    hardware conversion; default on for CPU tensors (the interpreter), off on CUDA. Both are
    bit-exact against the reference (CPU tests the soft cast, the GPU bench tests both).
    """
    check_elem(elem)
    if x.dim() != 2:
        raise ValueError(f"mxfp8 quantize needs a 2-D tensor; got shape {tuple(x.shape)} (reshape to [rows, cols])")
    if dim not in (0, 1, -1, -2):
        raise ValueError(f"mxfp8 quantize dim={dim} is out of range for a 2-D tensor; use 0 or 1")
    xt = x if dim in (1, -1) else x.t()
    rows, n = xt.shape
    n32 = padded(n)
    data = torch.empty((rows, n32), dtype=FP8[elem], device=x.device)
    if soft_cast is None:
        soft_cast = x.device.type != "cuda"  # the interpreter
    scale = torch.empty((rows, n32 // BLOCK), dtype=torch.uint8, device=x.device)
    if rows == 0 or n32 == 0:
        return data, scale
    contiguous_rows = xt.stride(0) == 1  # dim=0 of a row-major x: the rows are the fast axis
    if BR is None:
        BR = 64 if contiguous_rows else 32
    if G is None:
        G = 1 if contiguous_rows else 4
    G = min(G, n32 // BLOCK)
    G = 1 << (G.bit_length() - 1)  # a power of two
    if x.device.type != "cuda" and xt.dtype in (torch.bfloat16, torch.float16):
        # The interpreter (triton 3.7) widens 16-bit subnormals wrongly (a bf16 6.6e-39 read as a
        # quarter of its value); torch widens exactly, and the kernel then sees the same fp32.
        xt = xt.float()
    grid = (triton.cdiv(rows, BR), triton.cdiv(n32 // BLOCK, G))
    mbits, emin, bias = (3, -6, 7) if elem == "e4m3" else (2, -14, 15)
    _quantize_kernel[grid](xt, data.view(torch.uint8), scale, rows, n, n32, xt.stride(0), xt.stride(1),
                           EMAX=ELEMENTS[elem][1], E5M2=elem == "e5m2", SOFT_CAST=soft_cast,
                           MBITS=mbits, EMIN=emin, BIAS=bias, SUB_UP=2.0 ** (mbits - emin), BR=BR, G=G, num_warps=num_warps)
    return data, scale


__all__ = ["quantize"]
