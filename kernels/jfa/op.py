"""JFA as a torch.library op: ``gemtwin::jfa_fwd`` / ``gemtwin::jfa_bwd`` over the Triton core.

Semantics: ``kernels.jfa.reference.jagged_flash_attention`` (kernels/ATTENTION.md).
"""

from __future__ import annotations

import math

from torch import Tensor

from kernels.jfa.registration import check_self_attention, define_attention_ops

OPS = define_attention_ops("jfa")


def jagged_flash_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, *,
    causal: bool = True, scale: float | None = None,
) -> Tensor:  # fmt: skip
    """Softmax self attention of each sample over its own tokens: ``q, k, v [T, H, D]`` with
    ``offsets [B+1]``, ``max_len`` >= every sample's length; returns ``[T, H, D]``.

    ``scale`` defaults to ``1/sqrt(D)``; ``causal``: query ``i`` sees keys ``j <= i``.
    """
    op = "jagged_flash_attention"
    check_self_attention(op, q, k, v, offsets, max_len)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return OPS(q, k, v, offsets, offsets, max_len, max_len, weight="softmax", scale=scale,
               causal=causal, block=0)  # fmt: skip
