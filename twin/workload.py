"""Scenario → the op graph of one training step for one representative rank.

Compute ops come from ``twin.flops`` (forward in model order, backward in reverse) timed by the
roofline kernel model; collectives come from each layer's placement (``scenarios.placement``:
kind, group, payload, declared once for the twin and the executor), timed by the alpha-beta
model on the tiers each group spans, as the rank's group lies on them (``build_graph(shapes=)``
from ``twin.topology``: misaligned splits, per-peer all-to-all, uplinks the axis's concurrent
groups congest; hwmodels/GROUPS.md). The graph's dependencies encode what waits for what:

- HSDP (``dense_shard`` > 1): each layer's parameters are all-gathered before its forward and
  again before its backward (FSDP re-shards after forward); the gather of layer i waits for the
  forward of layer i-1-prefetch to start; gradients reduce-scatter after each layer's backward;
  over ``dense_replicate`` the gradient shards are all-reduced once per step.
- Expert parallelism (``expert`` > 1): an all-to-all dispatch and combine around every MoE
  layer's experts, forward and backward, with the capacity factor's padding; the busiest
  expert rank's routed tokens (``twin.imbalance.moe_load_factor``) stretch the experts' compute
  and the all-to-all (all-to-allv's slowest rank).
- 2D embeddings: ids are all-to-all'd inside ``sparse_shard`` for the *next* batch while this one
  computes (pipelined, TorchRec-style: off the critical path); pooled and sequence embeddings
  (forward) and their gradients (backward) are all-to-all'd inside ``sparse_shard``; over
  ``sparse_replica`` the rows a batch touches are all-gathered before the lookups and their
  gradients reduce-scattered after the backward, every step (``fully_sharded``) or the whole shard is all-reduced every N steps (``replicated_sync``,
  charged 1/N per step). Table sharding sets each shard's lookup load: the busiest shard's
  lookups (``twin.imbalance.embedding_load_factor``) set every rank's lookup time, since the
  output all-to-all waits for it.
- Hot rows (``TableFamily.hot_rows``, HugeCTR's hybrid embedding: ``scenarios.placement.hot_rows``):
  every rank holds a table's hottest rows whole and looks up the ids that hit them (a share ``h``
  of the lookups, ``twin.imbalance.hot_splits``) from its own batch, balanced; only the cold ids
  and lookups go through the above: the ids all-to-all carries the cold ids, the outputs
  all-to-all (and its backward) the bags with at least one cold id, the replica exchange the cold
  rows, the replica sync the cold shard, and the busiest shard is busiest in cold lookups. The hot
  rows' gradients (``hot_rows × dim`` per table, in ``precision.comm``) are all-reduced over every
  rank (``sparse_world``) once per step after the backward, as dense gradients are.

- Execution (``scenarios.execution``: kernels, compile, CUDA graphs, the sparse update): where the
  scenario's resolved execution differs from what the kernel curves describe, ``twin.execution_cost``
  rewrites or re-prices the ops and, without CUDA graphs, bounds the step by the host's time to issue
  them (``OpGraph.host_s``).

- The batch: each micro-batch's inputs are copied to the GPU on the compute stream before it
  (``batch_upload_s``), as the executor does; nothing on the CPU entries.

Load imbalance between ranks is ``twin.imbalance``'s (rank classes), memory ``twin.memory``'s.
Not modelled yet: grad-accumulation-aware FSDP, an upload overlapped with the previous step,
bandwidth shared between the concurrent collectives of different axes on different ranks
(the groups of one axis share an oversubscribed uplink through ``hwmodels.groups``' congestion;
one rank's concurrent collectives share a link in ``twin.engine``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hwmodels.collectives import collective_cost
from hwmodels.groups import GroupShape
from hwmodels.calibration import Calibration
from hwmodels.gpus import GPUSpec, get_gpu, is_cpu
from hwmodels.storage import host_copy_Bps
from hwmodels.kernels import DEFAULT_MODEL, KernelModel, kernel_cost
from hwmodels.network import NetworkPreset, get_network
from kernels.fp8block.table import check_gpu as check_fp8_block_gpu
from kernels.fp8block.table import ratio as fp8_block_ratio
from scenarios.placement import GATHERED, REDUCED, Collective, LayerPlacement, Payload, axis_group, by_layer
from scenarios.cost import Cost
from scenarios.placement import dispatch_bytes
from scenarios.memo import memo
from scenarios.schema import Scenario
from scenarios.vocab import AttentionKind, CommGroup, Direction, OpClass, Phase, kernel_kind
from twin.execution_cost import Plan, fused_lookups
from twin.execution_cost import plan as execution_plan
from twin.flops import ELEM_BYTES, OpCost, SeqStats, model_costs
from twin.graph import Op, OpGraph
from twin.imbalance import HotSplit, embedding_load_factor, hot_splits, moe_load_factor

COMPUTE = "compute"


@dataclass(frozen=True)
class Hardware:
    """The narrow hardware view the workload needs, resolved once per scenario."""

    gpu: GPUSpec
    network: NetworkPreset
    scale: dict[str, float] = field(default_factory=dict)  # calibration: time multiplier/class
    overhead_s: float = 0.0  # calibration: per-step time outside modelled kernels
    collective_scale: dict[str, float] = field(default_factory=dict)  # "tier/kind" -> multiplier
    kernels: KernelModel = DEFAULT_MODEL  # efficiency curves (a calibration may override some)
    collective_ab: dict[str, dict[str, float]] = field(default_factory=dict)  # "tier/kind" -> alpha_s, beta_Bps
    gap_fraction: float = 0.0  # calibration: idle between kernels per second of compute-stream kernels
    sm_contention: float = 1.0  # calibration: multiplier on each collective's SM share

    @property
    def key(self) -> tuple:
        """What a compute op's duration depends on here (``_DURATIONS``): the GPU and kernel model
        objects (kept alive while cached, so their ids stay theirs) and the calibration's scales."""
        _ALIVE.setdefault(id(self.gpu), self.gpu)
        _ALIVE.setdefault(id(self.kernels), self.kernels)
        return id(self.gpu), id(self.kernels), tuple(sorted(self.scale.items()))

    @classmethod
    def of(cls, scenario: Scenario, calibration: Calibration | None = None) -> Hardware:
        """The scenario's GPU and network, with a calibration's corrections when given."""
        hw = scenario.hardware
        try:
            gpu = get_gpu(hw.gpu)
        except ValueError as e:
            raise ValueError(f"hardware.gpu: {e}") from None
        try:
            net = get_network(hw.network)
        except ValueError as e:
            raise ValueError(f"hardware.network: {e}") from None
        if hw.num_gpus > net.max_gpus:
            raise ValueError(
                f"hardware.num_gpus ({hw.num_gpus}) exceeds network '{net.name}' "
                f"({net.max_gpus} GPUs); pick a larger preset"
            )
        check_dtypes(scenario, gpu)
        if calibration is None:
            return cls(gpu, net)
        calibration.check_applies(gpu.base or gpu.name)  # a probe profile of the CPU is still `cpu`
        return cls(gpu, net, dict(calibration.scale), calibration.overhead_s,
                   dict(calibration.collective_scale), calibration.kernel_model(),
                   dict(calibration.collective_alpha_beta), calibration.gap_fraction,
                   calibration.sm_contention)  # fmt: skip


def check_dtypes(scenario: Scenario, gpu: GPUSpec) -> None:
    """One-line ValueError when the scenario computes in, or divides MFU by, a dtype the GPU has no
    peak for: an A100 asked for MXFP8 (Ampere has no fp8 tensor cores), the CPU for fp8."""
    p, dtype = scenario.precision, scenario.hardware.mfu_peak_dtype
    if p.mlp in ("fp8_block", "auto"):
        check_fp8_block_gpu(gpu.name, "precision.mlp")
    mlp = "bf16" if p.mlp in ("fp8_block", "auto") else p.mlp  # priced as bf16 over the measured ratio
    wanted = (("precision.mlp", p.mlp, mlp), ("precision.attention", p.attention, p.attention),
              ("hardware.mfu_peak_dtype", dtype, "fp8" if dtype == "mxfp8" else dtype))  # MFU of mxfp8: fp8 peak
    for path, value, needs in wanted:
        if needs not in gpu.peak_flops:
            fix = "bf16" if "bf16" in gpu.peak_flops else next(iter(gpu.peak_flops))
            raise ValueError(f"{path} = {value!r}: GPU {gpu.name!r} has no {needs} peak (its dtypes: "
                             f"{', '.join(gpu.peak_flops)}); set {path}={fix}")


__all__ = ["COMPUTE", "Hardware", "axis_group", "build_graph", "check_dtypes", "host_issue_s", "lookup_seconds", "messages",
           "recomputed_under_selective", "table_sync_bytes", "upload_seconds"]


# Compute ops' durations by (op, direction, its execution rule, its table-batched share, hardware): a
# plan or a sweep builds thousands of graphs that share most ops, and a duration is a pure function of
# these (``Hardware.key``); a pure cache, cleared when it grows past its cap.
_DURATIONS: dict[tuple, tuple[OpCost, float]] = {}
_DURATIONS_MAX = 200_000
_ALIVE: dict[int, object] = {}  # the objects whose ids are in _DURATIONS' keys


@dataclass
class _Builder:
    s: Scenario
    hw: Hardware
    ops: list[Op] = field(default_factory=list)
    tag: str = ""  # micro-batch prefix of op names when a step has several
    emb_factor: float = 1.0  # busiest embedding shard's lookups over the mean shard's
    moe_factor: float = 1.0  # busiest expert rank's routed tokens over the mean
    place: dict[str, LayerPlacement] = field(default_factory=dict)  # scenarios.placement, by layer
    at_ops: dict[tuple[str, str], list[Collective]] = field(default_factory=dict)  # (op, phase) -> next to it
    plan: Plan | None = None  # how the scenario's execution runs the ops (twin.execution_cost)
    lookups: dict[str, tuple[float, float]] = field(default_factory=dict)  # fused lookups' (fwd, bwd) s
    host_s: float = 0.0  # the host's time to issue the ops so far (0 under CUDA graphs)
    shapes: Mapping[str, GroupShape] | None = None  # this rank's group per axis (twin.topology)
    hw_key: tuple | None = None  # Hardware.key, once per build
    payloads: dict[tuple, float] = field(default_factory=dict)  # issue(): (payload, layer, ops) -> bytes

    def compute(self, c: OpCost, phase: str, deps=(), *, recompute=False) -> str:
        fwd = phase in ("fwd", "opt") or recompute
        flops, nbytes = (c.fwd_flops, c.fwd_bytes) if fwd else (c.bwd_flops, c.bwd_bytes)
        dur = self._priced(c, fwd, flops, nbytes)
        if self.plan is not None and self.plan.host_per_op_s:
            self.host_s += self.plan.host_s(c, Direction.FWD if fwd else Direction.BWD)
        if c.op_class == "embedding":  # the output all-to-all waits for the busiest shard
            dur *= self.emb_factor
        elif c.name.endswith(("experts_up", "experts_down")):  # the combine waits for the busiest
            dur *= self.moe_factor
        name = f"{self.tag}{c.name}.{'recompute' if recompute else phase}"
        return self._add(Op(name, COMPUTE, dur, tuple(deps), c.op_class, phase, c.layer,
                            0.0 if recompute else flops, nbytes,
                            kernel=c.kernel or c.op_class))  # fmt: skip

    def _priced(self, c: OpCost, fwd: bool, flops: float, nbytes: float) -> float:
        """``_duration_s``, memoized (``_DURATIONS``)."""
        rule = self.plan.pricing.get(c.name) if self.plan else None
        if self.hw_key is None:
            self.hw_key = self.hw.key
        memo = (id(c), fwd, rule, self.lookups.get(c.name), self.hw_key)  # by identity: hashing an OpCost is slow
        hit = _DURATIONS.get(memo)
        if hit is not None and hit[0] is c:
            dur = hit[1]
        else:
            dur = self._duration_s(c, fwd, flops, nbytes, rule)
            if len(_DURATIONS) > _DURATIONS_MAX:
                _DURATIONS.clear()  # (_ALIVE stays: a handful of objects)
            _DURATIONS[memo] = (c, dur)  # the op kept alive with its entry, so its id stays its own
        return dur

    def _duration_s(self, c: OpCost, fwd: bool, flops: float, nbytes: float, rule) -> float:
        """One call of ``c`` (forward or backward) on this hardware, before the load factors."""
        d = Direction.FWD if fwd else Direction.BWD
        kind = _kernel_kind(c, fwd)
        dur = rule.time_s(c, d, kind, self.hw.gpu, self.hw.kernels) if rule is not None else None
        if dur is None and c.name in self.lookups:  # its share of a table-batched call
            dur = self.lookups[c.name][0 if fwd else 1]
        if dur is not None:  # an op the execution rewrote (twin.execution_cost), scaled as its kind or class
            return dur * self.hw.scale.get(kind, self.hw.scale.get(c.op_class, 1.0))
        if c.dtype == "fp8_block":  # its bf16 time over the measured fp8 / bf16 ratio of its shape
            return kernel_cost(
                kind=kind, flops=flops, bytes=nbytes * ELEM_BYTES["bf16"] / ELEM_BYTES["fp8_block"], gpu=self.hw.gpu,
                dtype="bf16", scale=self.hw.scale, model=self.hw.kernels,
            ).time_s / fp8_block_ratio(*c.mkn)  # fmt: skip
        return kernel_cost(
            kind=kind, flops=flops, bytes=nbytes, gpu=self.hw.gpu,
            dtype=c.dtype, scale=self.hw.scale, model=self.hw.kernels,
            segments=c.segments or 1.0,
        ).time_s  # fmt: skip

    def collective(self, name, kind, axis, msg_bytes, phase, layer="", deps=()) -> str | None:
        size, stride = axis_group(self.s, axis)
        if size <= 1 or msg_bytes <= 0:
            return None
        c = collective_cost(
            kind=kind, msg_bytes=msg_bytes, group_size=size, stride=stride,
            network=self.hw.network, sm_free=self.s.parallelism.sm_free_collectives,
            imbalance=self.moe_factor if axis == CommGroup.EXPERT else 1.0,
            shape=self.shapes.get(axis) if self.shapes else None,
        )  # fmt: skip
        key = f"{c.tiers[-1]}/{kind}"
        ab = self.hw.collective_ab.get(key)  # fitted on measured collectives: alpha + bytes / beta
        dur = ab["alpha_s"] + msg_bytes / ab["beta_Bps"] if ab else c.time_s * self.hw.collective_scale.get(key, 1.0)
        return self._add(Op(name, f"comm.{axis}", dur, tuple(d for d in deps if d), kind, phase,
                            layer, 0.0, msg_bytes, axis, min(1.0, self.hw.sm_contention * c.sms / self.hw.gpu.sms),
                            link=c.tiers[-1]))  # fmt: skip

    def issue(self, c: Collective, layer: str, ops: list[OpCost], deps=()) -> str | None:
        """A collective of the layer's placement, its payload's bytes from the layer's ops (once per
        layer and payload in a build: every micro-batch issues the same)."""
        key = (c.payload, layer, id(ops))
        nbytes = self.payloads.get(key)
        if nbytes is None:
            nbytes = self.payloads[key] = _payload_bytes(self.s, c.payload, ops)
        return self.collective(f"{self.tag}{c.name}", c.kind, c.group, nbytes,
                               c.phase, "" if c.phase == Phase.DATA else layer, deps)  # fmt: skip

    def _add(self, op: Op) -> str:
        self.ops.append(op)
        return op.name


def _kernel_kind(c: OpCost, fwd: bool) -> str:
    """The cost model's kernel kind: attention and embeddings have forward and backward curves."""
    return kernel_kind(c.op_class, attention=c.attention, direction="fwd" if fwd else "bwd")


def _comm_bytes(s: Scenario) -> float:
    return ELEM_BYTES[s.precision.comm]


_BY_LIST: dict[tuple[int, str], tuple[list, object]] = {}  # _once's: (id(xs), what) -> (xs, f(xs))
_BY_LIST_MAX = 100_000


def _once(what: str, xs: list, f):
    """``f(xs)`` once per list object: op lists are built once per micro-batch size and read by
    every layout a plan or sweep tries. ``scenarios.memo``'s rule, inlined for speed (a planner
    asks millions of times): keyed by identity, the list kept alive with its entry."""
    k = (id(xs), what)
    hit = _BY_LIST.get(k)
    if hit is None:
        if len(_BY_LIST) > _BY_LIST_MAX:
            _BY_LIST.clear()
        hit = _BY_LIST[k] = (xs, f(xs))
    return hit[1]


_LAYERS: dict[tuple, tuple[tuple, list]] = {}  # _group_layers': ids of the ops -> (the ops, their layers)


def _group_layers(costs: list[OpCost]) -> list[tuple[str, list[OpCost]]]:
    """Consecutive ops of one layer form an FSDP unit; embedding lookups go first, so that
    their output all-to-all overlaps the bottom MLP (as TorchRec's pipeline does). The same
    list for the same ops, by identity and in order, whatever list holds them (an execution plan
    copies the op list it runs, once per layout: the layers' lists, and what ``_once`` keeps of
    them, are then shared too): do not change it."""
    k = tuple(map(id, costs))
    hit = _LAYERS.get(k)
    if hit is None:  # (the entry keeps the ops alive: no other op can take their ids)
        if len(_LAYERS) > 4096:
            _LAYERS.clear()
        hit = _LAYERS[k] = (tuple(costs), _layers_of(costs))
    return hit[1]


def _layers_of(costs: list[OpCost]) -> list[tuple[str, list[OpCost]]]:
    out: list[tuple[str, list[OpCost]]] = []
    lookups = [c for c in costs if c.op_class == OpClass.EMBEDDING]
    for c in [c for c in costs if c.op_class != OpClass.EMBEDDING]:
        if out and out[-1][0] == c.layer:
            out[-1][1].append(c)
        else:
            out.append((c.layer, [c]))
    return ([("emb", lookups)] if lookups else []) + out


def _executed(s: Scenario, hw: Hardware) -> tuple[list[OpCost], Plan]:
    """One micro-batch's ops and how the scenario's execution runs them, as ``build_graph`` sets
    them up (for the graph-free views below)."""
    costs = model_costs(s.model, batch=s.training.micro_batch, precision=s.precision)
    return costs, execution_plan(s, costs, gpu=hw.gpu.name)


def lookup_seconds(s: Scenario, hw: Hardware) -> dict[str, tuple[float, float]]:
    """Each embedding lookup op's (forward, backward) seconds as ``build_graph`` prices them for
    ``s`` (its table-batched share, times the load factor), without building the graph: the
    planner's bounds (``twin.plan_bounds``) price a layout's lookups with it."""
    emb_factor, _ = _load_factors(s)
    b = _Builder(s, hw, emb_factor=emb_factor)
    b.plan = _executed(s, hw)[1]
    b.lookups = fused_lookups(s, b.plan.costs, hw.gpu)
    return {c.name: (b._priced(c, True, c.fwd_flops, c.fwd_bytes) * emb_factor,
                     b._priced(c, False, c.bwd_flops, c.bwd_bytes) * emb_factor)
            for c in b.plan.costs if c.op_class == OpClass.EMBEDDING}  # fmt: skip


def host_issue_s(s: Scenario, hw: Hardware) -> tuple[float, float]:
    """The host's time to issue ``s``'s calls as ``build_graph`` counts it (``OpGraph.host_s``):
    (each micro-batch's forward, recomputation and backward; the optimizer step's, once a step).
    A step of ``k`` micro-batches takes the host ``k`` times the first plus the second (both 0
    under CUDA graphs)."""
    costs, plan = _executed(s, hw)
    if not plan.host_per_op_s:
        return 0.0, 0.0
    redo = [c for _, ops in _group_layers(plan.costs) for c in _redone(s, plan, ops)]
    per_mb = sum(plan.host_s(c, Direction.FWD) + plan.host_s(c, Direction.BWD) for c in plan.costs)
    per_mb += sum(plan.host_s(c, Direction.FWD) for c in redo)
    return per_mb, sum(plan.host_s(c, Direction.FWD) for c in (dense_optimizer(s, costs), *plan.optimizer))


@dataclass(frozen=True, slots=True)
class Message:
    """One collective a step of a scenario issues (``messages``)."""

    layer: str
    axis: CommGroup
    kind: str
    msg_bytes: float
    every_micro_batch: bool  # else once a step, after the layer's last backward (a gradient reduction)
    data: bool = False  # the next micro-batch's inputs (the step's optimizer does not wait for it)
    # a gradient shard's all-reduce (``Payload.GRAD_SHARD``): the layer's dense parameters, of which
    # it carries 1 / dense_shard (``at_dense_shard`` re-sizes it); 0 for every other message
    dense_params: int = 0


def messages(s: Scenario, hw: Hardware) -> list[Message]:
    """The collectives ``build_graph`` issues for ``s``, without building the graph: the
    placement's collectives of each layer (``scenarios.placement.by_layer``) by the builder's
    rules (the next batch's ids, the gathers before a layer's forward and backward, the
    embeddings' exchanges and the ops placed next to an op: every micro-batch; gradient
    reductions: once a step), on a group of more than one rank with a message of more than 0
    bytes, each with its message as ``issue`` sizes it. The planner's bounds sum each axis's
    stream from it (``twin.plan_bounds``); a test holds it to the graph."""
    plan = _executed(s, hw)[1]
    place = by_layer(s)
    out = []
    sizes: dict = {}
    for layer, ops in _group_layers(plan.costs):
        names = {c.name for c in ops}
        for c in place[layer].collectives:
            if c.at:
                every = f"{layer}.{c.at}" in names and c.phase in (Phase.FWD, Phase.BWD)
                if not every:
                    continue
            elif c.phase == Phase.DATA or (c.phase in (Phase.FWD, Phase.BWD) and c.payload in GATHERED) or (
                    c.phase in (Phase.FWD, Phase.BWD) and c.payload in (Payload.EMB_OUTPUTS, Payload.EMB_GRADS)):
                every = True
            elif c.phase == Phase.BWD and c.payload in REDUCED:
                every = False
            else:
                continue
            if c.group not in sizes:
                sizes[c.group] = axis_group(s, c.group)[0]
            if sizes[c.group] <= 1:
                continue
            nbytes = _payload_bytes(s, c.payload, ops)
            if nbytes > 0:
                dp = _dense_params(ops) if c.payload is Payload.GRAD_SHARD else 0
                out.append(Message(layer, c.group, c.kind, nbytes, every, c.phase == Phase.DATA, dp))
    return out


def at_dense_shard(msgs: list[Message], s: Scenario) -> list[Message]:
    """``messages`` of a layout that differs from ``s`` in ``dense_shard`` alone, as ``messages(s)``
    lists them, provided both layouts have groups of more than one rank on the same dense axes
    (``dense_shard`` and ``dense_replicate``: which of their collectives run at all). The rest of a
    step's messages do not read ``dense_shard``; the gradient shard's all-reduce carries
    1 / ``dense_shard`` of its layer's gradients, re-sized here as ``_payload_bytes`` sizes it (a
    planner prices a key's many ``dense_shard`` variants from one list; a test holds it to
    ``messages``)."""
    ds, cb = s.parallelism.dense_shard, _comm_bytes(s)
    return [Message(m.layer, m.axis, m.kind, _grad_shard_bytes(m.dense_params, ds, cb), m.every_micro_batch,
                    m.data, m.dense_params) if m.dense_params else m for m in msgs]  # fmt: skip


def upload_seconds(s: Scenario, hw: Hardware) -> float:
    """``build_graph``'s copy of one micro-batch to the GPU (``batch_upload_s``): the compute
    stream's first op of each micro-batch."""
    return batch_upload_s(s, _executed(s, hw)[1].costs, hw.gpu)


def table_sync_bytes(s: Scenario, costs: list[OpCost]) -> float:
    """Bytes of ``replicated_sync``'s all-reduce of the rank's table shard, as a step issues it
    (its share of the sync every ``sparse_sync_interval`` steps), from one micro-batch's ops."""
    return _payload_bytes(s, Payload.TABLE_SHARD, [c for c in costs if c.op_class == OpClass.EMBEDDING])


def _expert_params(c: OpCost) -> bool:
    return c.name.endswith("experts_up")


def _expert_param_count(ops: list[OpCost]) -> int:
    """Parameters of the experts among ``ops`` (once per list)."""
    return _once("experts", ops, lambda xs: sum(c.params for c in xs if _expert_params(c)))


def _embedding_ops(ops: list[OpCost]) -> list[OpCost]:
    """The embedding lookups among ``ops`` (once per list; do not change it)."""
    return _once("emb", ops, lambda xs: [c for c in xs if c.op_class == OpClass.EMBEDDING])


def _dense_params(ops: list[OpCost]) -> int:
    return _once("dense", ops, lambda xs: sum(c.params for c in xs if c.op_class != OpClass.EMBEDDING
                                              and not _expert_params(c)))


def build_graph(s: Scenario, hw: Hardware, seq: SeqStats | None = None,
                shapes: Mapping[str, GroupShape] | None = None) -> OpGraph:
    """The op graph of one optimizer step (all micro-batches) of a representative rank.

    ``seq``: that rank's sequence load (its sampled lengths); the expectation when None.
    ``shapes``: how this rank's groups lie on the fabric, per axis (``twin.topology``); an axis
    without one is priced as rank 0's group with every uplink full (``hwmodels.groups.rank0_shape``).
    """
    emb_factor, moe_factor = _load_factors(s)
    b = _Builder(s, hw, emb_factor=emb_factor, moe_factor=moe_factor, place=by_layer(s), shapes=shapes)
    for lp in b.place.values():
        for c in lp.collectives:
            if c.at:
                b.at_ops.setdefault((f"{lp.layer}.{c.at}", c.phase), []).append(c)
    costs = model_costs(s.model, batch=s.training.micro_batch, precision=s.precision, seq=seq)
    b.plan = execution_plan(s, costs, gpu=hw.gpu.name)  # as the scenario's execution runs them
    b.lookups = fused_lookups(s, b.plan.costs, hw.gpu)  # table-batched calls, where the family has a model
    layers = _group_layers(b.plan.costs)
    upload = batch_upload_s(s, b.plan.costs, hw.gpu)
    for mb in range(s.grad_accum):
        b.tag = f"mb{mb}." if s.grad_accum > 1 else ""
        if upload:
            b._add(Op(f"{b.tag}data.h2d", COMPUTE, upload, (b.ops[-1].name,) if b.ops else (), OpClass.OTHER,
                      Phase.DATA, "", 0.0, batch_bytes(s, b.plan.costs), kernel="data.h2d"))  # fmt: skip
        _micro_batch(b, layers, last=mb == s.grad_accum - 1)
    _optimizer(b, costs)
    gaps = hw.gap_fraction * sum(op.duration_s for op in b.ops if op.stream == COMPUTE)
    if hw.overhead_s + gaps > 0:
        b._add(Op("host.overhead", COMPUTE, hw.overhead_s + gaps, (b.ops[-1].name,), "other", "opt"))
    return OpGraph(b.ops, host_s=b.host_s)


_FACTORS: dict = {}  # scenarios.memo's tables
_EMB_FACTORS: dict = {}


def _load_factors(s: Scenario) -> tuple[float, float]:
    """``embedding_load_factor`` and ``moe_load_factor`` of ``s``, once per model and layout: every
    rank class builds a graph of the same scenario, a plan thousands of layouts of one model, and the
    table placement costs ~0.3 s at 100k GPUs. The embedding factor is keyed by what it reads (the
    model, ``sparse_shard``, ``table_sharding``, the seed, and whether there is more than one GPU:
    ``twin.imbalance.embedding_load_factor``), so a plan's many micro-batches and experts at one
    ``sparse_shard`` share it; the MoE factor by the model, the layout, the batch and the seed (the
    sections other than ``execution``, which it does not read and which is unhashable), without
    ``dense_shard`` and ``dense_replicate``, which place dense parameters only. The model is keyed
    by identity and kept alive with its entry."""
    p = s.parallelism
    sharding = p.table_sharding if isinstance(p.table_sharding, str) else tuple(sorted(p.table_sharding.items()))
    emb = memo(_EMB_FACTORS, (s.model,), (p.sparse_shard, sharding, s.training.seed, s.hardware.num_gpus > 1),
               lambda: embedding_load_factor(s))  # fmt: skip
    rest = tuple(kv for kv in p if kv[0] not in ("dense_shard", "dense_replicate"))
    return emb, memo(_FACTORS, (s.model,), (s.hardware, rest, s.precision, s.training), lambda: moe_load_factor(s))


# The host's part of a step that CUDA graphs do not hide: the micro-batch is copied to the GPU
# (ids, offsets, dense features, labels: the executor's pinned host buffers into the graph's static
# inputs, on the compute stream before the step). A few copies each launched apart: their fixed
# cost is an assumption, one kernel launch each for ids, offsets, dense features and labels.
UPLOAD_FIXED_S = 4 * 5.0e-6


def batch_bytes(s: Scenario, costs: list[OpCost]) -> float:
    """Bytes of one micro-batch's inputs as the executor ships them: an int64 per id and per bag
    offset, fp32 dense features and labels."""
    emb = [c for c in costs if c.op_class == OpClass.EMBEDDING]
    B = s.training.micro_batch
    return 8.0 * sum(c.lookups + c.bags for c in emb) + 4.0 * B * (
        s.model.dense_features + len(s.model.tasks.names))


def batch_upload_s(s: Scenario, costs: list[OpCost], gpu) -> float:
    """Seconds to copy one micro-batch to the GPU over its host link (``hwmodels.storage.host_copy_Bps``,
    measured H2D on the H200: 0.25 ms for dlrm-dcnv2's 13.6 MB at 6,912 samples, as its trace
    shows); 0 on the CPU entries, where the batch is already in host memory."""
    if is_cpu(gpu.name):
        return 0.0
    return UPLOAD_FIXED_S + batch_bytes(s, costs) / host_copy_Bps(gpu.name)


def _payload_bytes(s: Scenario, payload: Payload, ops: list[OpCost]) -> float:
    """Bytes of one collective's message (``hwmodels.collectives``' msg_bytes) from the ops of its
    layer (``scenarios.placement.Payload`` says what each payload is). With hot rows the sparse
    ones carry the cold part only (``_cold``), and ``HOT_ROW_GRADS`` is the hot rows' gradients."""
    p, cb = s.parallelism, _comm_bytes(s)
    emb = _embedding_ops(ops)
    hot = hot_splits(s) if emb else {}
    match payload:
        case Payload.PARAMS | Payload.GRADS:
            return _dense_params(ops) * cb
        case Payload.GRAD_SHARD:
            return _grad_shard_bytes(_dense_params(ops), p.dense_shard, cb)
        case Payload.EXPERT_GRADS:
            return _expert_param_count(ops) / p.expert * cb
        case Payload.ROUTED_TOKENS:
            return dispatch_bytes(s.model, s.training.micro_batch, cb)
        case Payload.IDS:
            return 8.0 * sum(c.lookups * _cold(hot, c, "ids") for c in emb)
        case Payload.EMB_OUTPUTS | Payload.EMB_GRADS:  # bags x dim, in precision.comm (the executor's wire dtype)
            return sum(c.bags * c.row_bytes / ELEM_BYTES[c.dtype] * cb * _cold(hot, c, "bags") for c in emb)
        case Payload.ROWS | Payload.ROW_GRADS:
            return sum(c.lookups * c.row_bytes * _cold(hot, c, "ids") for c in emb)
        case Payload.TABLE_SHARD:
            shard = sum(c.sparse_params * _cold(hot, c, "rows") for c in emb) / p.sparse_shard
            return shard * ELEM_BYTES[s.precision.embeddings] / p.sparse_sync_interval
        case Payload.HOT_ROW_GRADS:
            return sum(c.sparse_params * _hot(hot, c, "rows") for c in emb) * cb
    raise ValueError(f"payload {payload!r} has no size rule")


def _grad_shard_bytes(dense_params: int, dense_shard: int, comm_bytes: float) -> float:
    """One ``dense_shard`` rank's share of a layer's gradients, in bytes (``Payload.GRAD_SHARD``)."""
    return dense_params / dense_shard * comm_bytes


def _hot(hot: dict[str, HotSplit], c: OpCost, share: str) -> float:
    """The part of a lookup op's ids, bags or rows (``share``) in its family's hot rows: 0 without
    hot rows (``twin.flops`` names the op after its family, last)."""
    split = hot.get(c.name.rsplit(".", 1)[-1])
    return getattr(split, share) if split is not None else 0.0


def _cold(hot: dict[str, HotSplit], c: OpCost, share: str) -> float:
    """The rest: 1 without hot rows."""
    return 1.0 - _hot(hot, c, share)


def _micro_batch(b: _Builder, layers, last: bool) -> None:
    for layer, ops in layers:  # the next micro-batch's inputs (the ids), while this one computes
        for c in b.place[layer].collectives:
            if c.phase == Phase.DATA:
                b.issue(c, layer, ops)
    fwd_done = _forward(b, layers)
    _backward(b, layers, fwd_done, last)


def _gather(b: _Builder, layer: str, ops: list[OpCost], phase: Phase, dep: str | None) -> str | None:
    """The weights a layer needs before its ``phase`` (FSDP units, replica rows), prefetched: the
    gather waits only for ``dep``, the start of the layer ``fsdp_prefetch`` + 1 before it."""
    gather = None
    for c in b.place[layer].collectives:
        if c.phase == phase and c.payload in GATHERED:
            gather = b.issue(c, layer, ops, deps=(dep,))
    return gather


def _boundary(b: _Builder, layer: str, ops: list[OpCost], phase: Phase, after: str | None) -> str | None:
    """Activations exchanged at the layer's boundary (the embeddings' output all-to-all): after
    the layer's forward, before its backward."""
    out = None
    for c in b.place[layer].collectives:
        if c.phase == phase and c.payload in (Payload.EMB_OUTPUTS, Payload.EMB_GRADS):
            out = b.issue(c, layer, ops, deps=(after,))
    return out


def _next_to(b: _Builder, c: OpCost, phase: Phase, ops: list[OpCost], prev: str) -> str:
    """Collectives placed ``at`` op ``c`` (the MoE all-to-alls): after its forward, before its
    backward, in line."""
    for col in b.at_ops.get((c.name, phase), ()):
        prev = b.issue(col, c.layer, ops, deps=(prev,)) or prev
    return prev


def _forward(b: _Builder, layers) -> dict[str, str]:
    """Forward of every layer; returns each layer's last forward op."""
    p = b.s.parallelism
    firsts: list[str] = []
    last_op: dict[str, str] = {}
    prev = None
    pending = None  # the embedding output all-to-all the first consumer must wait for
    for i, (layer, ops) in enumerate(layers):
        k = i - 1 - p.fsdp_prefetch
        gather = _gather(b, layer, ops, Phase.FWD, firsts[k] if k >= 0 else None)
        first = None
        for c in ops:
            deps = [d for d in (prev, gather if first is None else None) if d]
            if pending and layer not in ("emb", "bottom"):
                deps.append(pending)
                pending = None
            prev = b.compute(c, "fwd", deps)
            first = first or prev
            prev = _next_to(b, c, Phase.FWD, ops, prev)
        firsts.append(first)
        last_op[layer] = prev
        pending = _boundary(b, layer, ops, Phase.FWD, prev) or pending
    return last_op


def _backward(b: _Builder, layers, fwd_done, last: bool) -> None:
    """Backward in reverse layer order; FSDP re-gathers are prefetched like the forward's."""
    p = b.s.parallelism
    fwd_last = prev = next(reversed(fwd_done.values()))
    starts: list[str] = []  # first backward op of each layer, in backward order
    for j, (layer, ops) in enumerate(reversed(layers)):
        n0, k = len(b.ops), j - 1 - p.fsdp_prefetch
        gather = _gather(b, layer, ops, Phase.BWD, starts[k] if k >= 0 else fwd_last)
        prev = _boundary(b, layer, ops, Phase.BWD, prev) or prev
        prev = _recompute(b, ops, prev, gather)
        for c in reversed(ops):
            prev = _next_to(b, c, Phase.BWD, ops, prev)
            prev = b.compute(c, "bwd", [d for d in (prev, gather) if d])
            gather = None
        starts.append(next(o.name for o in b.ops[n0:] if o.stream == COMPUTE))
        if last:
            _grad_sync(b, layer, ops, prev)


def _grad_sync(b: _Builder, layer: str, ops: list[OpCost], after: str) -> None:
    """Once per step, after the layer's last backward: its gradient collectives (HSDP's
    reduce-scatter, then the shard's all-reduce, which waits for it; the experts' all-reduce;
    the embedding replicas' reduce-scatter or periodic sync)."""
    rs = None
    for c in b.place[layer].collectives:
        if c.phase == Phase.BWD and c.payload in REDUCED:
            dep = rs if c.payload is Payload.GRAD_SHARD and rs else after
            op = b.issue(c, layer, ops, deps=(dep,))
            if c.payload is Payload.GRADS:
                rs = op


def _recompute(b: _Builder, ops: list[OpCost], prev: str, gather) -> str:
    """Activation checkpointing: forward work redone before this layer's backward."""
    for c in _redone(b.s, b.plan, ops):
        prev = b.compute(c, "bwd", [d for d in (prev, gather) if d], recompute=True)
    return prev


def _redone(s: Scenario, plan: Plan | None, ops: list[OpCost]) -> list[OpCost]:
    """The ops of one layer (``ops``) that activation checkpointing runs again in the backward."""
    policy = s.parallelism.activation_checkpointing
    if policy == "none" or not ops or ops[0].layer in ("emb", "bottom", "head"):
        return []
    whole = plan.recomputed if plan else set()  # the reference attention: checkpointed whole
    return [c for c in ops if policy == "full" or recomputed_under_selective(c) or c.name in whole]


def recomputed_under_selective(c: OpCost) -> bool:
    """Selective checkpointing drops an attention op's output and recomputes the op in backward,
    except GDPA: its backward reads only q, k, v and dO (no output, no log-sum-exp), so there is
    nothing to recompute, and its output is kept for the output projection (as the executor's
    ``executor.attention.packed_self_attention`` does)."""
    return c.op_class == OpClass.ATTENTION and c.attention is not AttentionKind.GDPA


def dense_optimizer(s: Scenario, costs: list[OpCost]) -> OpCost:
    """The dense optimizer step's op (``_optimizer``): this rank's dense and expert parameter shards."""
    p = s.parallelism
    local = _dense_params(costs) / p.dense_shard
    local += _expert_param_count(costs) / p.expert
    per_param = 28.0 + (12.0 if s.training.grad_clip > 0 else 0.0)
    return OpCost("optimizer.dense", "optimizer", OpClass.OPTIMIZER, "fp32", Cost(fwd_bytes=per_param * local))


def optimizer_s(s: Scenario, hw: Hardware, costs: list[OpCost]) -> float:
    """Seconds of the dense optimizer step as ``build_graph`` prices it."""
    opt = dense_optimizer(s, costs)
    rule = execution_plan(s, costs, gpu=hw.gpu.name).pricing.get(opt.name)
    return _Builder(s, hw)._duration_s(opt, True, opt.fwd_flops, opt.fwd_bytes, rule)


def _optimizer(b: _Builder, costs: list[OpCost]) -> None:
    """Adam(W) over this rank's dense shard: read p, g, m, v and write p, m, v in fp32 (28 bytes
    a parameter). A grad-norm clip (``training.grad_clip`` > 0, as ``clip_grad_norm_`` does it)
    first reads every gradient for the norm and then rewrites it scaled: 12 bytes more (the
    norm's all-reduce over the shards is a few bytes, left out)."""
    opt = dense_optimizer(b.s, costs)
    # the step waits for every gradient collective (each stream's last op) and the last compute
    last_per_stream = {op.stream: op.name for op in b.ops if op.phase != "data"}
    prev = b.compute(opt, "opt", list(last_per_stream.values()))
    for c in b.plan.optimizer if b.plan else ():  # the sparse update where it is not fused (execution)
        prev = b.compute(c, "opt", [prev])
