"""BlockAttention as a torch.library op: ``gemtwin::block_attention_fwd`` / ``_bwd`` over the
Triton core. Semantics: ``kernels.block_attention.reference.block_attention``."""

from __future__ import annotations

import math

from torch import Tensor

from kernels.jfa.registration import check_self_attention, define_attention_ops

OPS = define_attention_ops("block_attention")


def block_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, *,
    block: int = 64, causal: bool = False, scale: float | None = None,
) -> Tensor:  # fmt: skip
    """Softmax self attention inside blocks of ``block`` consecutive tokens of each sample
    (the last block may be shorter): ``q, k, v [T, H, D]``, ``offsets [B+1]``; returns
    ``[T, H, D]``. ``scale`` defaults to ``1/sqrt(D)``; ``causal`` adds ``j <= i``.
    """
    op = "block_attention"
    check_self_attention(op, q, k, v, offsets, max_len)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"{op}: block is {block!r}; pass a block size in tokens >= 1, e.g. 64")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return OPS(q, k, v, offsets, offsets, max_len, max_len, weight="softmax", scale=scale,
               causal=causal, block=block)  # fmt: skip
