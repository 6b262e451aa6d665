"""PyTorch reference of the core (``kernels/ATTENTION.md`` semantics), sample by sample with
explicit masks: slow, exact in float64, on any device. Tests and ``gpu_check.py`` use it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

ACTIVATIONS = {
    "silu": F.silu,
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "relu2": lambda x: F.relu(x).square(),
    "identity": lambda x: x,
}


def attention_reference(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
                        *, weight: str, scale: float, causal: bool = False,
                        block: int = 0) -> Tensor:
    """``o [Tq, H, D]`` in q's dtype (call it in float64 for a reference); differentiable.

    softmax: ``softmax(S·scale + mask) V``, a row with no key gives 0; activations:
    ``(act(S)·scale·mask) V``. ``causal``: key j <= query i; ``block=W``: ``i//W == j//W``
    (positions counted from each sample's start)."""
    out = q.new_zeros(q.shape)
    qo, ko = q_offsets.tolist(), kv_offsets.tolist()
    for b in range(len(qo) - 1):
        qs, qe, ks, ke = qo[b], qo[b + 1], ko[b], ko[b + 1]
        if qe == qs:
            continue
        s = torch.einsum("ihd,jhd->hij", q[qs:qe], k[ks:ke])
        i = torch.arange(qe - qs, device=q.device)[:, None]
        j = torch.arange(ke - ks, device=q.device)[None, :]
        mask = torch.ones(qe - qs, ke - ks, dtype=torch.bool, device=q.device)
        if causal:
            mask = mask & (j <= i)
        if block:
            mask = mask & ((i // block) == (j // block))
        if weight == "softmax":
            p = torch.softmax((s * scale).masked_fill(~mask, float("-inf")), dim=-1)
            p = torch.nan_to_num(p, nan=0.0)
        else:
            p = ACTIVATIONS[weight](s) * scale * mask
        out[qs:qe] = torch.einsum("hij,jhd->ihd", p, v[ks:ke])
    return out
