"""Jagged flash attention: attended (query, key) pairs, FLOPs and HBM bytes, torch-free.

``pairs`` is what the twin uses (``twin/flops.py``); ``batch_cost`` and ``expected_cost`` turn
it into forward/backward FLOPs and bytes (``kernels.attention_cost``: ``4·H·d`` FLOPs per pair
forward, twice that backward; Q, K, V, O moved once) for the actual lengths of a batch or per
sample of a length law. ``length_law_report`` gives those expectations for every attention
kind under a heavy-tailed (lognormal) law of user-history lengths.
"""

from __future__ import annotations

import numpy as np

from kernels.asym_attention import cost as asym_cost
from kernels.attention_cost import AttentionCost, attention_cost
from kernels.block_attention import cost as block_cost


def pairs(n, *, causal: bool):
    """Pairs attended in a length-``n`` sequence (works on floats and numpy arrays)."""
    return n * (n + 1) / 2 if causal else n * n


def batch_cost(lengths, *, heads: int, head_dim: int, causal: bool = True,
               elem_bytes: float = 2.0) -> AttentionCost:  # fmt: skip
    """Totals of one call over samples of these lengths (a list or array of ints)."""
    n = np.asarray(lengths, dtype=np.float64)
    return attention_cost(pairs=float(np.sum(pairs(n, causal=causal))), q_tokens=float(n.sum()),
                          kv_tokens=float(n.sum()), heads=heads, head_dim=head_dim,
                          elem_bytes=elem_bytes)  # fmt: skip


def expected_cost(dist, *, heads: int, head_dim: int, causal: bool = True,
                  elem_bytes: float = 2.0) -> AttentionCost:  # fmt: skip
    """Expected cost per sample whose length follows ``dist`` (anything with ``pmf`` over
    lengths ``0..max``, e.g. ``scenarios.distributions.LengthDist``); × B for a batch."""
    p, n = pmf_arrays(dist)
    return attention_cost(pairs=float(p @ pairs(n, causal=causal)), q_tokens=float(p @ n),
                          kv_tokens=float(p @ n), heads=heads, head_dim=head_dim,
                          elem_bytes=elem_bytes)  # fmt: skip


def pmf_arrays(dist) -> tuple[np.ndarray, np.ndarray]:
    """``(p, n)``: the law's probabilities and the lengths ``0..max`` they belong to."""
    p = np.asarray(dist.pmf, dtype=np.float64)
    return p, np.arange(len(p), dtype=np.float64)


def length_law_report(dist, *, heads: int = 4, head_dim: int = 128, block: int = 64,
                      n_dense: int = 256) -> dict[str, dict[str, float]]:  # fmt: skip
    """Per-sample expectations of each attention kind when lengths follow ``dist``.

    For each kind: ``pairs``, ``fwd_flops``, ``bwd_flops``, ``fwd_bytes``, ``bwd_bytes``
    (bf16), and ``useful_fraction`` = expected pairs over the pairs of the same kind at the
    law's maximum length (what padding every sample to ``max`` computes). Kinds: ``jfa``
    (non-causal), ``jfa_causal``, ``block`` (``block`` tokens, non-causal), ``jagged_q_dense_kv``
    and ``dense_q_jagged_kv`` (``n_dense`` dense tokens per sample); GDPA has JFA's pairs.
    ``heavy_tail_law()`` is the lognormal the benchmark uses.
    """
    p, n = pmf_arrays(dist)
    top = float(n[-1])
    kinds = {  # name: (pairs per length, q tokens per length, kv tokens per length)
        "jfa": (lambda x: pairs(x, causal=False), lambda x: x, lambda x: x),
        "jfa_causal": (lambda x: pairs(x, causal=True), lambda x: x, lambda x: x),
        "block": (lambda x: block_cost.pairs(x, block=block, causal=False), lambda x: x, lambda x: x),
        "jagged_q_dense_kv": (lambda x: asym_cost.pairs(x, n_dense), lambda x: x, lambda x: n_dense + 0 * x),
        "dense_q_jagged_kv": (lambda x: asym_cost.pairs(n_dense, x), lambda x: n_dense + 0 * x, lambda x: x),
    }  # fmt: skip
    report = {}
    for kind, (pf, qf, kf) in kinds.items():
        c = attention_cost(pairs=float(p @ pf(n)), q_tokens=float(p @ qf(n)),
                           kv_tokens=float(p @ kf(n)), heads=heads, head_dim=head_dim,
                           elem_bytes=2.0)  # fmt: skip
        full = float(pf(np.float64(top)))
        report[kind] = {
            "pairs": float(p @ pf(n)), "fwd_flops": c.fwd_flops, "bwd_flops": c.bwd_flops,
            "fwd_bytes": c.fwd_bytes, "bwd_bytes": c.bwd_bytes,
            "useful_fraction": float(p @ pf(n)) / full if full else 0.0,
        }  # fmt: skip
    report["tokens"] = {"mean": float(p @ n), "max": top}
    return report


def heavy_tail_law(max_len: int = 4096, mean: float = 512.0, sigma: float = 1.0):
    """The heavy-tailed user-history law of the benchmark and the report: a lognormal with
    log-space std ``sigma``, clipped to ``[0, max_len]``, mean ``mean``."""
    from scenarios.distributions import LengthDist  # pydantic: only when asked

    return LengthDist(shape="lognormal", max=max_len, mean=mean, sigma=sigma)
