"""PyTorch specification of blockwise fp8 (rules in ``kernels/fp8block/__init__.py``), CPU or GPU.

``quantize_ref`` / ``dual_ref`` are what the Triton quantizer is tested against (bit-exact for a
plain input; to fp32 rounding of the GELU for the fused epilogues), ``mm_ref`` is "dequantize,
then fp32 matmul": the accuracy reference of the GEMM, and the GEMM itself on CPU (emulation).
Scales here are in their natural shape (``[rows, blocks]``); ``gemm.block_mm`` takes any strides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.fp8block import BLOCK, E_MAX, E_MIN, ELEMENTS, padded

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
NAN_BITS = 0x7F  # the elements of a block holding NaN/Inf (a NaN in E4M3 and in E5M2)


def check_elem(elem: str) -> None:
    if elem not in ELEMENTS:
        raise ValueError(f"fp8_block elem '{elem}' is unknown; use one of {', '.join(ELEMENTS)}")


def scale_exponent(amax: Tensor, elem: str) -> Tensor:
    """int32 ``e``: the smallest with ``amax <= max_elem · 2^e`` (fp32 ``amax >= 0``), clamped."""
    emax = ELEMENTS[elem][1]
    bits = amax.float().contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 - emax + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    return e.clamp(E_MIN, E_MAX)


def _pow2(e: Tensor) -> Tensor:
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)  # e in [-126, 127]: normal


def _blocks(y: Tensor, elem: str) -> tuple[Tensor, Tensor]:
    """``y [R, C]`` fp32, ``C % 128 == 0``: quantize along dim 1 → (fp8 [R, C], fp32 scale [R, C/128])."""
    R, C = y.shape
    b = y.reshape(R, C // BLOCK, BLOCK)
    finite = torch.isfinite(b).all(-1)
    amax = b.abs().amax(-1).where(finite, torch.zeros((), device=y.device))
    e = scale_exponent(amax, elem)
    q = (b * _pow2(-e)[..., None]).where(finite[..., None], torch.zeros((), device=y.device)).to(FP8[elem])
    q = q.view(torch.uint8).where(finite[..., None], NAN_BITS).view(FP8[elem])
    scale = _pow2(e).where(finite, torch.full((), float("nan"), device=y.device))
    return q.reshape(R, C), scale


def _check(x: Tensor, what: str = "x") -> None:
    if x.dim() != 2:
        raise ValueError(f"fp8_block: {what} must be 2-D; got shape {tuple(x.shape)} (reshape to [rows, cols])")
    if x.shape[1] % BLOCK:
        raise ValueError(f"fp8_block: {what} has {x.shape[1]} columns, not a multiple of {BLOCK}; "
                         f"such a layer runs in bf16 (kernels.fp8block.eligible)")


def quantize_ref(x: Tensor, elem: str = "e4m3") -> tuple[Tensor, Tensor]:
    """1×128 along dim 1 of ``x [R, C]``; rows zero-padded to a multiple of 128:
    ``(q fp8 [R128, C], scale fp32 [R128, C/128])``."""
    check_elem(elem)
    _check(x)
    y = F.pad(x.float(), (0, 0, 0, padded(x.shape[0]) - x.shape[0]))
    return _blocks(y, elem)


def quantize_weight_ref(w: Tensor, elem: str = "e4m3") -> tuple[Tensor, Tensor]:
    """128×128 tiles of ``w [N, K]`` (both multiples of 128): ``(q fp8 [N, K], scale fp32 [N/128, K/128])``."""
    check_elem(elem)
    N, K = w.shape
    if N % BLOCK or K % BLOCK:
        raise ValueError(f"fp8_block: a weight of shape {tuple(w.shape)} needs both dims multiples of {BLOCK}")
    t = w.float().reshape(N // BLOCK, BLOCK, K // BLOCK, BLOCK)
    finite = torch.isfinite(t).all(3).all(1)
    amax = t.abs().amax((1, 3)).where(finite, torch.zeros((), device=w.device))
    e = scale_exponent(amax, elem)
    q = (t * _pow2(-e)[:, None, :, None]).where(finite[:, None, :, None], torch.zeros((), device=w.device))
    q = q.to(FP8[elem]).view(torch.uint8).where(finite[:, None, :, None], NAN_BITS).view(FP8[elem])
    scale = _pow2(e).where(finite, torch.full((), float("nan"), device=w.device))
    return q.reshape(N, K), scale


def gelu_ref(z: Tensor) -> Tensor:
    """Exact GELU in fp32 by the kernels' formula ``0.5·z·(1 + erf(z/√2))`` (``kernels.ffn.bias_gelu``),
    so the tails (z < -4, where ``1 + erf`` cancels) round as the Triton epilogue's do."""
    z = z.float()
    return 0.5 * z * (1.0 + torch.erf(z * 0.7071067811865476))


def gelu_grad_ref(z: Tensor) -> Tensor:
    z = z.float()
    return 0.5 * (1.0 + torch.erf(z * 0.7071067811865476)) + z * (torch.exp(-0.5 * z * z) * 0.3989422804014327)


@dataclass
class Dual:
    """One tensor quantized for the matmuls a Linear runs with it. ``q``/``scale``: 1×128 along its
    columns (``[R128, C]``, ``[R128, C/128]``); ``qt``/``scale_t``: the transpose, 1×128 along its
    rows (``[C, R128]``, ``[C, R128/128]``); ``dbias``: the fp32 column sums of the epilogue's
    output (the bias gradient), when asked. Absent parts are None."""

    q: Tensor | None
    scale: Tensor | None
    qt: Tensor | None
    scale_t: Tensor | None
    dbias: Tensor | None = None
    rows: int = 0  # the real row count (before padding)


EPILOGUES = ("none", "bias_gelu", "bias_gelu_grad", "layer_norm")


def check_epilogue(x: Tensor, epilogue: str, bias: Tensor | None, h: Tensor | None, gain: Tensor | None,
                   stats: tuple[Tensor, Tensor] | None) -> None:
    """One-line errors for an epilogue's missing or misshapen operands."""
    R, C = x.shape
    if epilogue not in EPILOGUES:
        raise ValueError(f"fp8_block epilogue '{epilogue}' is unknown; use {', '.join(EPILOGUES)}")
    if epilogue != "none" and (bias is None or bias.shape != (C,)):
        raise ValueError(f"fp8_block epilogue '{epilogue}' needs bias of shape ({C},)")
    if epilogue == "bias_gelu_grad" and (h is None or h.shape != x.shape):
        raise ValueError(f"fp8_block epilogue bias_gelu_grad needs h of x's shape {tuple(x.shape)}")
    if epilogue == "layer_norm" and (gain is None or gain.shape != (C,) or stats is None
                                     or any(t.shape != (R,) or t.dtype != torch.float32 for t in stats)):
        raise ValueError(f"fp8_block epilogue layer_norm needs gain of shape ({C},) and stats = (mean, rstd), "
                         f"fp32 of shape ({R},) (kernels.fp8block.quantize.ln_stats)")


def ln_stats_ref(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """fp32 ``(mean, rstd)`` of the rows of ``x``, two passes (the mean, then the squared deviations),
    the biased variance, ``rstd = 1/sqrt(var + eps)``: what ``quantize.ln_stats`` computes."""
    xf = x.float()
    mu = xf.mean(1)
    return mu, 1.0 / torch.sqrt((xf - mu[:, None]).square().mean(1) + eps)


def epilogue_ref(x: Tensor, epilogue: str, bias: Tensor | None, h: Tensor | None, gain: Tensor | None = None,
                 stats: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """fp32 ``x`` after the producer's epilogue: ``none`` x; ``bias_gelu`` gelu(x + bias);
    ``bias_gelu_grad`` x · gelu'(h + bias) (x the output gradient, h the pre-bias input);
    ``layer_norm`` (x - mean) · rstd · gain + bias, the rows' ``stats = (mean, rstd)`` given."""
    y = x.float()
    if epilogue == "bias_gelu":
        return gelu_ref(y + bias.float())
    if epilogue == "bias_gelu_grad":
        return y * gelu_grad_ref(h.float() + bias.float())
    if epilogue == "layer_norm":
        mu, rs = stats
        return (y - mu[:, None]) * rs[:, None] * gain.float()[None, :] + bias.float()[None, :]
    if epilogue != "none":
        raise ValueError(f"fp8_block epilogue '{epilogue}' is unknown; use {', '.join(EPILOGUES)}")
    return y


def dual_ref(x: Tensor, elem: str = "e4m3", *, row: bool = True, col: bool = True, epilogue: str = "none",
             bias: Tensor | None = None, h: Tensor | None = None, dbias: bool = False,
             gain: Tensor | None = None, stats: tuple[Tensor, Tensor] | None = None) -> Dual:
    """What ``quantize.dual`` computes, in PyTorch."""
    check_elem(elem)
    _check(x)
    R = x.shape[0]
    y = epilogue_ref(x, epilogue, bias, h, gain, stats)
    y = F.pad(y, (0, 0, 0, padded(R) - R))
    q, s = _blocks(y, elem) if row else (None, None)
    qt, st = _blocks(y.t().contiguous(), elem) if col else (None, None)
    return Dual(q, s, qt, st, y.sum(0) if dbias else None, R)


def dequantize_ref(q: Tensor, scale: Tensor) -> Tensor:
    """fp32 values of ``q [R, C]`` with 1×128 scales ``[R, C/128]`` or 128×128 scales ``[R/128, C/128]``."""
    R, C = q.shape
    s = scale.float()
    if s.shape[0] != R:  # 128×128
        s = s.repeat_interleave(BLOCK, 0)
    return (q.float().reshape(R, C // BLOCK, BLOCK) * s[..., None]).reshape(R, C)


def mm_ref(a: Tensor, sa: Tensor, b: Tensor, sb: Tensor, out_dtype=torch.float32) -> Tensor:
    """``A · Bᵀ`` of ``a [M, K]`` (1×128) and ``b [N, K]`` (1×128 or 128×128): dequantize, fp32 matmul."""
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"fp8_block mm: K of a ({a.shape[1]}) and b ({b.shape[1]}) differ; quantize both "
                         f"along the contraction dim")
    return (dequantize_ref(a, sa) @ dequantize_ref(b, sb).t()).to(out_dtype)


__all__ = ["EPILOGUES", "FP8", "Dual", "check_elem", "check_epilogue", "dequantize_ref", "dual_ref", "epilogue_ref",
           "gelu_grad_ref", "gelu_ref", "ln_stats_ref", "mm_ref", "quantize_ref", "quantize_weight_ref",
           "scale_exponent"]
