"""Mean of each sample's rows of a jagged tensor, in Triton: ``segment_mean(x, offsets)``.

``x [T, D]`` holds sample ``b`` in rows ``offsets[b]:offsets[b+1]``; rows from ``offsets[-1]`` on
(a static-shape batch's padding) belong to no sample. Forward: one program per (sample, block of
columns) sums its rows in fp32 and divides by the length (a sample of length 0 gets zeros) — no
atomics (``index_add`` into B rows contends on a few hundred addresses: 0.87 ms for
gem-h200-1gpu's ``[197k, 512]`` bf16 on the H200, hwmodels/data/runs/h200-2026-11-30-executor/
s7-packed.top.txt). Backward: each row gets its sample's gradient over the length, a padding
row zero (one gather). No host sync either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _segment_mean_kernel(x_ptr, off_ptr, out_ptr, stride_x, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    start = tl.load(off_ptr + b).to(tl.int64)
    end = tl.load(off_ptr + b + 1).to(tl.int64)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for r0 in range(start, end, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        m = r < end
        x = tl.load(x_ptr + r[:, None] * stride_x + d[None, :], mask=m[:, None] & dmask[None, :], other=0.0)
        acc += tl.sum(x.to(tl.float32), axis=0)
    n = tl.maximum(end - start, 1).to(tl.float32)
    tl.store(out_ptr + b * D + d, (acc / n).to(out_ptr.dtype.element_ty), mask=dmask)


class _SegmentMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, offsets: Tensor) -> Tensor:
        B, D = offsets.numel() - 1, x.shape[1]
        out = torch.empty((B, D), dtype=x.dtype, device=x.device)
        if B and D:
            block_d = min(triton.next_power_of_2(D), 128)
            _segment_mean_kernel[(B, triton.cdiv(D, block_d))](x, offsets, out, x.stride(0), D, BLOCK_R=32,
                                                               BLOCK_D=block_d, num_warps=4)
        ctx.save_for_backward(offsets)
        ctx.rows = x.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (offsets,) = ctx.saved_tensors
        lengths = (offsets[1:] - offsets[:-1]).clamp(min=1).unsqueeze(1).to(grad.dtype)
        per_sample = torch.cat([grad / lengths, grad.new_zeros((1, grad.shape[1]))])  # row B: padding
        sample = torch.searchsorted(offsets[1:], torch.arange(ctx.rows, device=grad.device), right=True)
        return per_sample.index_select(0, sample), None


def segment_mean(x: Tensor, offsets: Tensor) -> Tensor:
    """``[B, D]``: the mean of each sample's rows of ``x [T, D]`` (zeros for a sample of length
    0), in ``x``'s dtype with fp32 accumulation; differentiable in ``x``."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"segment_mean: x has shape {tuple(x.shape)} strides {x.stride()}; pass a [T, D] "
                         "tensor with contiguous rows")
    if offsets.dim() != 1 or offsets.numel() < 1 or offsets.device != x.device:
        raise ValueError(f"segment_mean: offsets {tuple(offsets.shape)} on {offsets.device}; pass [B+1] on {x.device}")
    return _SegmentMean.apply(x, offsets)


__all__ = ["segment_mean"]
