"""PyTorch reference of the jagged attention core (kernels/ATTENTION.md, "Semantics").

Plain and slow on purpose: one loop over samples, dense ``[H, Lq, Lk]`` scores per sample,
every operation in the inputs' dtype (pass float64 for a ground truth). It is differentiable
through autograd, so the same function gives reference gradients. The four public references
(``jfa``, ``gdpa``, ``block_attention``, ``asym_attention``) are thin wrappers over
``attention_reference``.

Layout: ``q [Tq, H, D]`` packed sample after sample with ``q_offsets [B+1]``; ``k, v [Tk, H, D]``
with ``kv_offsets [B+1]`` (a dense ``[B, N, H, D]`` side is the jagged tensor with offsets
``arange(B+1)·N``).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "relu2": lambda x: F.relu(x).square(),
    "identity": lambda x: x,
}
WEIGHTS = ("softmax", *ACTIVATIONS)


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
    weight: str, scale: float, causal: bool = False, block: int = 0,
) -> Tensor:  # fmt: skip
    """``O [Tq, H, D]``; per sample ``b`` and head: ``O = W V`` with ``S = Q Kᵀ`` (``[Lq, Lk]``).

    - ``weight="softmax"``: ``W = softmax(S · scale + mask)`` over keys (masked keys get −inf);
      a query row with no key to attend gives ``O = 0``, never NaN.
    - an activation (``silu``, ``gelu`` in its tanh form, ``relu``, ``relu2 = relu(x)²``,
      ``identity``): ``W = act(S) · scale · mask`` with a 0/1 mask, no normalisation.
    - ``causal``: query ``i`` sees keys ``j <= i``, positions counted from the sample's start.
    - ``block > 0``: query ``i`` sees keys ``j`` with ``i // block == j // block`` (the last
      block of a sample may be shorter); with ``causal`` both must hold.

    A sample with ``Lq = 0`` has no rows; a sample with ``Lk = 0`` gives zero rows. Length 1
    self attention: softmax gives ``O = v``; an activation gives ``O = act(q·k) · scale · v``.
    """
    if weight not in WEIGHTS:
        raise ValueError(f"weight '{weight}' is unknown; use one of {', '.join(WEIGHTS)}")
    qo, ko = q_offsets.tolist(), kv_offsets.tolist()
    outs = []
    for b in range(len(qo) - 1):
        qb = q[qo[b] : qo[b + 1]].transpose(0, 1)  # [H, Lq, D]
        kb = k[ko[b] : ko[b + 1]].transpose(0, 1)
        vb = v[ko[b] : ko[b + 1]].transpose(0, 1)
        mask = attention_mask(qb.shape[1], kb.shape[1], causal=causal, block=block, device=q.device)
        s = qb @ kb.transpose(1, 2)  # [H, Lq, Lk]
        if weight == "softmax":
            w = _masked_softmax(s * scale, mask)
        else:
            w = ACTIVATIONS[weight](s) * scale * mask
        outs.append((w @ vb).transpose(0, 1))  # [Lq, H, D]
    if not outs:
        return q.new_zeros(q.shape)
    return torch.cat(outs)


def attention_mask(n_q: int, n_k: int, *, causal: bool, block: int, device=None) -> Tensor:
    """Boolean ``[n_q, n_k]``: True where query ``i`` attends key ``j`` (positions from 0)."""
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    mask = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if causal:
        mask &= j <= i
    if block > 0:
        mask &= (i // block) == (j // block)
    return mask


def _masked_softmax(x: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last dim with ``mask`` False → weight 0; an all-False row gives 0."""
    if x.shape[-1] == 0:  # no keys: W V is an empty sum, O = 0
        return x
    x = x.masked_fill(~mask, float("-inf"))
    m = x.amax(dim=-1, keepdim=True).clamp(min=torch.finfo(x.dtype).min).detach()  # finite
    e = torch.exp(x - m) * mask
    return e / e.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny)


def dense_offsets(batch: int, n: int, device=None) -> Tensor:
    """Offsets ``arange(B+1)·N`` of a dense ``[B, N, H, D]`` side seen as a jagged tensor."""
    return torch.arange(batch + 1, device=device, dtype=torch.int64) * n


def jagged_flash_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, *,
    causal: bool = True, scale: float | None = None,
) -> Tensor:  # fmt: skip
    """JFA: softmax self attention of each sample's tokens over its own tokens, ``[T, H, D]``.

    ``W = softmax(Q Kᵀ · scale + mask)``, ``scale`` defaults to ``1/sqrt(D)``; ``causal``:
    query ``i`` sees keys ``j <= i``. Length 0: no rows. Length 1: ``O = v``. ``max_len`` is a
    bound on the sample lengths, unused here (kept for the op's signature).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return attention_reference(q, k, v, offsets, offsets, weight="softmax", scale=scale, causal=causal)
