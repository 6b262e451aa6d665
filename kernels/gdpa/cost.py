"""GDPA, ``O = (act(Q Kᵀ)·scale) V``: the same matmuls as softmax attention over the same
pairs (the activation replaces softmax and is element-wise, left out of FLOPs). K/V are the
queries' own tokens (JFA's pairs) or ``n_dense`` dense tokens per sample (asymmetric pairs)."""

from __future__ import annotations

import numpy as np

from kernels.attention_cost import AttentionCost, attention_cost
from kernels.jfa.cost import pmf_arrays, pairs

__all__ = ["pairs", "batch_cost", "expected_cost"]


def _cost(p, n, *, heads, head_dim, causal, n_dense, elem_bytes) -> AttentionCost:
    """Sum (``p`` = ones) or expectation (``p`` = pmf) over lengths ``n``."""
    if n_dense is None:
        pr, kv = pairs(n, causal=causal), n
    else:
        pr, kv = n * n_dense, np.full_like(n, float(n_dense))
    return attention_cost(pairs=float(p @ pr), q_tokens=float(p @ n), kv_tokens=float(p @ kv),
                          heads=heads, head_dim=head_dim, elem_bytes=elem_bytes)  # fmt: skip


def batch_cost(lengths, *, heads: int, head_dim: int, causal: bool = False,
               n_dense: int | None = None, elem_bytes: float = 2.0) -> AttentionCost:  # fmt: skip
    """Totals of one call over query samples of these lengths; ``n_dense``: dense K/V of that
    many tokens per sample (else self attention, ``causal`` as given)."""
    n = np.asarray(lengths, dtype=np.float64)
    return _cost(np.ones_like(n), n, heads=heads, head_dim=head_dim, causal=causal,
                 n_dense=n_dense, elem_bytes=elem_bytes)  # fmt: skip


def expected_cost(dist, *, heads: int, head_dim: int, causal: bool = False,
                  n_dense: int | None = None, elem_bytes: float = 2.0) -> AttentionCost:  # fmt: skip
    """Expected cost per sample whose query length follows ``dist`` (has ``pmf``)."""
    p, n = pmf_arrays(dist)
    return _cost(p, n, heads=heads, head_dim=head_dim, causal=causal, n_dense=n_dense,
                 elem_bytes=elem_bytes)  # fmt: skip
