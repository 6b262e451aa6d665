"""Scenario → the op graph of one training step for one representative rank.

Compute ops come from ``twin.flops`` (forward in model order, backward in reverse) timed by the
roofline kernel model; collectives come from the parallel axes, timed by the alpha-beta model on
the network tier each axis's group spans. The graph's dependencies encode what waits for what:

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

Not modelled yet (later issues): load imbalance between ranks, memory, bandwidth shared by
concurrent flows, grad-accumulation-aware FSDP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hwmodels.collectives import collective_cost
from hwmodels.calibration import Calibration
from hwmodels.gpus import GPUSpec, get_gpu
from hwmodels.kernels import DEFAULT_MODEL, KernelModel, kernel_cost
from hwmodels.network import NetworkPreset, get_network
from scenarios.schema import GEMModel, Scenario
from twin.execution_cost import Plan, execution_of
from twin.execution_cost import plan as execution_plan
from twin.execution_cost import price as execution_price
from twin.flops import ELEM_BYTES, OpCost, SeqStats, model_costs
from twin.graph import Op, OpGraph
from twin.imbalance import embedding_load_factor, moe_load_factor

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
        if calibration is None:
            return cls(gpu, net)
        calibration.check_applies(gpu.name)
        return cls(gpu, net, dict(calibration.scale), calibration.overhead_s,
                   dict(calibration.collective_scale), calibration.kernel_model())  # fmt: skip


# Device-mesh layout: each axis's group is ranks r, r+stride, ... (dense_shard, expert and
# sparse_shard innermost, so they stay inside a node when they fit).
def axis_group(s: Scenario, axis: str) -> tuple[int, int]:
    """(group size, stride) of a parallel axis."""
    p = s.parallelism
    return {
        "dense_shard": (p.dense_shard, 1),
        "dense_replicate": (p.dense_replicate, p.dense_shard),
        "expert": (p.expert, 1),
        "expert_replicate": (s.hardware.num_gpus // p.expert, p.expert),
        "sparse_shard": (p.sparse_shard, 1),
        "sparse_replica": (p.sparse_replica, p.sparse_shard),
    }[axis]


@dataclass
class _Builder:
    s: Scenario
    hw: Hardware
    ops: list[Op] = field(default_factory=list)
    tag: str = ""  # micro-batch prefix of op names when a step has several
    emb_factor: float = 1.0  # busiest embedding shard's lookups over the mean shard's
    moe_factor: float = 1.0  # busiest expert rank's routed tokens over the mean
    plan: Plan | None = None  # how the execution runs the ops (twin.execution_cost)
    host_s: float = 0.0  # the host's time to issue the ops so far (0 under CUDA graphs)

    def compute(self, c: OpCost, phase: str, deps=(), *, recompute=False) -> str:
        fwd = phase in ("fwd", "opt") or recompute
        flops, nbytes = (c.fwd_flops, c.fwd_bytes) if fwd else (c.bwd_flops, c.bwd_bytes)
        kind = _kernel_kind(c, fwd)
        if c.price:  # an op the execution rewrote: priced by twin.execution_cost, scaled as its class
            s = self.hw.scale
            dur = execution_price(c, fwd, kind, self.hw.gpu, self.hw.kernels) * s.get(kind, s.get(c.op_class, 1.0))
        else:
            dur = kernel_cost(
                kind=kind, flops=flops, bytes=nbytes, gpu=self.hw.gpu,
                dtype=c.dtype, scale=self.hw.scale, model=self.hw.kernels,
                segments=c.segments or 1.0,
            ).time_s  # fmt: skip
        if self.plan is not None:
            self.host_s += self.plan.host_s(c, fwd)
        if c.op_class == "embedding":  # the output all-to-all waits for the busiest shard
            dur *= self.emb_factor
        elif c.name.endswith(("experts_up", "experts_down")):  # the combine waits for the busiest
            dur *= self.moe_factor
        name = f"{self.tag}{c.name}.{'recompute' if recompute else phase}"
        return self._add(Op(name, COMPUTE, dur, tuple(deps), c.op_class, phase, c.layer,
                            0.0 if recompute else flops, nbytes,
                            kernel=c.kernel or c.op_class))  # fmt: skip

    def collective(self, name, kind, axis, msg_bytes, phase, layer="", deps=()) -> str | None:
        size, stride = axis_group(self.s, axis)
        if size <= 1 or msg_bytes <= 0:
            return None
        c = collective_cost(
            kind=kind, msg_bytes=msg_bytes, group_size=size, stride=stride,
            network=self.hw.network, sm_free=self.s.parallelism.sm_free_collectives,
            imbalance=self.moe_factor if axis == "expert" else 1.0,
        )  # fmt: skip
        dur = c.time_s * self.hw.collective_scale.get(f"{c.tiers[-1]}/{kind}", 1.0)
        return self._add(Op(name, f"comm.{axis}", dur, tuple(d for d in deps if d), kind, phase,
                            layer, 0.0, msg_bytes, axis, c.sms / self.hw.gpu.sms,
                            link=c.tiers[-1]))  # fmt: skip

    def _add(self, op: Op) -> str:
        self.ops.append(op)
        return op.name


def _kernel_kind(c: OpCost, fwd: bool) -> str:
    """The cost model's kernel kind: attention and embeddings have forward and backward curves."""
    if c.op_class in ("attention", "embedding"):
        return f"{c.kernel or c.op_class}.{'fwd' if fwd else 'bwd'}"
    return c.op_class


def _comm_bytes(s: Scenario) -> float:
    return ELEM_BYTES[s.precision.comm]


def _group_layers(costs: list[OpCost]) -> list[tuple[str, list[OpCost]]]:
    """Consecutive ops of one layer form an FSDP unit; embedding lookups go first, so that
    their output all-to-all overlaps the bottom MLP (as TorchRec's pipeline does)."""
    out: list[tuple[str, list[OpCost]]] = []
    lookups = [c for c in costs if c.op_class == "embedding"]
    for c in [c for c in costs if c.op_class != "embedding"]:
        if out and out[-1][0] == c.layer:
            out[-1][1].append(c)
        else:
            out.append((c.layer, [c]))
    return ([("emb", lookups)] if lookups else []) + out


def _expert_params(c: OpCost) -> bool:
    return c.name.endswith("experts_up")


def _dense_params(ops: list[OpCost]) -> int:
    return sum(c.params for c in ops if c.op_class != "embedding" and not _expert_params(c))


def build_graph(s: Scenario, hw: Hardware, seq: SeqStats | None = None) -> OpGraph:
    """The op graph of one optimizer step (all micro-batches) of a representative rank.

    ``seq``: that rank's sequence load (its sampled lengths); the expectation when None.
    """
    b = _Builder(s, hw, emb_factor=embedding_load_factor(s), moe_factor=moe_load_factor(s))
    costs = model_costs(s.model, batch=s.training.micro_batch, precision=s.precision, seq=seq)
    b.plan = execution_plan(s, costs, execution_of(s), gpu=hw.gpu.name)  # the scenario's execution
    layers = _group_layers(b.plan.costs)
    for mb in range(s.grad_accum):
        b.tag = f"mb{mb}." if s.grad_accum > 1 else ""
        _micro_batch(b, layers, b.tag, last=mb == s.grad_accum - 1)
    _optimizer(b, costs)
    if hw.overhead_s > 0:
        b._add(Op("host.overhead", COMPUTE, hw.overhead_s, (b.ops[-1].name,), "other", "opt"))
    return OpGraph(b.ops, host_s=b.host_s)


def _micro_batch(b: _Builder, layers, tag: str, last: bool) -> None:
    s = b.s
    emb_out = sum(c.fwd_bytes - c.lookups * c.row_bytes for _, ops in layers for c in ops
                  if c.op_class == "embedding")  # fmt: skip
    ids_bytes = 8.0 * sum(c.lookups for _, ops in layers for c in ops)
    b.collective(f"{tag}sparse.input_dist", "all_to_all", "sparse_shard", ids_bytes, "data")
    fwd_done = _forward(b, layers, tag, emb_out)
    _backward(b, layers, tag, fwd_done, emb_out, last)


def _forward(b: _Builder, layers, tag: str, emb_out: float) -> dict[str, str]:
    """Forward of every layer; returns each layer's last forward op."""
    s, p = b.s, b.s.parallelism
    cb = _comm_bytes(s)
    firsts: list[str] = []
    last_op: dict[str, str] = {}
    prev = None
    pending = None  # the embedding output all-to-all the first consumer must wait for
    for i, (layer, ops) in enumerate(layers):
        gather = None
        params = _dense_params(ops)
        if params:
            dep = firsts[i - 1 - p.fsdp_prefetch] if i - 1 - p.fsdp_prefetch >= 0 else None
            gather = b.collective(f"{tag}{layer}.fsdp_ag.fwd", "all_gather", "dense_shard",
                                  params * cb, "fwd", layer, deps=(dep,))  # fmt: skip
        elif layer == "emb" and p.sparse_strategy == "fully_sharded":
            # fully sharded 2D: the rows this batch touches are gathered from the replicas
            # before the lookups (and their gradients reduce-scattered after the backward)
            touched = sum(c.lookups * c.row_bytes for c in ops)
            gather = b.collective(f"{tag}sparse.replica_ag", "all_gather", "sparse_replica",
                                  touched, "fwd", "emb")  # fmt: skip
        first = None
        for c in ops:
            deps = [d for d in (prev, gather if first is None else None) if d]
            if pending and layer not in ("emb", "bottom"):
                deps.append(pending)
                pending = None
            prev = b.compute(c, "fwd", deps)
            first = first or prev
            prev = _moe_a2a(b, c, tag, "fwd", prev)
        firsts.append(first)
        last_op[layer] = prev
        if layer == "emb":
            pending = _embedding_output_dist(b, tag, prev, emb_out)
    return last_op


def _embedding_output_dist(b: _Builder, tag: str, after: str | None, emb_out: float):
    return b.collective(f"{tag}sparse.output_dist.fwd", "all_to_all", "sparse_shard", emb_out,
                        "fwd", "emb", deps=(after,))  # fmt: skip


def _moe_a2a(b: _Builder, c: OpCost, tag: str, phase: str, prev: str) -> str:
    """All-to-all dispatch before the experts and combine after them (expert parallelism)."""
    s = b.s
    if not isinstance(s.model, GEMModel) or not s.model.moe.num_experts:
        return prev
    tokens = s.training.micro_batch * s.model.nonseq.num_tokens * s.model.moe.top_k
    msg = tokens * s.model.d_model * _comm_bytes(s) * s.model.moe.capacity_factor
    where = "router" if phase == "fwd" else "experts_up"
    if c.name.endswith(where):
        return b.collective(f"{tag}{c.layer}.moe_dispatch.{phase}", "all_to_all", "expert", msg,
                            phase, c.layer, deps=(prev,)) or prev  # fmt: skip
    if c.name.endswith("experts_down" if phase == "fwd" else "router"):
        return b.collective(f"{tag}{c.layer}.moe_combine.{phase}", "all_to_all", "expert", msg,
                            phase, c.layer, deps=(prev,)) or prev  # fmt: skip
    return prev


def _backward(b: _Builder, layers, tag: str, fwd_done, emb_out: float, last: bool) -> None:
    """Backward in reverse layer order; FSDP re-gathers are prefetched like the forward's."""
    p, cb = b.s.parallelism, _comm_bytes(b.s)
    fwd_last = prev = next(reversed(fwd_done.values()))
    starts: list[str] = []  # first backward op of each layer, in backward order
    for j, (layer, ops) in enumerate(reversed(layers)):
        params = _dense_params(ops)
        n0, gather = len(b.ops), None
        if params:
            k = j - 1 - p.fsdp_prefetch
            gather = b.collective(f"{tag}{layer}.fsdp_ag.bwd", "all_gather", "dense_shard",
                                  params * cb, "bwd", layer,
                                  deps=(starts[k] if k >= 0 else fwd_last,))  # fmt: skip
        if layer == "emb":
            prev = b.collective(f"{tag}sparse.output_dist.bwd", "all_to_all", "sparse_shard",
                                emb_out, "bwd", "emb", deps=(prev,)) or prev  # fmt: skip
        prev = _recompute(b, ops, prev, gather)
        for c in reversed(ops):
            prev = _moe_a2a(b, c, tag, "bwd", prev)
            prev = b.compute(c, "bwd", [d for d in (prev, gather) if d])
            gather = None
        starts.append(next(o.name for o in b.ops[n0:] if o.stream == COMPUTE))
        if last:
            _layer_grad_sync(b, layer, ops, tag, prev)
    if last:
        _sparse_replica_sync(b, [c for _, ops in layers for c in ops], tag, prev)


def _layer_grad_sync(b: _Builder, layer: str, ops: list[OpCost], tag: str, after: str) -> None:
    """HSDP: reduce-scatter over dense_shard, then all-reduce of the shard over dense_replicate;
    expert weights: all-reduce over the ranks holding the same experts."""
    p, cb = b.s.parallelism, _comm_bytes(b.s)
    params = _dense_params(ops)
    if params:
        rs = b.collective(f"{tag}{layer}.fsdp_rs", "reduce_scatter", "dense_shard", params * cb,
                          "bwd", layer, deps=(after,))  # fmt: skip
        b.collective(f"{tag}{layer}.grad_ar", "all_reduce", "dense_replicate",
                     params / p.dense_shard * cb, "bwd", layer, deps=(rs or after,))  # fmt: skip
    experts = sum(c.params for c in ops if _expert_params(c)) / p.expert
    b.collective(f"{tag}{layer}.expert_grad_ar", "all_reduce", "expert_replicate", experts * cb,
                 "bwd", layer, deps=(after,))  # fmt: skip


def _recompute(b: _Builder, ops: list[OpCost], prev: str, gather) -> str:
    """Activation checkpointing: forward work redone before this layer's backward."""
    policy = b.s.parallelism.activation_checkpointing
    if policy == "none" or ops[0].layer in ("emb", "bottom", "head"):
        return prev
    redo = [c for c in ops if policy == "full" or recomputed_under_selective(c)]
    for c in redo:
        prev = b.compute(c, "bwd", [d for d in (prev, gather) if d], recompute=True)
    return prev


def recomputed_under_selective(c: OpCost) -> bool:
    """Selective checkpointing drops an attention op's output and recomputes the op in backward,
    except GDPA: its backward reads only q, k, v and dO (no output, no log-sum-exp), so there is
    nothing to recompute, and its output is kept for the output projection (as the executor's
    ``executor.attention.packed_self_attention`` does). The reference attention (its parts, priced
    by ``twin.execution_cost``) is recomputed whatever its kind: the executor checkpoints the call."""
    return c.op_class == "attention" and (c.kernel != "attention.gdpa" or bool(c.price))  # the reference: all


def _sparse_replica_sync(b: _Builder, all_ops: list[OpCost], tag: str, after: str) -> None:
    s, p = b.s, b.s.parallelism
    touched = sum(c.lookups * c.row_bytes for c in all_ops if c.op_class == "embedding")
    if p.sparse_strategy == "fully_sharded":
        b.collective(f"{tag}sparse.replica_rs", "reduce_scatter", "sparse_replica", touched,
                     "bwd", "emb", deps=(after,))  # fmt: skip
    else:
        shard = sum(c.sparse_params for c in all_ops) / p.sparse_shard
        per_step = shard * ELEM_BYTES[s.precision.embeddings] / p.sparse_sync_interval
        b.collective(f"{tag}sparse.replica_sync", "all_reduce", "sparse_replica", per_step,
                     "bwd", "emb", deps=(after,))  # fmt: skip


def _optimizer(b: _Builder, costs: list[OpCost]) -> None:
    """Adam(W) over this rank's dense shard: read p, g, m, v and write p, m, v in fp32 (28 bytes
    a parameter). A grad-norm clip (``training.grad_clip`` > 0, as ``clip_grad_norm_`` does it)
    first reads every gradient for the norm and then rewrites it scaled: 12 bytes more (the
    norm's all-reduce over the shards is a few bytes, left out)."""
    p = b.s.parallelism
    local = _dense_params(costs) / p.dense_shard
    local += sum(c.params for c in costs if _expert_params(c)) / p.expert
    per_param = 28.0 + (12.0 if b.s.training.grad_clip > 0 else 0.0)
    opt = OpCost("optimizer.dense", "optimizer", "optimizer", "fp32", fwd_bytes=per_param * local)
    # the step waits for every gradient collective (each stream's last op) and the last compute
    last_per_stream = {op.stream: op.name for op in b.ops if op.phase != "data"}
    prev = b.compute(opt, "opt", list(last_per_stream.values()))
    for c in b.plan.optimizer if b.plan else ():  # the sparse update where it is not fused (execution)
        prev = b.compute(c, "opt", [prev])
