"""PyTorch reference of BlockAttention (kernels/ATTENTION.md): softmax inside fixed blocks."""

from __future__ import annotations

import math

from torch import Tensor

from kernels.jfa.reference import attention_reference


def block_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, *,
    block: int = 64, causal: bool = False, scale: float | None = None,
) -> Tensor:  # fmt: skip
    """Softmax self attention inside blocks of ``block`` consecutive tokens, ``[T, H, D]``.

    Each sample is cut into blocks of ``block`` tokens from its start (the last block may be
    shorter); query ``i`` sees keys ``j`` with ``i // block == j // block``, and with ``causal``
    also ``j <= i``. ``W = softmax(Q Kᵀ · scale + mask)``, ``scale`` defaults to
    ``1/sqrt(D)``. Length 0: no rows. Length 1: ``O = v``. ``max_len`` is unused here.
    """
    if block < 1:
        raise ValueError(f"block ({block}) must be >= 1 tokens; pass e.g. block=64")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return attention_reference(
        q, k, v, offsets, offsets, weight="softmax", scale=scale, causal=causal, block=block
    )
