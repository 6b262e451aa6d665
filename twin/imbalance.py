"""Load imbalance from data: ranks drawn from the scenario's length laws, grouped into classes.

Every rank trains on its own micro-batch, whose jagged lengths are drawn from the scenario's
sequence-length laws (with ``training.seed``); attention and every per-token op then cost more
on some ranks than on others, and every synchronising collective waits for the slowest.

Method: draw the micro-batches of ``min(num_gpus, samples)`` ranks; score each by its exact
sequence-dependent FLOPs (``twin.flops`` is linear in the tokens of each group and in the
attended pairs, so three to four cost evaluations give the coefficients); sort; cut into
classes at the quantiles ``QUANTILES``; represent each class by the member closest to its
mean load, except the top class, represented by its slowest member (the straggler). Each
class becomes one simulated rank (``twin.engine.simulate_ranks``), weighted by its share of
ranks. Two more sources are modelled as factors on every rank's ops, since the collective
after them waits for the busiest member: the embedding shards' load under the table sharding
and id skew (``embedding_load_factor``: hot ids hashed onto shards with the seed) and MoE
routing (``moe_load_factor``). Topology: where an axis's groups lie differently on the tiers
(unaligned placements), ``twin.topology`` gives topology classes, and ``twin.simulate`` crosses
them with these load classes (``RankClass.shapes``). Not modelled yet: random noise, and the
straggler among ranks that were not sampled when ``num_gpus`` exceeds ``samples``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from hwmodels.groups import GroupShape
from scenarios.placement import routed_tokens, table_load, table_owners, table_plan
from scenarios.schema import GEMModel, Scenario
from twin.flops import SeqStats, self_pairs, model_costs

QUANTILES = (0.5, 0.9, 1.0)  # class upper edges, as fractions of ranks sorted by load


@dataclass(frozen=True, slots=True)
class RankClass:
    name: str  # e.g. "p0-50", or "p90-100/topo1" with a topology position (twin.topology)
    weight: float  # share of ranks it stands for
    seq: SeqStats | None  # its micro-batch's sequence load (None: no sequences)
    load: float  # its sequence-dependent FLOPs over the mean rank's
    shapes: Mapping[str, GroupShape] | None = None  # its group per axis (twin.topology)


def rank_classes(s: Scenario, *, samples: int = 1024) -> list[RankClass]:
    """Classes of ranks by sequence load; one class when the model has no sequences."""
    m = s.model
    if not isinstance(m, GEMModel) or not m.embeddings.sequences or s.hardware.num_gpus == 1:
        return [RankClass("all", 1.0, None, 1.0)]  # the expected load: nobody to wait for
    tokens, pairs, loads = _draw(s, min(s.hardware.num_gpus, samples))
    R, B = len(loads), s.training.micro_batch
    order = np.argsort(loads, kind="stable")
    mean = float(loads.mean())
    out, lo = [], 0
    for q in QUANTILES:
        hi = max(lo + 1, int(round(q * R)))
        members = order[lo:hi]
        if len(members) == 0:
            continue
        pick = members[-1] if hi == R else members[np.argmin(abs(loads[members] - loads[members].mean()))]
        name = f"p{round(100 * lo / R)}-{round(100 * hi / R)}"
        seq = SeqStats(B, tuple(float(t) for t in tokens[:, pick]), float(pairs[pick]))
        out.append(RankClass(name, len(members) / R, seq, float(loads[pick]) / mean))
        lo = hi
        if lo >= R:
            break
    return out


def every_rank(s: Scenario) -> list[RankClass]:
    """One class per GPU, with the same draws as ``rank_classes`` (to check symmetry against)."""
    m, B = s.model, s.training.micro_batch
    if not isinstance(m, GEMModel) or not m.embeddings.sequences:
        return [RankClass("all", 1.0, None, 1.0)]
    tokens, pairs, loads = _draw(s, s.hardware.num_gpus)
    mean = float(loads.mean())
    return [RankClass(f"rank{r}", 1 / len(loads),
                      SeqStats(B, tuple(float(t) for t in tokens[:, r]), float(pairs[r])),
                      float(loads[r]) / mean) for r in range(len(loads))]  # fmt: skip


def _draw(s: Scenario, R: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens per group [G, R], attended pairs [R] and sequence FLOPs [R] of R ranks' batches."""
    m, B = s.model, s.training.micro_batch
    rng = np.random.default_rng(s.training.seed)
    lengths = np.stack([g.length.sample(rng, R * B).reshape(R, B) for g in m.embeddings.sequences])
    tokens = lengths.sum(axis=2).astype(np.float64)
    pairs = self_pairs(m.sequence, lengths.sum(axis=0).astype(np.float64)).sum(axis=1)
    f0, per_token, per_pair = _linear_flops(s)
    return tokens, pairs, f0 + per_token @ tokens + per_pair * pairs


def _linear_flops(s: Scenario) -> tuple[float, np.ndarray, float]:
    """(f0, per-token FLOPs of each group, per-pair FLOPs): a micro-batch's FLOPs are exactly
    f0 + Σ_g a_g·tokens_g + b·pairs (twin.flops is linear in them)."""
    m, B = s.model, s.training.micro_batch
    G = len(m.embeddings.sequences)

    def flops(tokens: tuple[float, ...], pairs: float) -> float:
        return sum(c.flops for c in model_costs(m, batch=B, seq=SeqStats(B, tokens, pairs)))

    zero = tuple(0.0 for _ in range(G))
    f0 = flops(zero, 0.0)
    unit = [tuple(1.0 if j == i else 0.0 for j in range(G)) for i in range(G)]
    return f0, np.array([flops(u, 0.0) - f0 for u in unit]), flops(zero, 1.0) - f0


# ---- embedding shards ---------------------------------------------------------------------------
HOT_IDS = 64  # most popular ids per table placed individually; the rest spread evenly


def embedding_load_factor(s: Scenario) -> float:
    """The busiest embedding shard's lookup bytes over the mean shard's (>= 1).

    Table-wise tables go whole to the shard ``scenarios.placement.table_owners`` gives them (the
    executor's placement: greedy, largest first). Row-, column-
    and grid-wise tables spread their lookups over the shards, except for id skew: ids are
    hashed to rows, so a table's ``HOT_IDS`` most popular ids (their shares from the table's
    power law, as the executor's data draws them) land on shards drawn with the scenario's
    seed, and a shard that catches several hot ids is busier than the rest. Data-parallel
    tables are looked up where the batch is (balanced).
    """
    S = s.parallelism.sparse_shard
    if S == 1:
        return 1.0
    plan, load = table_plan(s), table_load(s)
    rng = np.random.default_rng([s.training.seed, 3])
    shards = np.zeros(S)
    for fam in s.model.embeddings.families():
        if plan[fam.name] == "table":
            continue
        hot = hot_id_shares(fam.rows, fam.id_skew, HOT_IDS)
        per = load[fam.name]
        shards += per * fam.count * (1.0 - hot.sum()) / S
        hits = rng.integers(0, S, size=(fam.count, len(hot)))
        np.add.at(shards, hits.ravel(), np.tile(per * hot, fam.count))
    fams = {name: f for f in s.model.embeddings.families() for name in f.table_names()}
    for name, owner in table_owners(s).items():  # where the executor puts each whole table
        shards[owner] += load[fams[name].name]
    return float(shards.max() / shards.mean()) if shards.mean() > 0 else 1.0


def hot_id_shares(rows: int, skew: float, k: int) -> np.ndarray:
    """Shares of lookups of the ``k`` most popular ids of a table (``executor.data.zipf_ids``'
    law: ``id = floor(x) - 1`` with ``x`` power-law distributed on ``[1, rows + 1)``)."""
    k = min(k, rows)
    if skew == 0:
        return np.zeros(0)  # uniform ids: no id is hotter than the rest
    edges = np.arange(1, k + 2, dtype=np.float64)  # id i covers x in [i + 1, i + 2)
    top = float(rows + 1)
    if abs(skew - 1.0) < 1e-6:
        cdf = np.log(edges) / np.log(top)
    else:
        e = 1.0 - skew
        cdf = (edges**e - 1.0) / (top**e - 1.0)
    return np.diff(cdf)


# ---- experts ----------------------------------------------------------------------------------------
def moe_load_factor(s: Scenario) -> float:
    """The busiest expert rank's routed tokens over the mean (>= 1), capped by the capacity factor.

    A router kept balanced by its auxiliary loss still assigns tokens at random: an expert's load
    is binomial around ``mu = tokens·top_k / experts``, and the busiest of the ``expert`` ranks
    (each holding experts/expert of them, so its load has mean ``mu·experts/expert``) sits about
    ``sqrt(2 ln ranks)`` standard deviations above it. Tokens past the capacity factor are
    dropped, so the factor never exceeds it. One device (expert = 1) has no one to wait for.
    """
    m, ep = s.model, s.parallelism.expert
    if not isinstance(m, GEMModel) or not m.moe.num_experts or ep == 1:
        return 1.0
    tokens = routed_tokens(m, s.training.micro_batch) * ep  # the EP group's
    mean = tokens / ep  # per expert rank
    excess = float(np.sqrt(2.0 * np.log(ep) / mean))
    return min(m.moe.capacity_factor, 1.0 + excess)
