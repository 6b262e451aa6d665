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
(unaligned placements), ``twin.topology`` gives topology classes, and ``twin.simulate`` runs these
load classes in the most common one and the others at the straggler's load (``RankClass.shapes``). Not modelled yet: random noise, and the
straggler among ranks that were not sampled when ``num_gpus`` exceeds ``samples``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from hwmodels.groups import GroupShape
from scenarios.distributions import id_cdf, id_shares
from scenarios.placement import hot_rows, routed_tokens, table_load, table_owners, table_plan
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

    Hot rows (``scenarios.placement.hot_rows``: rows every rank holds whole): the share of a
    table's lookups that hits them (``hot_splits``) is looked up on every rank from its own batch,
    spread evenly; only the cold lookups load the shards as above, the ``HOT_IDS`` placed
    individually being the hottest cold ids (the ids right after the hot rows).
    """
    S = s.parallelism.sparse_shard
    if S == 1:
        return 1.0
    plan, load, hot, n_hot = table_plan(s), table_load(s), hot_splits(s), hot_rows(s)
    rng = np.random.default_rng([s.training.seed, 3])
    shards = np.zeros(S)
    for fam in s.model.embeddings.families():
        h, per = hot[fam.name].ids if fam.name in hot else 0.0, load[fam.name]
        shards += per * fam.count * h / S  # the hot lookups: every rank its own batch's
        if plan[fam.name] == "table":
            continue
        top = hot_id_shares(fam.rows, fam.id_skew, HOT_IDS, start=n_hot.get(fam.name, 0))
        shards += per * fam.count * (1.0 - h - top.sum()) / S
        hits = rng.integers(0, S, size=(fam.count, len(top)))
        np.add.at(shards, hits.ravel(), np.tile(per * top, fam.count))
    fams = {name: f for f in s.model.embeddings.families() for name in f.table_names()}
    for name, owner in table_owners(s).items():  # where the executor puts each whole table (its cold part)
        fam = fams[name]
        shards[owner] += load[fam.name] * (1.0 - hot[fam.name].ids if fam.name in hot else 1.0)
    return float(shards.max() / shards.mean()) if shards.mean() > 0 else 1.0


def hot_id_shares(rows: int, skew: float, k: int, *, start: int = 0) -> np.ndarray:
    """Shares of lookups of the ``k`` most popular ids of a table from id ``start`` on (ids
    ``start .. start + k - 1``; ``executor.data.zipf_ids``' law, ``scenarios.distributions.id_cdf``:
    the lowest ids are the hottest); none for uniform ids, where no id is hotter than the rest."""
    return np.zeros(0) if skew == 0 else id_shares(rows, skew, k, start=start)


def hot_share(rows: int, skew: float, k: int) -> float:
    """Share of a table's lookups that hit its ids ``0 .. k-1`` (``k / rows`` for uniform ids)."""
    return float(id_cdf(np.array([min(k, rows) + 1.0]), rows, skew)[0])


@dataclass(frozen=True, slots=True)
class HotSplit:
    """How a family's hot rows (``scenarios.placement.hot_rows``) split its traffic."""

    rows: float  # share of each table's rows that are hot: hot_rows / rows
    ids: float  # share of its lookups that hit a hot row (looked up locally, never all-to-all'd)
    bags: float  # share of its bags (pooled) or tokens (sequence) whose every id is hot


def hot_splits(s: Scenario) -> dict[str, HotSplit]:
    """Each family with hot rows, by name (``twin.flops`` names a family's lookup op after it).

    A hot lookup is answered on the rank whose batch asked, from its own copy: the ids all-to-all
    carries only the cold ids, and the pooled outputs all-to-all only the bags that hold at least
    one cold id (the others are complete locally). With a bag's ``P`` ids drawn independently, a
    share ``h`` of them hot, a bag is all hot with probability ``E[h^P]`` over the pooling law
    (``h`` for a one-hot table or a sequence token). That assumes an output exchange compacted to
    those bags, as HugeCTR's infrequent-embedding all-to-all is; the native executor sends every
    bag's partial sum (``executor/sharded_tables.md``)."""
    out, n_hot = {}, hot_rows(s)
    for fam in s.model.embeddings.families():
        if fam.name in n_hot:
            n = n_hot[fam.name]
            h = hot_share(fam.rows, fam.id_skew, n)
            out[fam.name] = HotSplit(n / fam.rows, h, fam.pooling.expect(lambda p, h=h: h**p))
    return out


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
