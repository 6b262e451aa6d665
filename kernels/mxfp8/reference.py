"""PyTorch reference of MXFP8 (the rules are in ``kernels/mxfp8/__init__.py``), CPU or GPU.

``quantize_ref`` is the bit-exact specification the Triton kernels are tested against;
``mx_mm_ref`` is "dequantize, then fp32 matmul", the accuracy reference of the GEMM and the GEMM
itself on CPU (emulation).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.mxfp8 import BLOCK, E8M0_BIAS, E8M0_NAN, ELEMENTS

NAN_BITS = 0x7F  # the element NaN written for a block holding NaN/Inf (E4M3: S.1111.111; E5M2: 0.11111.11)
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def check_elem(elem: str) -> None:
    if elem not in ELEMENTS:
        raise ValueError(f"mxfp8 elem '{elem}' is unknown; use one of {', '.join(ELEMENTS)}")


def _oriented(x: Tensor, dim: int) -> Tensor:
    if x.dim() != 2:
        raise ValueError(f"mxfp8 quantize needs a 2-D tensor; got shape {tuple(x.shape)} (reshape to [rows, cols])")
    if dim not in (0, 1, -1, -2):
        raise ValueError(f"mxfp8 quantize dim={dim} is out of range for a 2-D tensor; use 0 or 1")
    return x if dim in (1, -1) else x.t()


def padded(n: int) -> int:
    """``n`` rounded up to a multiple of 32 (the stored length of a block dim)."""
    return -(-n // BLOCK) * BLOCK


def scale_exponent(amax: Tensor, elem: str = "e4m3") -> Tensor:
    """Unbiased E8M0 exponent ``e`` (int32) of fp32 ``amax`` (>= 0, finite): smallest e with
    ``amax <= max_elem · 2^e``, clamped to [-127, 127]."""
    _, emax, _ = ELEMENTS[elem]
    bits = amax.float().contiguous().view(torch.int32)
    biased = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    e = biased - 127 - emax + (mant > 0x600000).to(torch.int32)
    return e.clamp(-127, 127)


def exp2i(e: Tensor) -> Tensor:
    """``2^e`` in fp32 for integer ``e`` in [-127, 127], exact (2^-127 is an fp32 subnormal)."""
    e = e.to(torch.int32)
    normal = ((e + 127).clamp(min=1) << 23).view(torch.float32)
    return torch.where(e == -127, torch.full_like(normal, 2.0**-127), normal)


def quantize_ref(x: Tensor, dim: int = 1, elem: str = "e4m3") -> tuple[Tensor, Tensor]:
    """MX-quantize 2-D ``x`` in 32-blocks along ``dim``: ``(data fp8 [rows, L32], scale uint8 [rows, L32/32])``
    with the block dim last (``dim=0`` returns the transpose's blocks)."""
    check_elem(elem)
    xt = _oriented(x, dim).float()
    rows, n = xt.shape
    n32 = padded(n)
    if n32 != n:
        xt = torch.nn.functional.pad(xt, (0, n32 - n))
    blocks = xt.reshape(rows, n32 // BLOCK, BLOCK)
    finite = torch.isfinite(blocks).all(-1)
    amax = blocks.abs().amax(-1).where(finite, torch.zeros((), device=x.device))
    e = scale_exponent(amax, elem)
    scaled = blocks * exp2i(-e)[..., None]
    data = scaled.to(FP8[elem])
    data = torch.where(finite[..., None], data.view(torch.uint8), NAN_BITS).reshape(rows, n32).view(FP8[elem])
    code = torch.where(finite, e + E8M0_BIAS, torch.full_like(e, E8M0_NAN)).to(torch.uint8)
    return data.contiguous(), code.contiguous()  # elementwise ops keep a transposed view's strides


def scale_values(code: Tensor) -> Tensor:
    """fp32 scale of each E8M0 code (NaN for 255)."""
    c = code.to(torch.int32)
    return torch.where(c == E8M0_NAN, torch.full(c.shape, float("nan"), device=c.device), exp2i(c - E8M0_BIAS))


def dequantize_ref(data: Tensor, code: Tensor, n: int | None = None) -> Tensor:
    """fp32 values of an MX tensor ``[rows, L32]`` (block dim last); ``n`` trims the padding."""
    rows, n32 = data.shape
    x = data.float().reshape(rows, n32 // BLOCK, BLOCK) * scale_values(code)[..., None]
    x = x.reshape(rows, n32)
    return x if n is None else x[:, :n]


def fake_quantize(x: Tensor, dim: int, elem: str = "e4m3") -> Tensor:
    """``x`` quantized along ``dim`` and dequantized back (fp32, same shape and orientation as ``x``)."""
    data, code = quantize_ref(x, dim, elem)
    n = x.shape[1] if dim in (1, -1) else x.shape[0]
    y = dequantize_ref(data, code, n)
    return y if dim in (1, -1) else y.t()


def mx_mm_ref(a: Tensor, sa: Tensor, b: Tensor, sb: Tensor, out_dtype=torch.float32) -> Tensor:
    """``A · Bᵀ`` of MX tensors ``a [M, K32]``, ``b [N, K32]`` (K-major): dequantize, fp32 matmul."""
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"mx_mm: K of a ({a.shape[1]}) and b ({b.shape[1]}) differ; quantize both along the contraction dim")
    return (dequantize_ref(a, sa) @ dequantize_ref(b, sb).t()).to(out_dtype)


__all__ = ["FP8", "dequantize_ref", "exp2i", "fake_quantize", "mx_mm_ref", "padded", "quantize_ref",
           "scale_exponent", "scale_values"]
