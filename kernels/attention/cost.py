"""FLOPs and HBM bytes of the attention family, torch-free (the twin imports this).

Counts the matmuls of the *attended* (query, key) pairs only: ``Q Kᵀ`` and ``P V`` are
``2·H·Dh`` FLOPs each per pair forward; backward recomputes nothing in the model-FLOP count and
does four matmuls (dV, dP, dQ, dK), twice the forward. Bytes assume a fused (flash-style)
kernel: Q, K, V and O move once forward; backward reads Q, K, V, O, dO and writes dQ, dK, dV.
Element-wise work (softmax, activation, masks) is left out of FLOPs, as FlopCounterMode does.

Pairs per sample: ``self_pairs`` (self attention, causal and/or blocks), ``cross_pairs`` (a
jagged side against a dense one); ``pairs(spec, n)`` picks by an ``AttentionSpec``, and
``batch_cost`` / ``expected_cost`` turn a batch's lengths or a length law into an
``AttentionCost``. ``length_law_report`` gives those expectations for every kind under a
heavy-tailed (lognormal) law of user-history lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.attention.spec import AttentionSpec


@dataclass(frozen=True, slots=True)
class AttentionCost:
    fwd_flops: float
    bwd_flops: float
    fwd_bytes: float
    bwd_bytes: float


def attention_cost(
    *, pairs: float, q_tokens: float, kv_tokens: float, heads: int, head_dim: int, elem_bytes: float
) -> AttentionCost:
    """Cost of attention over ``pairs`` attended (q, k) pairs with the given token counts."""
    fwd = 4.0 * heads * head_dim * pairs
    width = heads * head_dim * elem_bytes
    fwd_bytes = width * (2 * q_tokens + 2 * kv_tokens)  # read Q, K, V; write O
    bwd_bytes = width * (4 * q_tokens + 4 * kv_tokens)  # read Q,K,V,O,dO; write dQ,dK,dV
    return AttentionCost(fwd, 2.0 * fwd, fwd_bytes, bwd_bytes)


def self_pairs(n, *, causal: bool, block: int = 0):
    """Pairs attended in a length-``n`` sequence (floats and numpy arrays too): all of them,
    the causal triangle, or inside blocks of ``block`` tokens (the last may be shorter)."""
    if block:
        full, rest = n // block, n % block
        if causal:
            return full * block * (block + 1) / 2 + rest * (rest + 1) / 2
        return full * block * block + rest * rest
    return n * (n + 1) / 2 if causal else n * n


def cross_pairs(q_len, kv_len):
    """Every one of ``q_len`` queries attends every one of ``kv_len`` keys of its sample."""
    return q_len * kv_len


def sides(spec: AttentionSpec, n, n_dense: int | None = None):
    """``(pairs, q tokens, kv tokens)`` per sample whose jagged side has ``n`` tokens (an array
    of lengths works); ``n_dense``: the dense side's tokens a sample (``spec.jagged`` q or kv)."""
    if spec.jagged == "both":
        return self_pairs(n, causal=spec.causal, block=spec.block), n, n
    if n_dense is None:
        raise ValueError(f"attention cost of jagged='{spec.jagged}' needs n_dense, the dense side's tokens a sample")
    dense = np.full_like(np.asarray(n, dtype=np.float64), float(n_dense))
    q, kv = (n, dense) if spec.jagged == "q" else (dense, n)
    return cross_pairs(q, kv), q, kv


def pairs(spec: AttentionSpec, n, n_dense: int | None = None):
    """Pairs attended per sample whose jagged side has ``n`` tokens."""
    return sides(spec, n, n_dense)[0]


def batch_cost(spec: AttentionSpec, lengths, *, heads: int, head_dim: int, n_dense: int | None = None,
               elem_bytes: float = 2.0) -> AttentionCost:
    """Totals of one call over samples of these (jagged side's) lengths (a list or array)."""
    n = np.asarray(lengths, dtype=np.float64)
    pr, q, kv = sides(spec, n, n_dense)
    return attention_cost(pairs=float(np.sum(pr)), q_tokens=float(np.sum(q)), kv_tokens=float(np.sum(kv)),
                          heads=heads, head_dim=head_dim, elem_bytes=elem_bytes)


def expected_cost(spec: AttentionSpec, dist, *, heads: int, head_dim: int, n_dense: int | None = None,
                  elem_bytes: float = 2.0) -> AttentionCost:
    """Expected cost per sample whose jagged length follows ``dist`` (anything with ``pmf`` over
    lengths ``0..max``, e.g. ``scenarios.distributions.LengthDist``); × B for a batch."""
    p, n = pmf_arrays(dist)
    pr, q, kv = sides(spec, n, n_dense)
    return attention_cost(pairs=float(p @ pr), q_tokens=float(p @ q), kv_tokens=float(p @ kv), heads=heads,
                          head_dim=head_dim, elem_bytes=elem_bytes)


def pmf_arrays(dist) -> tuple[np.ndarray, np.ndarray]:
    """``(p, n)``: the law's probabilities and the lengths ``0..max`` they belong to."""
    p = np.asarray(dist.pmf, dtype=np.float64)
    return p, np.arange(len(p), dtype=np.float64)


#: The kinds of ``length_law_report``: name -> spec (``block`` and ``n_dense`` given there).
REPORT_KINDS = {
    "jfa": AttentionSpec("jfa"), "jfa_causal": AttentionSpec("jfa", causal=True),
    "block": None, "jagged_q_dense_kv": AttentionSpec("asym", jagged="q"),
    "dense_q_jagged_kv": AttentionSpec("asym", jagged="kv"),
}


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
    report = {}
    for kind, spec in REPORT_KINDS.items():
        spec = spec or AttentionSpec("block", block=block)
        c = expected_cost(spec, dist, heads=heads, head_dim=head_dim, n_dense=n_dense, elem_bytes=2.0)
        expect = float(p @ pairs(spec, n, n_dense))
        full = float(np.asarray(pairs(spec, np.float64(top), n_dense)))
        report[kind] = {
            "pairs": expect, "fwd_flops": c.fwd_flops, "bwd_flops": c.bwd_flops,
            "fwd_bytes": c.fwd_bytes, "bwd_bytes": c.bwd_bytes,
            "useful_fraction": expect / full if full else 0.0,
        }  # fmt: skip
    report["tokens"] = {"mean": float(p @ n), "max": top}
    return report


def heavy_tail_law(max_len: int = 4096, mean: float = 512.0, sigma: float = 1.0):
    """The heavy-tailed user-history law of the benchmark and the report: a lognormal with
    log-space std ``sigma``, clipped to ``[0, max_len]``, mean ``mean``."""
    from scenarios.distributions import LengthDist  # pydantic: only when asked

    return LengthDist(shape="lognormal", max=max_len, mean=mean, sigma=sigma)
