"""``block_mm``: ``A · Bᵀ`` of blockwise-fp8 operands, on cuBLASLt (``torch.nn.functional.scaled_mm``).

``a [M, K]`` is 1×128 along K (scales ``[M, K/128]``); ``b [N, K]`` is 1×128 (scales
``[N, K/128]``) or 128×128 (scales ``[N/128, K/128]``), both K-major, which is how each of a
Linear's three matmuls is set up (``linear.py``). cuBLASLt's sm90 block-scaled kernels want the
1×128 scales outer-dim-major (stride ``(1, M)``: the quantizer writes them so) and the 128×128
ones as the transpose of ``[N/128, K/128]`` with the K-blocks padded to a multiple of 4; this
function puts them so (a no-op for the quantizer's output). Off CUDA, or on a GPU without the
path: dequantize and matmul in fp32 (``reference.mm_ref``), the emulation the CPU tests run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.fp8block.reference import mm_ref


def _outer_major(s: Tensor) -> Tensor:
    return s if s.stride(0) == 1 else s.t().contiguous().t()


def _tile_scales(s: Tensor) -> Tensor:
    kb = s.shape[1]
    s = F.pad(s, (0, 4 - kb % 4), value=1.0) if kb % 4 else s.contiguous()
    return s.t()  # [L4, N/128] with stride (1, L4)


def native(t: Tensor) -> bool:
    """Whether the block-scaled GEMM runs on cuBLASLt here (sm_90: Hopper)."""
    return t.is_cuda and torch.cuda.get_device_capability(t.device) == (9, 0)


def block_mm(a: Tensor, sa: Tensor, b: Tensor, sb: Tensor, out_dtype: torch.dtype = torch.bfloat16,
             bias: Tensor | None = None) -> Tensor:
    """``A · Bᵀ (+ bias)`` (module docstring), in ``out_dtype``; on cuBLASLt the bias is the GEMM's
    epilogue (measured on the H200: it works, and saves the separate add's pass over the output)."""
    M, K = a.shape
    N = b.shape[0]
    if b.shape[1] != K:
        raise ValueError(f"fp8_block mm: K of a ({K}) and b ({b.shape[1]}) differ; quantize both along the "
                         f"contraction dim")
    tiles = sb.shape[0] != N  # 128×128: [N/128, K/128]; 1×128: [N, K/128]
    if not native(a):
        y = mm_ref(a, sa, b, sb)
        return (y if bias is None else y + bias.float()).to(out_dtype)
    recipe_b = F.ScalingType.BlockWise128x128 if tiles else F.ScalingType.BlockWise1x128
    return F.scaled_mm(a, b.t(), _outer_major(sa), F.ScalingType.BlockWise1x128,
                       _tile_scales(sb) if tiles else _outer_major(sb), recipe_b, output_dtype=out_dtype,
                       bias=None if bias is None else bias.to(out_dtype))


__all__ = ["block_mm", "native"]
