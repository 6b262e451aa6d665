"""GDPA with its two matmuls in MXFP8: ``O = (act(Q Kᵀ) · scale · mask) V`` (kernels/ATTENTION.md).

A PyTorch emulation built on the MX quantizer: ``Q`` and ``K`` are quantized along the head dim
(the contraction of ``Q Kᵀ``), the un-normalised weights ``P = act(S)·scale·mask`` along the keys
and ``V`` along the keys (the contraction of ``P V``), each in 32-blocks with E8M0 scales and
E4M3 elements, then dequantized and multiplied in fp32 — the same numbers the block-scaled
GEMM produces (``gemm.mx_mm`` equals dequantize-then-fp32-matmul within fp32 rounding, tested).
GDPA's ``P`` needs no softmax normalisation before quantizing, so it is quantized per 32 keys
directly. Gradients pass the quantizers straight through (the backward matmuls run in the
input dtype, not MXFP8). Runs as padded, masked batched matmuls (one sample per batch entry),
the score matrices recomputed in backward (``torch.utils.checkpoint``).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint

from kernels.mxfp8.reference import dequantize_ref, quantize_ref

ACT = {
    "silu": torch.nn.functional.silu,
    "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "relu": torch.relu,
    "relu2": lambda x: torch.relu(x).square(),
    "identity": lambda x: x,
}


def fake_quantize_last(x: Tensor, elem: str = "e4m3") -> Tensor:
    """``x`` MX-quantized in 32-blocks along its last dim and dequantized (fp32); gradient = identity."""
    flat = x.detach().reshape(-1, x.shape[-1])
    if flat.is_cuda:
        from kernels.mxfp8.quantize import quantize

        data, code = quantize(flat, 1, elem)
    else:
        data, code = quantize_ref(flat, 1, elem)
    q = dequantize_ref(data, code, x.shape[-1]).reshape(x.shape)
    return x + (q - x).detach() if x.requires_grad else q


def gdpa_mxfp8(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, *, causal: bool = True, activation: str = "silu",
               max_len: int | None = None, scale: float | None = None) -> Tensor:
    """Jagged self-attention GDPA (``q, k, v [ΣL, H, D]``, ``offsets [B+1]``) with MXFP8 Q·Kᵀ and P·V;
    ``scale`` defaults to ``1/max_len``. Returns ``[ΣL, H, D]`` in ``q``'s dtype."""
    if activation not in ACT:
        raise ValueError(f"gdpa activation '{activation}' is unknown; use one of {', '.join(ACT)}")
    with record_function("attention.gdpa"):
        total, H, D = q.shape
        lens = (offsets[1:] - offsets[:-1]).cpu()
        n = int(lens.max()) if len(lens) else 0
        if total == 0 or n == 0:
            return q.new_zeros(q.shape)
        n_max = int(max_len) if max_len is not None else n
        s = 1.0 / max(n_max, 1) if scale is None else scale
        pos = torch.arange(n)
        idx = torch.where(pos < lens[:, None], offsets[:-1].cpu()[:, None] + pos, total).to(q.device)  # [B, n]
        mask = (idx < total)[:, None, None, :]
        if causal:
            mask = mask & (pos[None, :] <= pos[:, None]).to(q.device)[None, None]

        def pad(x: Tensor) -> Tensor:  # [ΣL, H, D] -> [B, H, n, D]
            xp = torch.cat([x, x.new_zeros((1, H, D))]).index_select(0, idx.reshape(-1))
            return xp.view(*idx.shape, H, D).permute(0, 2, 1, 3)

        def core(qp: Tensor, kp: Tensor, vp: Tensor) -> Tensor:
            S = fake_quantize_last(qp) @ fake_quantize_last(kp).transpose(-1, -2)  # along D
            P = ACT[activation](S) * s * mask
            Vt = fake_quantize_last(vp.transpose(-1, -2))  # [B, H, D, n]: along the keys
            return fake_quantize_last(P) @ Vt.transpose(-1, -2)  # P along the keys

        out = checkpoint(core, pad(q), pad(k), pad(v), use_reentrant=False)  # [B, H, n, D] fp32
        rows = out.permute(0, 2, 1, 3).reshape(-1, H, D)
        flat = idx.reshape(-1)
        keep = torch.nonzero(flat < total).squeeze(1)
        res = rows.new_zeros((total, H, D)).index_copy(0, flat.index_select(0, keep), rows.index_select(0, keep))
        return res.to(q.dtype)


__all__ = ["fake_quantize_last", "gdpa_mxfp8"]
