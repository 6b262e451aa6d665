"""PyTorch reference of asymmetric attention (kernels/ATTENTION.md): a jagged side against a
dense short side, softmax, no mask."""

from __future__ import annotations

import math

from torch import Tensor

from kernels.jfa.reference import attention_reference, dense_offsets


def jagged_q_dense_kv(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, *, scale: float | None = None
) -> Tensor:
    """Long jagged queries ``q [T, H, D]`` over ``N`` dense keys ``k, v [B, N, H, D]``.

    Every token of sample ``b`` attends to all ``N`` keys of sample ``b``:
    ``softmax(Q Kᵀ · scale) V``, ``scale`` defaults to ``1/sqrt(D)``. Returns ``[T, H, D]``;
    a sample of length 0 has no rows (``max_len`` is unused here).
    """
    B, N = k.shape[:2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    kv_offsets = dense_offsets(B, N, q.device)
    k, v = k.reshape(B * N, *k.shape[2:]), v.reshape(B * N, *v.shape[2:])
    return attention_reference(q, k, v, offsets, kv_offsets, weight="softmax", scale=scale)


def dense_q_jagged_kv(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, *, scale: float | None = None
) -> Tensor:
    """``N`` dense queries ``q [B, N, H, D]`` over a long jagged history ``k, v [T, H, D]``.

    Each query of sample ``b`` attends to the ``L_b`` tokens of sample ``b``:
    ``softmax(Q Kᵀ · scale) V``, ``scale`` defaults to ``1/sqrt(D)``. Returns ``[B, N, H, D]``;
    a sample of length 0 gives zero rows; length 1 gives its ``v`` row for every query.
    """
    B, N = q.shape[:2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q_offsets = dense_offsets(B, N, q.device)
    out = attention_reference(
        q.reshape(B * N, *q.shape[2:]), k, v, q_offsets, offsets, weight="softmax", scale=scale
    )
    return out.view(q.shape)
