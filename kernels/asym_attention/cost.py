"""Asymmetric attention: ``q_len`` queries each attend to all ``kv_len`` keys of their sample
(long jagged queries × a few keys, or a few queries × a long jagged history)."""

from __future__ import annotations

import numpy as np

from kernels.attention_cost import AttentionCost, attention_cost


def pairs(q_len, kv_len):
    return q_len * kv_len


def _cost(p, n, *, n_dense, jagged, heads, head_dim, elem_bytes) -> AttentionCost:
    if jagged not in ("q", "kv"):
        raise ValueError(f"jagged='{jagged}' is unknown; use 'q' (jagged_q_dense_kv) or 'kv'")
    dense = np.full_like(n, float(n_dense))
    q, kv = (n, dense) if jagged == "q" else (dense, n)
    return attention_cost(pairs=float(p @ pairs(q, kv)), q_tokens=float(p @ q),
                          kv_tokens=float(p @ kv), heads=heads, head_dim=head_dim,
                          elem_bytes=elem_bytes)  # fmt: skip


def batch_cost(lengths, *, n_dense: int, jagged: str = "q", heads: int, head_dim: int,
               elem_bytes: float = 2.0) -> AttentionCost:  # fmt: skip
    """Totals of one call: jagged side of these lengths, ``n_dense`` tokens per sample on the
    dense side; ``jagged="q"`` (``jagged_q_dense_kv``) or ``"kv"`` (``dense_q_jagged_kv``)."""
    n = np.asarray(lengths, dtype=np.float64)
    return _cost(np.ones_like(n), n, n_dense=n_dense, jagged=jagged, heads=heads,
                 head_dim=head_dim, elem_bytes=elem_bytes)  # fmt: skip


def expected_cost(dist, *, n_dense: int, jagged: str = "q", heads: int, head_dim: int,
                  elem_bytes: float = 2.0) -> AttentionCost:  # fmt: skip
    """Expected cost per sample whose jagged length follows ``dist`` (has ``pmf``)."""
    p = np.asarray(dist.pmf, dtype=np.float64)
    n = np.arange(len(p), dtype=np.float64)
    return _cost(p, n, n_dense=n_dense, jagged=jagged, heads=heads, head_dim=head_dim,
                 elem_bytes=elem_bytes)  # fmt: skip
