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

from kernels.attention.reference import ACTIVATIONS
from kernels.mxfp8.reference import dequantize_ref, quantize_ref


class _StraightThrough(torch.autograd.Function):
    """``fn(x)`` forward, the identity backward (the quantizers' straight-through gradient)."""

    @staticmethod
    def forward(ctx, x, fn):
        ctx.dtype = x.dtype
        return fn(x)

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dtype), None


def _straight_through(x: Tensor, fn) -> Tensor:
    return _StraightThrough.apply(x, fn) if x.requires_grad and torch.is_grad_enabled() else fn(x.detach())


def fake_quantize_last(x: Tensor, elem: str = "e4m3", *, out_dtype: torch.dtype = torch.float32) -> Tensor:
    """``x`` MX-quantized in 32-blocks along its last dim and dequantized, in ``out_dtype`` (fp32 by
    default: the emulation's matmuls); gradient = identity. CUDA: one fused Triton kernel
    (``fake_quantize.fake_quantize_last_triton``); otherwise the PyTorch reference below."""
    if x.is_cuda:
        from kernels.mxfp8.fake_quantize import fake_quantize_last_triton

        return _straight_through(x, lambda t: fake_quantize_last_triton(t, elem, out_dtype=out_dtype))
    return fake_quantize_last_ref(x, elem).to(out_dtype)


def fake_quantize_keys(x: Tensor, offsets: Tensor, elem: str = "e4m3") -> Tensor:
    """``fake_quantize_keys_ref``'s values (V along the keys, blocks of 32 rows from each sample's
    first row), in ``x``'s dtype; gradient = identity. CUDA: one fused Triton kernel
    (``fake_quantize.fake_quantize_keys_triton``); otherwise the PyTorch reference below."""
    if x.is_cuda:
        from kernels.mxfp8.fake_quantize import fake_quantize_keys_triton

        return _straight_through(x, lambda t: fake_quantize_keys_triton(t, offsets, elem))
    return fake_quantize_keys_ref(x, offsets, elem)


def fake_quantize_last_ref(x: Tensor, elem: str = "e4m3") -> Tensor:
    """``x`` MX-quantized in 32-blocks along its last dim and dequantized (fp32); gradient = identity.
    The reference of ``fake_quantize_last`` (and, on CUDA, the unfused chain it replaced: the
    Triton quantizer, then ``dequantize_ref``)."""
    flat = x.detach().reshape(-1, x.shape[-1])
    if flat.is_cuda:
        from kernels.mxfp8.quantize import quantize

        data, code = quantize(flat, 1, elem)
    else:
        data, code = quantize_ref(flat, 1, elem)
    q = dequantize_ref(data, code, x.shape[-1]).reshape(x.shape)
    return x + (q - x).detach() if x.requires_grad else q


def fake_quantize_keys_ref(x: Tensor, offsets: Tensor, elem: str = "e4m3") -> Tensor:
    """The reference of ``fake_quantize_keys`` (on CUDA, the unfused chain it replaced).
    ``x [T, H, D]`` MX-quantized along the rows (the keys: P·V's contraction) in blocks of 32
    rows counted from each sample's first row (``offsets [B+1]``), as the padded reference
    quantizes ``V`` (each sample's keys from position 0), and dequantized, in ``x``'s dtype;
    gradient = identity. Rows past ``offsets[-1]`` (padding) come back as they are. No host
    sync: every size is a bound of ``T`` and ``B``."""
    T, H, D = x.shape
    B = offsets.numel() - 1
    if T == 0 or B == 0:
        return x
    dev = x.device
    lens = offsets[1:] - offsets[:-1]
    plen = (lens + 31) // 32 * 32
    pstart = torch.cumsum(plen, 0) - plen
    rows = torch.arange(T, device=dev)
    sample = torch.searchsorted(offsets[1:], rows, right=True).clamp(max=B - 1)
    valid = (rows >= offsets[0]) & (rows < offsets[-1])
    n32 = -(-(T + 31 * B) // 32) * 32
    dest = torch.where(valid, pstart[sample] + rows - offsets[sample], n32)  # padding -> a dump block
    flat = x.detach().reshape(T, H * D)
    buf = flat.new_zeros((n32 + 32, H * D)).index_copy_(0, dest, flat)
    if buf.is_cuda:
        from kernels.mxfp8.quantize import quantize

        data, code = quantize(buf, 0, elem)
    else:
        data, code = quantize_ref(buf, 0, elem)
    deq = dequantize_ref(data, code, buf.shape[0]).t()  # [rows, H·D] fp32
    fq = torch.where(valid[:, None], deq.index_select(0, dest), flat.float())
    fq = fq.to(x.dtype).view(T, H, D)
    return x + (fq - x).detach() if x.requires_grad else fq


class _FlashMX(torch.autograd.Function):
    """GDPA on the flash kernels with MX-quantized P (``quant_p``); q, k, v arrive quantized."""

    @staticmethod
    def forward(ctx, q, k, v, offsets, max_len, scale, causal, activation):
        from kernels.flash.core import attention_fwd
        from kernels.flash.work import WorkCache

        o, _ = attention_fwd(q, k, v, offsets, offsets, max_len, max_len, weight=activation, scale=scale,
                             causal=causal, quant_p=True, cache=WorkCache.of(offsets))
        ctx.save_for_backward(q, k, v, offsets)
        ctx.args = (max_len, scale, causal, activation)
        return o

    @staticmethod
    def backward(ctx, do):
        from kernels.flash.core import attention_bwd
        from kernels.flash.work import WorkCache

        q, k, v, offsets = ctx.saved_tensors
        max_len, scale, causal, activation = ctx.args
        none = q.new_empty((0,))
        dq, dk, dv = attention_bwd(do.contiguous(), q, k, v, none, none, offsets, offsets, max_len, max_len,
                                   weight=activation, scale=scale, causal=causal, quant_p=True,
                                   cache=WorkCache.of(offsets))
        return dq, dk, dv, None, None, None, None, None


def gdpa_mxfp8(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, *, causal: bool = True, activation: str = "silu",
               max_len: int | None = None, scale: float | None = None, triton: bool = False) -> Tensor:
    """Jagged self-attention GDPA (``q, k, v [ΣL, H, D]``, ``offsets [B+1]``) with MXFP8 Q·Kᵀ and P·V;
    ``scale`` defaults to ``1/max_len``. Returns ``[ΣL, H, D]`` in ``q``'s dtype.

    ``triton``: the flash kernels (``kernels.flash.core``, ``quant_p``): Q and K quantized along
    the head dim and V along the keys (``fake_quantize_keys``) before the kernels (on CUDA one
    fused read-once/write-once kernel each, ``kernels/mxfp8/fake_quantize.py``), P per 32 keys
    inside them, in registers; no padding, no score matrix, no host sync (``max_len`` required).
    Otherwise the padded PyTorch emulation below (the reference the Triton path is tested
    against)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"gdpa activation '{activation}' is unknown; use one of {', '.join(ACTIVATIONS)}")
    if triton:
        if max_len is None:
            raise ValueError("gdpa_mxfp8(triton=True) needs max_len (it sizes the grid without a host sync)")
        s = 1.0 / max(int(max_len), 1) if scale is None else scale
        with record_function("attention.gdpa"):
            qd, kd = (fake_quantize_last(t, out_dtype=t.dtype) for t in (q, k))
            vd = fake_quantize_keys(v, offsets)
            return _FlashMX.apply(qd, kd, vd, offsets, int(max_len), float(s), causal, activation)
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
            P = ACTIVATIONS[activation](S) * s * mask
            Vt = fake_quantize_last(vp.transpose(-1, -2))  # [B, H, D, n]: along the keys
            return fake_quantize_last(P) @ Vt.transpose(-1, -2)  # P along the keys

        out = checkpoint(core, pad(q), pad(k), pad(v), use_reentrant=False)  # [B, H, n, D] fp32
        rows = out.permute(0, 2, 1, 3).reshape(-1, H, D)
        flat = idx.reshape(-1)
        keep = torch.nonzero(flat < total).squeeze(1)
        res = rows.new_zeros((total, H, D)).index_copy(0, flat.index_select(0, keep), rows.index_select(0, keep))
        return res.to(q.dtype)


__all__ = ["fake_quantize_keys", "fake_quantize_keys_ref", "fake_quantize_last", "fake_quantize_last_ref",
           "gdpa_mxfp8"]
