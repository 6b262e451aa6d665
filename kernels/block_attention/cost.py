"""BlockAttention: softmax attention inside blocks of ``block`` consecutive tokens."""

from __future__ import annotations

import numpy as np

from kernels.attention_cost import AttentionCost, attention_cost


def pairs(n, *, block: int, causal: bool):
    """Pairs attended in a length-``n`` sequence cut into blocks (the last may be shorter)."""
    full, rest = n // block, n % block
    if causal:
        return full * block * (block + 1) / 2 + rest * (rest + 1) / 2
    return full * block * block + rest * rest


def batch_cost(lengths, *, heads: int, head_dim: int, block: int = 64, causal: bool = False,
               elem_bytes: float = 2.0) -> AttentionCost:  # fmt: skip
    """Totals of one call over samples of these lengths (a list or array of ints)."""
    n = np.asarray(lengths, dtype=np.float64)
    return attention_cost(pairs=float(np.sum(pairs(n, block=block, causal=causal))),
                          q_tokens=float(n.sum()), kv_tokens=float(n.sum()), heads=heads,
                          head_dim=head_dim, elem_bytes=elem_bytes)  # fmt: skip


def expected_cost(dist, *, heads: int, head_dim: int, block: int = 64, causal: bool = False,
                  elem_bytes: float = 2.0) -> AttentionCost:  # fmt: skip
    """Expected cost per sample whose length follows ``dist`` (has ``pmf`` over ``0..max``)."""
    p = np.asarray(dist.pmf, dtype=np.float64)
    n = np.arange(len(p), dtype=np.float64)
    return attention_cost(pairs=float(p @ pairs(n, block=block, causal=causal)),
                          q_tokens=float(p @ n), kv_tokens=float(p @ n), heads=heads,
                          head_dim=head_dim, elem_bytes=elem_bytes)  # fmt: skip
