"""What the scenario's ``execution`` section costs: the twin prices the step the executor would run.

The kernel curves (``hwmodels/data/efficiency.yaml``) describe one way of running a step per device
(``BASELINE``): on CUDA the default executor (Triton attention and embedding kernels, the sequence
FFN's bias + GELU op, compiled dense blocks, CUDA graphs over 8192-id buckets, the sparse update
fused into the lookups' backward); on the ``cpu`` profile the CPU executor's path (the reference
attention, torch lookups, eager, no graphs). ``scenarios.execution.resolve(s, device_of(s))`` says
how this scenario runs; where that differs from the baseline, ``plan`` rewrites the step's ops from
how the executor runs the choice, with the measured numbers of ``hwmodels/data/execution.yaml``
(one entry per GPU family, each with its source):

- ``attention_kernel: reference`` (CUDA): each attention op becomes what the padded reference runs:
  its batched matmuls over the padded shapes (gemm compute against their bytes at the elementwise
  curve: 2 forward, 6 backward with the scores' recompute, 4 for cross attention), the weight passes
  over the G·H·n² padded scores, the gathers, copies and scatters of the padded rows, and the host
  round trip of each forward call. n is the longest sample of the micro-batch (its expectation under
  the length law). All of it is recomputed under ``selective`` checkpointing (the executor
  checkpoints the reference call, GDPA's too). MXFP8 attention under the reference runs a
  fake-quantized emulation of the padded reference: priced as the bf16 one, a lower bound.
  The cross attention is priced as the bench measured it (2026-12-02, and as every committed run
  ran it): its scores kept for backward, only the jagged side padded. The one-family reference
  (``kernels/attention/reference.py``, 65b4964) pads both sides and recomputes them in backward
  like self attention; that is not measured yet, so for today's code the cross part is a lower
  bound (re-run ``hwmodels/bench/execution_bench.py --only reference_attention`` and refit).
- ``ffn_kernel: torch``: the sequence FFN's activation takes Inductor's GELU time (measured ratios
  to the bias + GELU op the curves price). ``ffn_kernel: cublaslt`` (the tanh GELU in cuBLASLt's
  epilogues) is listed unpriced: its default form is not measured yet.
- ``flash.fused_short: false``: the Triton cross attention's backward in two kernels (measured ratio
  to the one-kernel backward, which the default runs).
- ``compile: false``: the norms run in fp32 under autocast (``layer_norm`` is on autocast's fp32 list),
  twice the bytes the curves price for the compiled bf16 norms, with a cast pass each side of every
  norm (to fp32 before it, back to bf16 for the next matmul: 12 bytes an element each way). From the
  curves alone, so priced on every CUDA family.
- ``embedding_kernel: torch``: one call per table (each at least the measured per-call time) and
  the row-wise Adagrad of every table in the optimizer step; ``fused_sparse_update: false`` with the
  Triton lookups: the same optimizer step over the TBE's gradients.
- ``cuda_graphs: false`` (CUDA): the host issues the step, so the step is at least the host's time:
  a measured effective cost per modelled op (and per table for the per-table lookups and updates),
  fitted on a compiled executor (s5-eager, gem-h200-1gpu's 303 ops; that the host's time grows with
  the ops, so with layers and micro-batches, is assumed); a DLRM's lighter ops have their own number
  (an eager dlrm-dcnv2 on the H200, ``host.per_op_s_by_model``). Eager blocks issue more kernels per op; that is not
  priced apart (s2: +4.7%, s3: +22% eager over compiled without graphs), so without graphs
  ``compile: false`` moves only the device's side, which the host's floor may hide.

Not priced, and listed as such in the result (``choices``): ``token_bucket`` other than 0 or the
default (the twin counts the real ids, never the padding), ``attention_in_graph: false`` (s14-sep
against s14: 60.5 vs 59.8 ms, within noise), ``max_autotune`` (s16: Inductor kept cuBLAS for every
GEMM, 5.826 vs 5.852 ms per FFN), ``data_processes`` and ``flash.block_local: false`` (not measured
apart), ``flash.tma: false`` (measured per kernel only: the Hopper attention curves were fitted to
the pointer-load kernels that ran before TMA loads became the default, c368281, so they price a TMA
run's attention at the pointer loads' time; on an H100 its step was 1.017x faster), any choice on a family ``execution.yaml`` has no measurement for (Hopper's bench numbers are
not another generation's), and any choice on the ``cpu`` profile other than its default. The memory
model (``twin.memory``) prices none of them (the reference's padded intermediates are recomputed, not
kept, under its checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np

from hwmodels._data import load_yaml
from hwmodels.gpus import GPUSpec, get_gpu
from hwmodels.kernels import ELEM_BYTES, KernelModel, family_name, memory_curve, tbe_curve
from scenarios.cost import Cost
from scenarios.distributions import expected_unique_ids
from scenarios.execution import DEFAULT_TOKEN_BUCKET, ResolvedExecution, device_of, resolve
from scenarios.placement import by_layer
from scenarios.schema import GEMModel, Scenario
from scenarios.vocab import AttentionKind, Direction, KernelKind, LayerKind, OpClass
from twin.flops import OpCost, model_costs

# What the curves describe, per device: the executor's default path when they were measured.
BASELINE = {
    "cuda": ResolvedExecution(device="cuda", attention_kernel="triton", attention_in_graph=True,
                              embedding_kernel="triton", ffn_kernel="triton", compile=True, cuda_graphs=True,
                              token_bucket=DEFAULT_TOKEN_BUCKET, fused_sparse_update=True, data_processes=False),
    "cpu": ResolvedExecution(device="cpu", attention_kernel="reference", attention_in_graph=True,
                             embedding_kernel="torch", ffn_kernel="torch", compile=False, cuda_graphs=False,
                             token_bucket=0, fused_sparse_update=False, data_processes=False),
}  # fmt: skip
# every choice, in the order ``plan`` applies them: the host's bound last (it counts the ops the others made)
CHOICES = ("attention_kernel", "attention_in_graph", "embedding_kernel", "ffn_kernel", "compile", "max_autotune",
           "token_bucket", "fused_sparse_update", "data_processes", "flash.fused_short", "flash.block_local",
           "flash.tma", "cuda_graphs")  # fmt: skip


def execution_of(s: Scenario) -> ResolvedExecution:
    """The execution the twin prices: ``s.execution`` resolved on the device its hardware is."""
    return resolve(s, device_of(s))


@cache
def family_data(gpu: str) -> dict:
    """``execution.yaml``'s entry for ``gpu``'s family; {} where it has none (nothing measured there)."""
    fam = load_yaml("execution.yaml")["families"].get(family_name(gpu)) or {}
    return {k: v for k, v in fam.items() if k != "note"}


# ---- how a rewritten op is priced ---------------------------------------------------------------
# Each takes the op, its direction, its kernel kind, the GPU and the kernel model, and returns the
# seconds of one call, unscaled: the workload applies the calibration's scale for the op's kind or class.
def _ew(nbytes: float, gpu: GPUSpec, model: KernelModel) -> float:
    return model.cost(kind=KernelKind.ELEMENTWISE, flops=0.0, bytes=nbytes, gpu=gpu, dtype="bf16").time_s


def _side(c: OpCost, d: Direction) -> tuple[float, float]:
    return (c.fwd_flops, c.fwd_bytes) if d is Direction.FWD else (c.bwd_flops, c.bwd_bytes)


@dataclass(frozen=True)
class Times:
    """The curves' time for the op, times a measured ratio per direction."""

    fwd: float
    bwd: float

    def time_s(self, c: OpCost, d: Direction, kind: KernelKind, gpu: GPUSpec, model: KernelModel) -> float:
        flops, nbytes = _side(c, d)
        t = model.cost(kind=kind, flops=flops, bytes=nbytes, gpu=gpu, dtype=c.dtype, segments=c.segments or 1.0)
        return t.time_s * (self.fwd if d is Direction.FWD else self.bwd)


@dataclass(frozen=True)
class PaddedBmm:
    """``calls`` batched matmuls sharing the op's FLOPs and bytes, each at max(gemm compute, its bytes
    at the elementwise curve): they write or read a padded score matrix at about the copy rate."""

    fwd_calls: int
    bwd_calls: int

    def time_s(self, c: OpCost, d: Direction, kind: KernelKind, gpu: GPUSpec, model: KernelModel) -> float:
        flops, nbytes = _side(c, d)
        calls = self.fwd_calls if d is Direction.FWD else self.bwd_calls
        g = model.cost(kind=KernelKind.GEMM, flops=flops / calls, bytes=0.0, gpu=gpu, dtype=c.dtype)
        mem = model.cost(kind=KernelKind.ELEMENTWISE, flops=0.0, bytes=nbytes / calls, gpu=gpu, dtype="bf16")
        return calls * (max(g.compute_s, mem.memory_s) + g.launch_s)


@dataclass(frozen=True)
class Passes:
    """Elementwise passes: ``factor`` effective bytes per byte the op counts, at the elementwise
    curve, plus ``fwd_sync_s`` of host round trip per forward call."""

    fwd_factor: float
    bwd_factor: float
    fwd_sync_s: float = 0.0

    def time_s(self, c: OpCost, d: Direction, kind: KernelKind, gpu: GPUSpec, model: KernelModel) -> float:
        _, nbytes = _side(c, d)
        if d is Direction.FWD:
            return _ew(self.fwd_factor * nbytes, gpu, model) + self.fwd_sync_s
        return _ew(self.bwd_factor * nbytes, gpu, model)


@dataclass(frozen=True)
class PerCall:
    """``calls`` calls sharing the op's bytes, each at least ``floor_s`` (measured per call) or its
    bytes at the curve's eff_max (no per-call x_half: that was fitted on single large calls)."""

    calls: int
    fwd_floor_s: float
    bwd_floor_s: float

    def time_s(self, c: OpCost, d: Direction, kind: KernelKind, gpu: GPUSpec, model: KernelModel) -> float:
        _, nbytes = _side(c, d)
        per = _no_x_half().cost(kind=kind, flops=0.0, bytes=nbytes / self.calls, gpu=gpu, dtype=c.dtype).memory_s
        return self.calls * max(self.fwd_floor_s if d is Direction.FWD else self.bwd_floor_s, per)


@dataclass(frozen=True)
class Fixed:
    """A measured time per call, whatever the op counts."""

    seconds: float

    def time_s(self, c: OpCost, d: Direction, kind: KernelKind, gpu: GPUSpec, model: KernelModel) -> float:
        return self.seconds


Pricing = Times | PaddedBmm | Passes | PerCall | Fixed


@cache
def _no_x_half() -> KernelModel:
    return KernelModel({k: {"memory_x_half_bytes": 0.0} for k in (KernelKind.EMBEDDING_FWD, KernelKind.EMBEDDING_BWD)})


# ---- the plan ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    """One execution choice that differs from what the curves describe: priced, or why not."""

    field: str  # dotted under execution, e.g. "flash.fused_short"
    value: object
    priced: bool
    how: str  # how it is priced, or why it is not

    def __str__(self) -> str:
        v = str(self.value).lower() if isinstance(self.value, bool) else self.value
        return f"execution.{self.field}={v}: {self.how}"


@dataclass
class Plan:
    """The step's ops as this execution runs them, how the rewritten ones are priced, and the host's
    time to issue them."""

    costs: list[OpCost]
    choices: list[Choice] = field(default_factory=list)
    pricing: dict[str, Pricing] = field(default_factory=dict)  # op name -> its rule (else the curves)
    recomputed: set[str] = field(default_factory=set)  # ops redone whole under selective checkpointing
    optimizer: list[OpCost] = field(default_factory=list)  # run after the dense optimizer step
    host_per_op_s: float = 0.0  # 0: the host is never the bound (CUDA graphs, or the CPU profile)
    host_extra_s: dict[str, tuple[float, float]] = field(default_factory=dict)  # op name -> (fwd, bwd)
    host_parts: set[str] = field(default_factory=set)  # ops issued as part of the op before them

    def time_s(self, c: OpCost, d: Direction, kind: KernelKind, gpu: GPUSpec, model: KernelModel) -> float | None:
        """Seconds of one call of ``c`` where the execution rewrote it (unscaled), else None."""
        rule = self.pricing.get(c.name)
        return None if rule is None else rule.time_s(c, d, kind, gpu, model)

    def host_s(self, c: OpCost, d: Direction) -> float:
        """Host seconds to issue one call of ``c``: ``host_per_op_s`` per op of the model (the parts
        an op was split into, or added beside it, count as that one op) and the per-table host time
        of the torch lookups and of the sparse update in the optimizer step."""
        if not self.host_per_op_s:
            return 0.0
        extra = self.host_extra_s.get(c.name, (0.0, 0.0))[0 if d is Direction.FWD else 1]
        return (0.0 if c.name in self.host_parts else self.host_per_op_s) + extra


def plan(s: Scenario, costs: list[OpCost], run: ResolvedExecution | None = None, *, gpu: str) -> Plan:
    """``costs`` (``twin.flops.model_costs`` of one micro-batch) as ``run`` executes them on ``gpu``."""
    run = run or execution_of(s)
    p = Plan(list(costs))
    data = family_data(gpu)
    for name in CHOICES:
        value, moot = _get(run, name), _moot(s, run, name)
        if moot or value == _get(BASELINE[run.device], name):
            continue
        p.choices.append(_price(s, run, p, data, gpu, name, value))
    return p


def choices(s: Scenario) -> list[Choice]:
    """The scenario's execution choices that differ from the curves' (priced or not), as ``plan`` sees them."""
    costs = model_costs(s.model, batch=s.training.micro_batch, precision=s.precision)
    return plan(s, costs, gpu=get_gpu(s.hardware.gpu).name).choices


def _get(run: ResolvedExecution, name: str) -> object:
    head, _, rest = name.partition(".")
    v = getattr(run, head)
    return getattr(v, rest) if rest else v


def _moot(s: Scenario, run: ResolvedExecution, name: str) -> bool:
    """Whether the choice changes nothing the executor runs for this scenario."""
    m = s.model
    gem = isinstance(m, GEMModel)
    tables = bool(m.embeddings.pooled or m.embeddings.sequences)
    triton_attention = gem and run.attention_kernel == "triton"
    return {
        "attention_kernel": not gem,
        "attention_in_graph": not (triton_attention and run.compile),
        "embedding_kernel": not tables,
        "ffn_kernel": not (gem and m.sequence.num_layers and m.embeddings.sequences),
        "max_autotune": not run.compile,
        "token_bucket": run.token_bucket == 0,  # no padding: the ids the twin counts
        "fused_sparse_update": not tables,
        "flash.fused_short": not (triton_attention and m.cross.num_layers and m.nonseq.num_tokens <= 64),
        "flash.block_local": not (triton_attention and m.sequence.attention == "block"
                                  and m.sequence.block_size <= 128),
        "flash.tma": not triton_attention,
    }.get(name, False)  # fmt: skip


def _price(s: Scenario, run: ResolvedExecution, p: Plan, data: dict, gpu: str, name: str, value) -> Choice:
    """Apply the rule for one choice to ``p``; the Choice says how it was priced, or why not."""
    if run.device == "cpu":
        return Choice(name, value, False, "the cpu profile's curves are the CPU executor's default path; "
                      "no CPU measurement of other choices")
    rule = _RULES.get(name)
    if rule is None:
        return Choice(name, value, False, _UNPRICED[name])
    needs, apply = rule
    missing = [k for k in needs(run) if k not in data]
    if missing:
        fam = family_name(gpu) or gpu
        return Choice(name, value, False, f"no measurement on the {fam} family "
                      f"(hwmodels/data/execution.yaml has no {', '.join(missing)} for it)")
    how = apply(s, run, p, data)
    return Choice(name, value, not isinstance(how, Unpriced), how)


class Unpriced(str):
    """What a rule returns when the choice changes nothing it can price for this scenario (why)."""


_UNPRICED = {
    "attention_in_graph": "measured within noise (s14-sep vs s14: 60.5 vs 59.8 ms on one H200)",
    "max_autotune": "Inductor kept cuBLAS for every GEMM (s16 ffn bench: 5.826 vs 5.852 ms per FFN)",
    "token_bucket": "the twin counts the real ids, not the padding to a multiple of the bucket",
    "data_processes": "the loader in a worker process was not measured apart (s4b)",
    "flash.block_local": "the general tiled path was not measured against the block-local one",
    "flash.tma": "pointer loads measured per kernel only (H100 tma_probe: 0.87-1.02x the TMA loads), not in a step",
}


# ---- the rules -----------------------------------------------------------------------------------
def _reference_attention(s: Scenario, run: ResolvedExecution, p: Plan, data: dict) -> str:
    r, st = data["reference_attention"], _ShapeStats.of(s)
    out = []
    for c in p.costs:
        out += _reference_parts(s, c, st, r, p) if c.op_class is OpClass.ATTENTION else [c]
    p.costs = out
    mx = " (MXFP8: its fake-quantized emulation priced as bf16, a lower bound)" if s.precision.attention == "mxfp8" else ""
    return f"the padded reference's matmuls, score and row passes (execution.yaml reference_attention){mx}"


def _ffn(s: Scenario, run: ResolvedExecution, p: Plan, data: dict) -> str:
    if run.ffn_kernel == "cublaslt":
        k = float(data["ffn_cublaslt"]["act_factor"])
        _price_act(s, p, k, k)
        return f"cuBLASLt's GELU epilogues: x{k:.3f} the bias + GELU op (execution.yaml ffn_cublaslt)"
    return _torch_ffn(s, run, p, data)


def _price_act(s: Scenario, p: Plan, fwd: float, bwd: float) -> None:
    """The sequence layers' FFN activation (``<layer>.mlp_act``) at these multiples of its curve time."""
    seq = {lp.layer for lp in by_layer(s).values() if lp.kind is LayerKind.SEQUENCE}
    for c in p.costs:
        if c.layer in seq and c.name == f"{c.layer}.mlp_act":
            p.pricing[c.name] = Times(fwd, bwd)


def _torch_ffn(s: Scenario, run: ResolvedExecution, p: Plan, data: dict) -> str:
    d = data["ffn_torch"]
    bwd = float(d["bwd_factor"]) if run.compile else 4.0 / 3.0
    _price_act(s, p, float(d["fwd_factor"]), bwd)
    return f"torch's GELU: x{float(d['fwd_factor']):.3f} forward, x{bwd:.3f} backward the bias + GELU op (execution.yaml ffn_torch)"


def _two_kernel_short(s: Scenario, run: ResolvedExecution, p: Plan, data: dict) -> str:
    f = float(data["flash_two_kernel_short_bwd"]["bwd_factor"])
    for c in p.costs:
        if c.attention is AttentionKind.ASYM:
            p.pricing[c.name] = Times(1.0, f)
    return f"the cross attention's backward in two kernels: x{f:.2f} (execution.yaml flash_two_kernel_short_bwd)"


def _eager_norms(s: Scenario, run: ResolvedExecution, p: Plan, data: dict) -> str:
    if s.precision.mlp == "fp32":
        return Unpriced("fp32: eager norms read what the compiled ones do; Inductor's other fusions are not modelled")
    if not any(c.op_class is OpClass.NORM for c in p.costs):
        return Unpriced("no norms; Inductor's other fusions are not modelled")
    out = []
    for c in p.costs:
        out += _eager_norm(c, p) if c.op_class is OpClass.NORM else [c]
    p.costs = out
    eager = data.get("eager_norm")
    if eager is None:
        return "eager norms in fp32 under autocast, with their casts (from the curves)"
    k = memory_curve(get_gpu(s.hardware.gpu), "norm")[0] / float(eager["memory_eff_max"])
    for c in p.costs:
        if c.op_class is OpClass.NORM:
            p.pricing[c.name] = Times(k, k)
    return (f"eager norms in fp32 under autocast, with their casts, at torch's eager layer_norm rate: x{k:.2f} "
            "the compiled norm's (execution.yaml eager_norm)")


def _eager_norm(c: OpCost, p: Plan) -> list[OpCost]:
    """An eager LayerNorm under bf16 autocast: fp32 in and out (2x the compiled bf16 norm's bytes),
    a cast to fp32 before it and one back to bf16 after it (6 bytes an element each), and their
    gradients' casts in backward."""
    elems = c.fwd_bytes / (2 * ELEM_BYTES["bf16"])  # twin/flops.py: norm fwd bytes = 2 x bf16 x elements
    casts = OpCost(f"{c.name}.casts", c.layer, OpClass.ELEMENTWISE, "fp32", Cost(fwd_bytes=12.0 * elems,
                   bwd_bytes=12.0 * elems))  # fmt: skip
    p.host_parts.add(casts.name)
    return [replace(c, cost=Cost(c.fwd_flops, c.bwd_flops, 2 * c.fwd_bytes, 2 * c.bwd_bytes)), casts]


def _torch_lookups(s: Scenario, run: ResolvedExecution, p: Plan, data: dict) -> str:
    e = data["torch_embeddings"]
    for c in p.costs:
        if c.op_class is OpClass.EMBEDDING:
            p.pricing[c.name] = PerCall(_tables(c), float(e["lookup_fwd_s"]), float(e["lookup_bwd_s"]))
    return "one F.embedding_bag / F.embedding per table (execution.yaml torch_embeddings)"


def _sparse_update(s: Scenario, run: ResolvedExecution, p: Plan, data: dict) -> str:
    key = "torch_embeddings" if run.embedding_kernel == "torch" else "optimizer_step_sparse_update"
    tables = sum(_tables(c) for c in p.costs if c.op_class is OpClass.EMBEDDING)
    opt = OpCost("optimizer.sparse", "optimizer", OpClass.OPTIMIZER, "fp32")
    p.optimizer.append(opt)
    p.pricing[opt.name] = Fixed(tables * float(data[key]["adagrad_step_s"]))
    return f"row-wise Adagrad over {tables} tables in the optimizer step (execution.yaml {key})"


def _host_bound(s: Scenario, run: ResolvedExecution, p: Plan, data: dict) -> str:
    host = data["host"]
    p.host_per_op_s = float((host.get("per_op_s_by_model") or {}).get(s.model.kind, host["per_op_s"]))
    if run.embedding_kernel == "torch":  # the per-table host times (where needed, _RULES asks for them)
        e = data["torch_embeddings"]
        for c in p.costs:
            if c.op_class is OpClass.EMBEDDING:
                n = _tables(c)
                p.host_extra_s[c.name] = (n * float(e["host_fwd_s"]), n * float(e["host_bwd_s"]))
    for opt in p.optimizer:
        tables = sum(_tables(c) for c in p.costs if c.op_class is OpClass.EMBEDDING)
        p.host_extra_s[opt.name] = (tables * float(data["torch_embeddings"]["host_step_s"]), 0.0)
    return (f"the step is at least the host's time to issue it: {p.host_per_op_s * 1e3:.3f} ms an op of the "
            f"{s.model.kind} model (execution.yaml host)")


def _always(*keys: str) -> Callable[[ResolvedExecution], tuple[str, ...]]:
    return lambda run: keys


# choice -> (the execution.yaml entries it needs, the rule), applied in CHOICES order
_RULES = {
    "attention_kernel": (_always("reference_attention"), _reference_attention),
    "embedding_kernel": (_always("torch_embeddings"), _torch_lookups),
    "ffn_kernel": (lambda run: ("ffn_cublaslt",) if run.ffn_kernel == "cublaslt" else ("ffn_torch",), _ffn),
    "compile": (_always(), _eager_norms),
    "cuda_graphs": (lambda run: ("host",) if run.embedding_kernel == "triton" and run.fused_sparse_update
                    else ("host", "torch_embeddings"), _host_bound),
    "fused_sparse_update": (lambda run: ("torch_embeddings",) if run.embedding_kernel == "torch"
                            else ("optimizer_step_sparse_update",), _sparse_update),
    "flash.fused_short": (_always("flash_two_kernel_short_bwd"), _two_kernel_short),
}  # fmt: skip


def fused_lookups(s: Scenario, costs: list[OpCost], gpu: GPUSpec) -> dict[str, tuple[float, float]]:
    """Seconds of each lookup op, (forward, backward), where the lookups run as the executor's CUDA
    default does and the GPU's family has a fitted table-batched model (efficiency.yaml ``tbe:``);
    {} elsewhere (the embedding.* curves price them, one call per family).

    The Triton lookups run one table-batched call per table module (the pooled tables, each sequence
    group) and table width, as ``executor.embeddings`` launches them, with the row-wise Adagrad fused
    into the backward: each such call is priced whole (``hwmodels.kernels.TbeCurve``: its fixed cost
    once, its bags, ids and distinct rows together) and shared among its families' ops by their own
    terms. A rank's shard of a table sees the ids of ``sparse_shard`` ranks' batches, so its distinct
    rows are ``1/sparse_shard`` of those of that many draws (the id law's expectation,
    ``scenarios.distributions.expected_unique_ids``). Sequence lookups (one output row per id) count
    each id as a bag: an assumption, the sweep measured pooled lookups."""
    run = execution_of(s)
    curve = tbe_curve(gpu) if run.embedding_kernel == "triton" and run.fused_sparse_update else None
    if curve is None:
        return {}
    fams = {f"emb.{f.name}": f for f in s.model.embeddings.pooled}
    fams |= {f"emb.{g.name}.{f.name}": f for g in s.model.embeddings.sequences for f in g.tables}
    S = s.parallelism.sparse_shard
    groups: dict[tuple[str, float], list[tuple[OpCost, dict[str, float]]]] = {}
    for c in costs:
        fam = fams.get(c.name) if c.op_class is OpClass.EMBEDDING else None
        if fam is None:
            continue
        unique = fam.count * expected_unique_ids(fam.rows, fam.id_skew, S * c.lookups / fam.count) / S
        module = c.name.split(".")[1] if c.name.count(".") == 2 else "pooled"
        groups.setdefault((module, c.row_bytes), []).append(
            (c, dict(ids=c.lookups, bags=c.bags, unique_rows=unique, row_bytes=c.row_bytes)))
    out = {}
    for members in groups.values():
        total = {k: sum(m[k] for _, m in members) for k in ("ids", "bags", "unique_rows")}
        rb = members[0][1]["row_bytes"]
        call = {d: curve.time_s(d, **total, row_bytes=rb) for d in Direction}
        own = {d: [curve.time_s(d, **m) for _, m in members] for d in Direction}
        for i, (c, _) in enumerate(members):
            out[c.name] = tuple(call[d] * own[d][i] / sum(own[d]) for d in Direction)
    return out


def _tables(c: OpCost) -> int:
    """Tables an embedding op looks up (one op per family: its ``count`` tables, one shape each)."""
    return max(1, len(c.sparse_shapes))


# ---- the reference attention -----------------------------------------------------------------
@dataclass(frozen=True)
class _ShapeStats:
    """What the padded reference sizes its tensors by, per micro-batch (expectations over the law)."""

    samples: float  # B
    nonempty: float  # samples with at least one token
    max_len: float  # E[the micro-batch's longest sample]
    blocks: float  # E[Σ_b ceil(L_b / block)]

    @classmethod
    def of(cls, s: Scenario) -> _ShapeStats:
        m, B = s.model, s.training.micro_batch
        pmf = np.array([1.0])
        for g in m.embeddings.sequences:
            pmf = np.convolve(pmf, g.length.pmf)
        n = np.arange(len(pmf), dtype=np.float64)
        cdf = np.clip(np.cumsum(pmf), 0.0, 1.0)
        below = np.concatenate([[0.0], cdf[:-1]])
        e_max = float(np.dot(n, cdf**B - below**B))
        block = m.sequence.block_size
        return cls(float(B), B * (1.0 - float(pmf[0])), e_max, B * float(np.dot(pmf, np.ceil(n / block))))


def _reference_parts(s: Scenario, c: OpCost, st: _ShapeStats, r: dict, p: Plan) -> list[OpCost]:
    """One attention op as the padded reference's three parts (bmm, score passes, row passes), each
    priced in ``p`` and recomputed whole under selective checkpointing."""
    m = s.model
    elem = ELEM_BYTES["fp32"] if s.precision.attention == "fp32" else ELEM_BYTES["bf16"]
    cross = c.attention is AttentionKind.ASYM
    if cross:  # B·H·N·n scores; the padded rows of the jagged side (q, or k and v), the dense side as is
        H, D, N = m.cross.heads, m.cross.head_dim, m.nonseq.num_tokens
        B, n = st.samples, st.max_len
        E, P, tensors = B * H * N * n, B * n * H * D, 2
        bmm_bytes = elem * (E + P + B * N * H * D)
    else:
        H, D = m.sequence.heads, m.sequence.head_dim
        block = m.sequence.attention == "block"
        G, n = (st.blocks, min(float(m.sequence.block_size), st.max_len)) if block else (st.nonempty, st.max_len)
        E, P, tensors = G * H * n * n, G * n * H * D, 4
        bmm_bytes = elem * (E + 2 * P)
    weights = "gdpa" if c.attention is AttentionKind.GDPA else "softmax"
    fwd, bwd = r["fwd"], r["bwd"]
    alpha_bwd = bwd[f"alpha_{weights}"] - (fwd[f"alpha_{weights}"] if cross else 0.0)  # cross keeps its scores
    rho_bwd = bwd["rho_cross"] if cross else bwd["rho"]
    per_byte = 1.0 / ELEM_BYTES["bf16"]  # the coefficients are bytes per bf16 element
    nb = 4 if cross else 6
    flops = 2.0 * E * D
    base = dict(layer=c.layer, op_class=OpClass.ATTENTION, dtype="bf16" if elem == 2 else "fp32",
                attention=c.attention)  # fmt: skip
    parts = [
        (OpCost(f"{c.name}.ref.bmm", cost=Cost(2 * flops, nb * flops, 2 * bmm_bytes, nb * bmm_bytes),
                act_bytes=c.act_bytes, **base), PaddedBmm(2, nb)),
        (OpCost(f"{c.name}.ref.scores", cost=Cost(fwd_bytes=elem * E, bwd_bytes=elem * E), **base),
         Passes(fwd[f"alpha_{weights}"] * per_byte, alpha_bwd * per_byte)),
        (OpCost(f"{c.name}.ref.rows", cost=Cost(fwd_bytes=elem * tensors * P, bwd_bytes=elem * tensors * P),
                **base), Passes(fwd["rho"] * per_byte, rho_bwd * per_byte, float(r["sync_s"]))),
    ]  # fmt: skip
    for part, rule in parts:
        p.pricing[part.name] = rule
        p.recomputed.add(part.name)
    p.host_parts.update(part.name for part, _ in parts[1:])
    return [part for part, _ in parts]
