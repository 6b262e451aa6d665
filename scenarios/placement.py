"""Each layer's placement on the device mesh, declared once as data (torch-free).

``placements(scenario)`` lists the layers in the order the twin's step runs them (the lookups
first, TorchRec-style, then the model order) as frozen ``LayerPlacement`` records: where the
layer's parameters live (``Params``: which mesh axes shard them, which replicate them, and the
executor's parameter names that hold them) and which collectives it issues (``Collective``:
kind, group, phase, payload). The twin's workload builder (``twin.workload``) reads them to
build its collectives, and ``executor/parallelize.py`` is to read the same records to shard the
real model: FSDP2 over ``dense_replicate × dense_shard`` for dense parameters, whole experts over
``expert``, embedding tables 2D over ``sparse_shard × sparse_replica`` (their hot rows, ``hot_rows``,
whole on every rank). ``tests/test_same_layers.py``
holds the records to both sides. Print one with ``format_placements(placements(s))``.

What a payload is decides when the twin issues it (``twin.workload``'s docstring has the
dependencies): weights a layer needs (``GATHERED``) are gathered before it runs, prefetched;
activations (``IDS`` for the next micro-batch, ``EMB_OUTPUTS``/``EMB_GRADS`` at the layer's
boundary, ``ROUTED_TOKENS`` next to op ``at``) move in line; gradients and replica updates
(``REDUCED``) go after the layer's backward, once per step. A group of one rank or a payload of
zero bytes issues nothing.

Executor names: ``Params.fqns`` are prefixes of ``named_parameters()`` names of
``executor.model.build_model(scenario)``; a parameter belongs to the longest prefix that names it
(a MoE layer's experts to ``…moe.experts``, the rest of the layer to the layer), as FSDP2 units
nest.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from enum import StrEnum

from scenarios.memo import memo
from scenarios.schema import DLRMModel, GEMModel, Scenario
from scenarios.vocab import CollectiveKind, CommGroup, LayerKind, ParamKind, Phase

A2A, AG, RS, AR = (CollectiveKind.ALL_TO_ALL, CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER,
                   CollectiveKind.ALL_REDUCE)  # fmt: skip


class Payload(StrEnum):
    """What a collective moves; ``twin.workload`` turns it into bytes from the layer's ops."""

    PARAMS = "params"  # the layer's dense parameters, unsharded, in precision.comm (FSDP all-gather)
    GRADS = "grads"  # their gradients, unsharded, in precision.comm (the reduce-scatter's input)
    GRAD_SHARD = "grad_shard"  # one dense_shard rank's share of those gradients
    EXPERT_GRADS = "expert_grads"  # the gradients of the experts one rank holds
    ROUTED_TOKENS = "routed_tokens"  # the routed rows of d_model, capacity-padded (dispatch_bytes)
    IDS = "ids"  # the micro-batch's embedding ids, 8 bytes each
    EMB_OUTPUTS = "emb_outputs"  # pooled and sequence embeddings
    EMB_GRADS = "emb_grads"  # their gradients
    ROWS = "rows"  # the embedding rows the micro-batch touches (from the replicas)
    ROW_GRADS = "row_grads"  # their gradients (back to the replicas)
    TABLE_SHARD = "table_shard"  # the rank's table shard, 1/sparse_sync_interval of it per step
    HOT_ROW_GRADS = "hot_row_grads"  # the tables' hot rows' gradients, whole, in precision.comm


GATHERED = frozenset({Payload.PARAMS, Payload.ROWS})
REDUCED = frozenset({Payload.GRADS, Payload.GRAD_SHARD, Payload.EXPERT_GRADS, Payload.ROW_GRADS,
                     Payload.TABLE_SHARD, Payload.HOT_ROW_GRADS})  # fmt: skip


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective a layer issues each micro-batch (``REDUCED`` ones: once per step)."""

    name: str  # the op's name in the twin's graph (after any micro-batch prefix)
    kind: CollectiveKind
    group: CommGroup  # a mesh axis or the derived expert_replicate (scenarios.vocab)
    phase: Phase
    payload: Payload
    at: str = ""  # an op of the layer it sits next to: after its forward, before its backward


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of one kind in a layer, and how the mesh lays them out."""

    kind: ParamKind
    fqns: tuple[str, ...]  # the executor's parameter-name prefixes that hold them
    shard: tuple[CommGroup, ...]  # groups each tensor is split over (experts: whole experts)
    replicate: tuple[CommGroup, ...] = ()  # groups holding copies of each shard
    rows: str = ""  # tables only, with hot rows: "hot" (rows [0, hot_rows), whole on every rank) or "cold"


@dataclass(frozen=True, slots=True)
class LayerPlacement:
    layer: str  # the twin's layer name (the ops' first name part), e.g. "seq0"
    kind: LayerKind
    params: tuple[Params, ...]
    collectives: tuple[Collective, ...]

    def param_kinds(self) -> set[ParamKind]:
        return {p.kind for p in self.params}


# ---- the mesh ----------------------------------------------------------------------------------
def axis_group(s: Scenario, group: str) -> tuple[int, int]:
    """(size, stride) of a collective group: ranks r, r+stride, ...; ``dense_shard``, ``expert``
    and ``sparse_shard`` are innermost, so that they stay inside a node when they fit."""
    p = s.parallelism  # (an if-chain, not a dict built per call: a planner asks millions of times)
    if group == CommGroup.DENSE_SHARD:
        return p.dense_shard, 1
    if group == CommGroup.DENSE_REPLICATE:
        return p.dense_replicate, p.dense_shard
    if group == CommGroup.EXPERT:
        return p.expert, 1
    if group == CommGroup.EXPERT_REPLICATE:
        return s.hardware.num_gpus // p.expert, p.expert
    if group == CommGroup.SPARSE_SHARD:
        return p.sparse_shard, 1
    if group == CommGroup.SPARSE_REPLICA:
        return p.sparse_replica, p.sparse_shard
    if group == CommGroup.SPARSE_WORLD:
        return p.sparse_shard * p.sparse_replica, 1
    raise KeyError(group)


def split(s: Scenario, params: Params) -> int:
    """Ranks each tensor of ``params`` is divided over (the product of its shard groups)."""
    n = 1
    for g in params.shard:
        n *= axis_group(s, g)[0]
    return n


# ---- model facts both sides use -----------------------------------------------------------------
def routed_tokens(m: GEMModel, batch: int) -> int:
    """(token, expert) assignments of one MoE layer in a micro-batch: ``B · N · top_k``."""
    return batch * m.nonseq.num_tokens * m.moe.top_k


def dispatch_bytes(m: GEMModel, batch: int, elem_bytes: float) -> float:
    """Bytes each rank sends in one MoE dispatch (or combine) all-to-all: the routed rows of
    ``d_model`` elements, padded to the capacity factor (expert parallelism drops what overflows)."""
    return routed_tokens(m, batch) * m.d_model * elem_bytes * m.moe.capacity_factor


def cross_stages(m: GEMModel) -> list[int]:
    """Stages after which each cross layer runs: ``round((j+1)·stages/C) - 1`` (MODEL.md 5)."""
    stages, c = max(m.sequence.num_layers, m.nonseq.num_layers, 1), m.cross.num_layers
    return [round((j + 1) * stages / c) - 1 for j in range(c)]


# ---- the embedding tables' plan (both sides: twin.imbalance prices it, the executor shards by it) ----
def table_load(s: Scenario) -> dict[str, float]:
    """Expected embedding elements one sample reads from one table of each family (``dim`` ×
    ids per sample; per token for sequence tables)."""
    seq = {t.name: g.length.expected for g in s.model.embeddings.sequences for t in g.tables}
    return {f.name: f.dim * seq.get(f.name, f.pooling.expected) for f in s.model.embeddings.families()}


def table_plan(s: Scenario) -> dict[str, str]:
    """Sharding of each table family inside a ``sparse_shard`` group: as
    ``parallelism.table_sharding`` says (a family it omits is table-wise), or ``auto``'s choice.

    ``auto`` (a stand-in for TorchRec's planner, which balances lookup load): a family whose
    single table carries more than an even share of all lookups (total / sparse_shard) goes
    row-wise, the others table-wise.
    """
    fams = s.model.embeddings.families()
    plan = s.parallelism.table_sharding
    if plan != "auto":
        return {f.name: plan.get(f.name, "table") for f in fams}
    load = table_load(s)
    share = sum(load[f.name] * f.count for f in fams) / s.parallelism.sparse_shard
    return {f.name: "row" if load[f.name] > share else "table" for f in fams}


def hot_rows(s: Scenario) -> dict[str, int]:
    """Hot-row replication (``TableFamily.hot_rows``; HugeCTR's hybrid embedding, below): rows
    ``[0, n)`` of each table of a family, the most popular ones, that every rank keeps whole, by
    family, for the families that have some. None on one rank, and none for a data-parallel
    family (every rank holds all of its rows already).

    The mechanism is HugeCTR's hybrid embedding (``Embedding_t.HybridSparseEmbedding``, NVIDIA's
    MLPerf DLRM: "HugeCTR Layer Classes and Methods", SparseEmbedding,
    https://nvidia-merlin.github.io/HugeCTR/v4.1/api/hugectr_layer_book.html): frequent
    categories replicated data-parallel, their gradients all-reduced like dense parameters;
    infrequent ones model-parallel, their ids and outputs all-to-all'd (twin/data/published/README.md,
    "Embedding technique per source": Dell's 4-GPU log, 60,328 frequent categories, 91.9% of lookups)."""
    if s.hardware.num_gpus == 1 or not any(f.hot_rows for f in s.model.embeddings.families()):
        return {}
    plan = table_plan(s)
    return {f.name: f.hot_rows for f in s.model.embeddings.families() if f.hot_rows and plan[f.name] != "data"}


def family_field(s: Scenario, family: str) -> str:
    """The dotted path of table family ``family`` in the Scenario, for one-line errors:
    ``model.embeddings.pooled[user]`` or ``model.embeddings.sequences[history].tables[item]``."""
    if any(f.name == family for f in s.model.embeddings.pooled):
        return f"model.embeddings.pooled[{family}]"
    group = next(g.name for g in s.model.embeddings.sequences if any(f.name == family for f in g.tables))
    return f"model.embeddings.sequences[{group}].tables[{family}]"


def table_owners(s: Scenario) -> dict[str, int]:
    """The ``sparse_shard`` rank that holds each table-wise table whole: largest lookup load first,
    each onto the least loaded rank (ties: the lowest rank), in config order among equals."""
    plan, load = table_plan(s), table_load(s)
    tables = [(load[f.name], name) for f in s.model.embeddings.families() if plan[f.name] == "table"
              for name in f.table_names()]  # fmt: skip
    shards = [(0.0, r) for r in range(s.parallelism.sparse_shard)]  # heap: least loaded, then lowest rank
    owners = {}
    for i, (lo, name) in sorted(enumerate(tables), key=lambda it: (-it[1][0], it[0])):
        load, r = heapq.heappop(shards)
        heapq.heappush(shards, (load + lo, r))
        owners[name] = r
    return owners


# ---- collectives ----------------------------------------------------------------------------------
def _hsdp(layer: str) -> tuple[Collective, ...]:
    """FSDP over dense_shard (gather before forward and again before backward, reduce-scatter the
    gradients), then an all-reduce of the gradient shard over dense_replicate. (``placements``
    drops the backward gather when units are not resharded after forward.)"""
    return (Collective(f"{layer}.fsdp_ag.fwd", AG, CommGroup.DENSE_SHARD, Phase.FWD, Payload.PARAMS),
            Collective(f"{layer}.fsdp_ag.bwd", AG, CommGroup.DENSE_SHARD, Phase.BWD, Payload.PARAMS),
            Collective(f"{layer}.fsdp_rs", RS, CommGroup.DENSE_SHARD, Phase.BWD, Payload.GRADS),
            Collective(f"{layer}.grad_ar", AR, CommGroup.DENSE_REPLICATE, Phase.BWD, Payload.GRAD_SHARD))  # fmt: skip


def _experts(layer: str) -> tuple[Collective, ...]:
    """Expert parallelism: tokens all-to-all'd to their experts' ranks after the router and back
    after the experts (backward: before the up and the router ops), expert gradients all-reduced
    over the ranks holding the same experts."""
    def a2a(what: str, phase: Phase, at: str) -> Collective:
        return Collective(f"{layer}.moe_{what}.{phase}", A2A, CommGroup.EXPERT, phase, Payload.ROUTED_TOKENS, at)

    return (a2a("dispatch", Phase.FWD, "router"), a2a("combine", Phase.FWD, "experts_down"),
            a2a("dispatch", Phase.BWD, "experts_up"), a2a("combine", Phase.BWD, "router"),
            Collective(f"{layer}.expert_grad_ar", AR, CommGroup.EXPERT_REPLICATE, Phase.BWD, Payload.EXPERT_GRADS))  # fmt: skip


def _embeddings(s: Scenario) -> tuple[Collective, ...]:
    """2D embeddings: ids all-to-all'd inside sparse_shard for the next batch, outputs (and their
    gradients) all-to-all'd back; over sparse_replica the touched rows gathered before the lookups
    and their gradients reduce-scattered (``fully_sharded``), or the shard all-reduced every
    sparse_sync_interval steps (``replicated_sync``). With hot rows (``hot_rows``) their gradients
    are all-reduced over every rank (``sparse_world``) once per step, after the backward."""
    ss, sr = CommGroup.SPARSE_SHARD, CommGroup.SPARSE_REPLICA
    fully = s.parallelism.sparse_strategy == "fully_sharded"
    gather = (Collective("sparse.replica_ag", AG, sr, Phase.FWD, Payload.ROWS),) if fully else ()
    sync = (Collective("sparse.replica_rs", RS, sr, Phase.BWD, Payload.ROW_GRADS) if fully
            else Collective("sparse.replica_sync", AR, sr, Phase.BWD, Payload.TABLE_SHARD))  # fmt: skip
    hot = (Collective("sparse.hot_grad_ar", AR, CommGroup.SPARSE_WORLD, Phase.BWD, Payload.HOT_ROW_GRADS),) \
        if hot_rows(s) else ()  # fmt: skip
    return (Collective("sparse.input_dist", A2A, ss, Phase.DATA, Payload.IDS), *gather,
            Collective("sparse.output_dist.fwd", A2A, ss, Phase.FWD, Payload.EMB_OUTPUTS),
            Collective("sparse.output_dist.bwd", A2A, ss, Phase.BWD, Payload.EMB_GRADS), sync, *hot)  # fmt: skip


# ---- layers ------------------------------------------------------------------------------------------
_DENSE_AXES = dict(shard=(CommGroup.DENSE_SHARD,), replicate=(CommGroup.DENSE_REPLICATE,))


def _dense(layer: str, kind: LayerKind, *fqns: str) -> LayerPlacement:
    return LayerPlacement(layer, kind, (Params(ParamKind.DENSE, fqns, **_DENSE_AXES),), _hsdp(layer))


def _tables(s: Scenario, fqns: tuple[str, ...]) -> LayerPlacement:
    fully = s.parallelism.sparse_strategy == "fully_sharded"
    sr = (CommGroup.SPARSE_REPLICA,)
    axes = dict(shard=(CommGroup.SPARSE_SHARD, *sr), replicate=()) if fully else \
        dict(shard=(CommGroup.SPARSE_SHARD,), replicate=sr)  # fmt: skip
    params = (Params(ParamKind.SPARSE, fqns, **axes),)
    if hot_rows(s):  # the cold rows as above (first: what shards the tables), the hot ones on every rank
        params = (Params(ParamKind.SPARSE, fqns, **axes, rows="cold"),
                  Params(ParamKind.SPARSE, fqns, shard=(), replicate=(CommGroup.SPARSE_WORLD,), rows="hot"))
    return LayerPlacement("emb", LayerKind.EMBEDDINGS, params, _embeddings(s))


def _nonseq(m: GEMModel, i: int) -> LayerPlacement:
    dense = _dense(f"ns{i}", LayerKind.NONSEQUENCE, f"nonseq_layers.{i}")
    if not m.moe.num_experts:
        return dense
    experts = Params(ParamKind.EXPERT, (f"nonseq_layers.{i}.moe.experts",), shard=(CommGroup.EXPERT,),
                     replicate=(CommGroup.EXPERT_REPLICATE,))  # fmt: skip
    return LayerPlacement(dense.layer, dense.kind, (*dense.params, experts),
                          dense.collectives + _experts(dense.layer))  # fmt: skip


def _gem(s: Scenario, m: GEMModel) -> list[LayerPlacement]:
    e = m.embeddings
    tables = (("pooled.tables",) if e.pooled else ()) + tuple(f"groups.{g}.tables" for g in range(len(e.sequences)))
    out = [_tables(s, tables)] if tables else []
    out.append(_dense("bottom", LayerKind.BOTTOM, "bottom"))
    if any(f.dim != m.d_model for f in e.pooled):
        out.append(_dense("pooled_proj", LayerKind.POOLED_PROJ, "family_proj"))
    if e.sequences:
        out.append(_dense("seq_in", LayerKind.SEQ_IN, *(f"groups.{g}.proj" for g in range(len(e.sequences)))))
    out.append(_dense("compress", LayerKind.COMPRESS, "W_in"))
    after = cross_stages(m) if m.cross.num_layers else []
    for i in range(max(m.sequence.num_layers, m.nonseq.num_layers)):
        if i < m.sequence.num_layers:
            out.append(_dense(f"seq{i}", LayerKind.SEQUENCE, f"seq_layers.{i}"))
        if i < m.nonseq.num_layers:
            out.append(_nonseq(m, i))
        out += [_dense(f"cross{j}", LayerKind.CROSS, f"cross_layers.{j}") for j, at in enumerate(after) if at == i]
    out.append(_dense("head", LayerKind.HEAD, "top", "heads"))
    return out


def _dlrm(s: Scenario, m: DLRMModel) -> list[LayerPlacement]:
    out = [_tables(s, ("pooled.tables",))] if m.embeddings.pooled else []
    out.append(_dense("bottom", LayerKind.BOTTOM, "bottom"))
    if m.interaction == "dot":
        out.append(LayerPlacement("interaction", LayerKind.INTERACTION, (), ()))  # no parameters
    else:
        out += [_dense(f"dcn{i}", LayerKind.DCN, f"V.{i}", f"U.{i}") for i in range(m.dcn_layers)]
    out.append(_dense("top", LayerKind.TOP, "top"))
    out.append(_dense("head", LayerKind.HEAD, "heads"))
    return out


_PLACEMENTS: dict = {}  # scenarios.memo's table


def placements(s: Scenario) -> list[LayerPlacement]:
    """Every layer of ``s.model`` with its parameters' placement and its collectives. Without
    ``parallelism.fsdp_reshard_after_forward`` a unit keeps its gathered parameters from its
    forward to its backward: no backward all-gather. Once per model (by identity, kept alive with
    its entry) and what else they read: the sparse strategy, the resharding, the hot rows (a planner
    asks for thousands of layouts that share these)."""
    p = s.parallelism  # what the placements read besides the model (the group sizes are resolved later)
    key = (p.sparse_strategy, p.fsdp_reshard_after_forward, tuple(sorted(hot_rows(s).items())))
    return list(memo(_PLACEMENTS, (s.model,), key, lambda: _placements(s)))


def _placements(s: Scenario) -> list[LayerPlacement]:
    m = s.model
    layers = _dlrm(s, m) if isinstance(m, DLRMModel) else _gem(s, m)
    if s.parallelism.fsdp_reshard_after_forward:
        return layers
    return [replace(lp, collectives=tuple(c for c in lp.collectives
                                          if not (c.payload == Payload.PARAMS and c.phase == Phase.BWD)))
            for lp in layers]  # fmt: skip


def by_layer(s: Scenario) -> dict[str, LayerPlacement]:
    return {p.layer: p for p in placements(s)}


def format_placements(layers: list[LayerPlacement]) -> str:
    """One line per layer and per collective, for reading a plan."""
    lines = []
    for lp in layers:
        where = "; ".join(f"{p.kind}{f' ({p.rows} rows)' if p.rows else ''} {','.join(p.fqns)}"
                          f" shard {'×'.join(p.shard) or '-'} replicate {'×'.join(p.replicate) or '-'}"
                          for p in lp.params)  # fmt: skip
        lines.append(f"{lp.layer} ({lp.kind}): {where or 'no parameters'}")
        lines += [f"  {c.phase:4s} {c.kind:14s} {c.group:16s} {c.payload:13s} {c.name}"
                  + (f" (at {c.at})" if c.at else "") for c in lp.collectives]  # fmt: skip
    return "\n".join(lines)

