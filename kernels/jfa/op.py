"""JFA as a torch.library op: ``gemtwin::jfa_fwd`` / ``gemtwin::jfa_bwd`` over the Triton core.

Semantics: ``kernels.jfa.reference.jagged_flash_attention`` (kernels/ATTENTION.md).
"""

from __future__ import annotations

import math

from torch import Tensor

from kernels.jfa.registration import (
    check_dims, check_max_len, check_offsets, check_tensors, define_attention_ops,
)  # fmt: skip

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
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_dims(op, name, t, 3, "[T, H, D]")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"{op}: q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}; self attention needs one shape [T, H, D]")  # fmt: skip
    check_tensors(op, q=q, k=k, v=v)
    check_offsets(op, "offsets", offsets, q)
    check_max_len(op, "max_len", max_len)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return OPS(q, k, v, offsets, offsets, max_len, max_len, weight="softmax", scale=scale,
               causal=causal, block=0)  # fmt: skip
