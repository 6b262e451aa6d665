"""Asymmetric attention as a torch.library op: ``gemtwin::asym_attention_fwd`` / ``_bwd`` over
the Triton core, the dense side seen as a jagged tensor with offsets ``arange(B+1)·N``.
Semantics: ``kernels.asym_attention.reference``."""

from __future__ import annotations

import math

from torch import Tensor

from kernels.jfa.registration import (
    check_dims, check_max_len, check_offsets, check_tensors, define_attention_ops, dense_offsets,
)  # fmt: skip

OPS = define_attention_ops("asym_attention")


def jagged_q_dense_kv(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, *, scale: float | None = None
) -> Tensor:
    """Long jagged queries ``q [T, H, D]`` (``offsets [B+1]``) over ``N`` dense keys per sample
    ``k, v [B, N, H, D]``: ``softmax(Q Kᵀ · scale) V``, returns ``[T, H, D]``; ``scale``
    defaults to ``1/sqrt(D)``."""
    op = "jagged_q_dense_kv"
    check_dims(op, "q", q, 3, "[T, H, D]")
    _check_dense(op, k, v)
    check_tensors(op, q=q, k=k, v=v)
    B, N = k.shape[:2]
    check_offsets(op, "offsets", offsets, q, batch=B)
    check_max_len(op, "max_len", max_len)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    kv = dense_offsets(B, N, offsets)
    k, v = k.reshape(B * N, *k.shape[2:]), v.reshape(B * N, *v.shape[2:])
    return OPS(q, k, v, offsets, kv, max_len, N, weight="softmax", scale=scale, causal=False,
               block=0)  # fmt: skip


def dense_q_jagged_kv(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, *, scale: float | None = None
) -> Tensor:
    """``N`` dense queries per sample ``q [B, N, H, D]`` over a long jagged history
    ``k, v [T, H, D]`` (``offsets [B+1]``): ``softmax(Q Kᵀ · scale) V``, returns
    ``[B, N, H, D]`` (zero rows for a sample of length 0); ``scale`` defaults to ``1/sqrt(D)``."""
    op = "dense_q_jagged_kv"
    check_dims(op, "q", q, 4, "[B, N, H, D]")
    for name, t in (("k", k), ("v", v)):
        check_dims(op, name, t, 3, "[T, H, D]")
    if v.shape != k.shape:
        raise ValueError(f"{op}: k, v have shapes {tuple(k.shape)}, {tuple(v.shape)}; they must match")
    check_tensors(op, q=q, k=k, v=v)
    B, N = q.shape[:2]
    check_offsets(op, "offsets", offsets, q, batch=B)
    check_max_len(op, "max_len", max_len)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q_offsets = dense_offsets(B, N, offsets)
    o = OPS(q.reshape(B * N, *q.shape[2:]), k, v, q_offsets, offsets, N, max_len,
            weight="softmax", scale=scale, causal=False, block=0)  # fmt: skip
    return o.view(q.shape)


def _check_dense(op: str, k: Tensor, v: Tensor) -> None:
    for name, t in (("k", k), ("v", v)):
        check_dims(op, name, t, 4, "[B, N, H, D]")
    if v.shape != k.shape:
        raise ValueError(f"{op}: k, v have shapes {tuple(k.shape)}, {tuple(v.shape)}; they must match")
