"""Planner: the best 5D layout, checkpointing, micro-batch and precision for a GPU count (torch-free).

``plan(s, gpus=N)`` searches, for ``N`` GPUs of a type on a network preset:

- **dense_shard**: powers of two up to the NVLink domain (and the domain itself), then the
  domain times 2, 4, ... up to ``DENSE_SHARD_MAX_DOMAINS`` domains, each dividing ``N``;
  ``dense_replicate = N / dense_shard``.
- **expert**: divisors of ``model.moe.num_experts`` that divide ``N`` (1 without MoE).
- **sparse_shard**: powers of two and multiples of the NVLink domain dividing ``N``, thinned
  log-evenly to at most ``MAX_SPARSE_SHARDS`` values (1, the domain and ``N`` always kept);
  ``sparse_replica = N / sparse_shard``.
- **sparse_strategy**: ``fully_sharded``, or ``replicated_sync`` every ``SYNC_INTERVALS`` steps
  (only when ``sparse_replica`` > 1); **table_sharding** ``auto``.
- **activation_checkpointing**: none, selective, full.
- **micro_batch**: the global batch is kept: ``global_batch = micro_batch × N × grad_accum``.
  Rule: the per-GPU batch is ``training.global_batch / N`` when ``N`` divides it; otherwise it
  is rounded to the nearest integer (at least 1) and the global batch becomes per-GPU × ``N``
  (``PlanResult.global_batch`` and ``PlanResult.notes`` say so). ``micro_batch`` runs over the
  divisors of the per-GPU batch with ``grad_accum <= MAX_GRAD_ACCUM``.
- **precision** of attention and MLP matmuls: bf16, mxfp8 for the MLPs only, or mxfp8 for both
  (the two mxfp8 choices only where the GPU has an fp8 peak).

The scenario's own values of each axis are always in the space when they are valid for ``N``.

Objective: the highest samples/s whose memory per rank fits. Search, cheapest work first:

1. **Bound** (no simulation), communication-aware. The engine runs each stream's ops in
   program order and contention only lengthens ops, so the step is at least the longest path
   through the dependencies plus the compute stream's program order. Per compute-relevant
   choice ``(micro_batch, checkpointing, precision)`` one micro-batch's op graph is built
   once (grad_accum 1, dense_shard 1, expert and sparse_shard > 1 so every collective of the
   key is present) as a template; per key ``(micro_batch, checkpointing, precision, expert,
   sparse_shard)`` its ops are re-timed: embedding lookups × ``embedding_load_factor``,
   experts × ``moe_load_factor``, the key's own collectives (the embedding all-to-alls over
   ``sparse_shard``, the MoE dispatch/combine over ``expert``, with its imbalance) by the
   collective model for the key's group, and every collective the key does not fix (FSDP,
   gradient all-reduces, the sparse replica traffic, which move with ``dense_shard`` and the
   strategy) at zero. A collective between two compute ops (the MoE all-to-alls, the embedding
   gradient all-to-all) then stretches the chain in full; the embedding output all-to-all only
   by what the bottom MLP does not hide. With ``T`` the chain's compute end, the bound is
   ``grad_accum · T``, and at least each key collective stream's serial sum
   (``grad_accum`` × its ops per micro-batch). It is never below the compute-only bound
   (``comm_bound=False``: the sum of compute ops, ``PlanEntry.compute_bound_s``). Per
   candidate, a fully sharded layout adds its first replica all-gather (before the first
   lookup) and its last replica reduce-scatter (after the last backward op): a candidate whose
   bound reaches the ``top``-th best step is **pruned by bound** without a simulation.
2. **Best-first**: keys are visited by increasing bound; once a key's bound is no better than
   the ``top``-th best step found, it and every later key are **pruned by bound**.
3. **Communication-only axes last**: inside a key, ``dense_shard`` and the sparse replica
   strategy move communication (and memory) only. Each variant is first checked against
   memory (``memory_per_rank``: **pruned by memory**), then simulated (``simulate(...,
   imbalance=False)``). When a key has at most ``EXHAUSTIVE_COMM`` variants all are tried;
   otherwise a coordinate descent: every ``dense_shard`` at ``fully_sharded``, then every
   strategy at the best ``dense_shard`` (the rest are **skipped by descent**).
4. The ``top`` configurations are re-simulated with rank imbalance (stragglers) and ranked by
   that step time; the best is what ``write_best_yaml`` writes.

``budget_s`` stops the search (not the final re-simulation) after that many seconds, once at
least one configuration that fits has been simulated (so a plan has a best whenever the search
reaches one: a slow or loaded machine costs time, not an empty answer).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import yaml

from hwmodels.gpus import get_gpu
from hwmodels.network import get_network
from scenarios.schema import GEMModel, Scenario
from twin.flops import model_costs
from twin.imbalance import embedding_load_factor, moe_load_factor
from twin.memory import memory_per_rank
from twin.simulate import SimResult, simulate
from hwmodels.collectives import collective_cost
from twin.workload import COMPUTE, Hardware, axis_group, build_graph

DENSE_SHARD_MAX_DOMAINS = 8
MAX_SPARSE_SHARDS = 8
MAX_GRAD_ACCUM = 8
SYNC_INTERVALS = (1, 10, 100)
EXHAUSTIVE_COMM = 12
CHECKPOINTING = ("none", "selective", "full")
PRECISIONS = {"bf16": ("bf16", "bf16"), "mxfp8-mlp": ("bf16", "mxfp8"), "mxfp8": ("mxfp8", "mxfp8")}
DEFAULT_NETWORK = {"h100": "h100-roce-3tier", "h200": "h200-ib", "b200": "b200-ib",
                   "gb200": "gb200-nvl72"}  # fmt: skip


@dataclass(frozen=True, order=True)
class Candidate:
    """One point of the search space (the fields the planner changes)."""

    micro_batch: int
    activation_checkpointing: str
    precision: str  # a key of PRECISIONS
    expert: int
    sparse_shard: int
    dense_shard: int
    sparse_strategy: str = "fully_sharded"
    sparse_sync_interval: int = 1

    @property
    def key(self) -> tuple:
        """The compute-relevant part."""
        return (self.micro_batch, self.activation_checkpointing, self.precision, self.expert,
                self.sparse_shard)  # fmt: skip

    def label(self) -> str:
        sync = ("fs" if self.sparse_strategy == "fully_sharded"
                else f"rs/{self.sparse_sync_interval}")  # fmt: skip
        return (f"mb{self.micro_batch} ckpt={self.activation_checkpointing} {self.precision} "
                f"ds{self.dense_shard} ep{self.expert} ss{self.sparse_shard} {sync}")  # fmt: skip


@dataclass(frozen=True)
class PlanEntry:
    candidate: Candidate
    scenario: Scenario
    result: SimResult
    bound_s: float  # the lower bound the search used (communication-aware by default)
    compute_bound_s: float = 0.0  # the compute-only lower bound


@dataclass
class PlanCounts:
    enumerated: int = 0
    pruned_by_memory: int = 0
    pruned_by_bound: int = 0
    skipped_by_descent: int = 0
    not_examined_budget: int = 0
    simulated: int = 0
    keys: int = 0
    keys_visited: int = 0


@dataclass
class PlanResult:
    scenario: str
    gpu: str
    network: str
    gpus: int
    global_batch: int
    top: list[PlanEntry]
    given: SimResult | None
    counts: PlanCounts
    wall_s: float
    budget_exhausted: bool = False
    notes: list[str] = field(default_factory=list)
    given_candidate: Candidate | None = None

    @property
    def best(self) -> PlanEntry | None:
        return self.top[0] if self.top else None

    def why(self) -> list[str]:
        """One line per top configuration: what it gives up against the best, and where."""
        if not self.top:
            return []
        b = self.top[0].result
        idle = b.breakdown_s["idle"]
        lines = [f"#1 {self.top[0].candidate.label()}: step {b.step_time_s * 1e3:.1f} ms = compute "
                 f"{_compute(b) * 1e3:.1f} + exposed comm {b.breakdown_s['exposed_comm'] * 1e3:.1f}"
                 + (f" + idle {idle * 1e3:.1f}" if idle > 5e-5 else "")
                 + f" ms (the slowest rank; {b.straggler_s * 1e3:.1f} ms over the balanced step); "
                 f"largest exposed axis {_top_axis(b)}; lower bound {self.top[0].bound_s * 1e3:.1f}"
                 " ms"]  # fmt: skip
        for i, e in enumerate(self.top[1:], 2):
            r = e.result
            deltas = {
                "compute": _compute(r) - _compute(b),
                "exposed comm": r.breakdown_s["exposed_comm"] - b.breakdown_s["exposed_comm"],
                "straggler": r.straggler_s - b.straggler_s,
                "idle": r.breakdown_s["idle"] - b.breakdown_s["idle"],
            }
            worst = max(deltas, key=deltas.get)
            lines.append(f"#{i} {e.candidate.label()}: +{(r.step_time_s - b.step_time_s) * 1e3:.1f}"
                         f" ms, mostly {worst} (+{deltas[worst] * 1e3:.1f} ms)")  # fmt: skip
        return lines


def _compute(r: SimResult) -> float:
    return r.breakdown_s["compute"] + r.breakdown_s["sm_contention"]


def _top_axis(r: SimResult) -> str:
    if not r.exposed_comm_s_by_axis:
        return "none"
    a = max(r.exposed_comm_s_by_axis, key=r.exposed_comm_s_by_axis.get)
    return f"{a} ({r.exposed_comm_s_by_axis[a] * 1e3:.1f} ms)"


# ---- the space -------------------------------------------------------------------------------
def _pow2_upto(n: int, cap: int) -> list[int]:
    return [1 << k for k in range(40) if (1 << k) <= cap and n % (1 << k) == 0]


def dense_shards(gpus: int, domain: int) -> list[int]:
    vals = set(_pow2_upto(gpus, domain))
    if gpus % domain == 0:
        vals.update(domain * (1 << k) for k in range(40)
                    if (1 << k) <= DENSE_SHARD_MAX_DOMAINS and gpus % (domain * (1 << k)) == 0)  # fmt: skip
    return sorted(vals)


def sparse_shards(gpus: int, domain: int) -> list[int]:
    vals = set(_pow2_upto(gpus, gpus))
    vals.update(domain * k for k in range(1, gpus // domain + 1)
                if gpus % (domain * k) == 0 and (k & (k - 1)) == 0)  # fmt: skip
    vals = sorted(vals)
    if len(vals) <= MAX_SPARSE_SHARDS:
        return vals
    keep = {1, gpus} | ({domain} if gpus % domain == 0 else set())
    picks = {vals[round(i * (len(vals) - 1) / (MAX_SPARSE_SHARDS - 1))]
             for i in range(MAX_SPARSE_SHARDS)}  # fmt: skip
    return sorted(keep | picks)


def experts(s: Scenario, gpus: int) -> list[int]:
    n = s.model.moe.num_experts if isinstance(s.model, GEMModel) else 0
    if not n:
        return [1]
    return [e for e in range(1, n + 1) if n % e == 0 and gpus % e == 0]


def per_gpu_batch(global_batch: int, gpus: int) -> int:
    """The per-GPU batch the planner keeps (see the module rule)."""
    if global_batch % gpus == 0:
        return global_batch // gpus
    return max(1, round(global_batch / gpus))


def micro_batches(per_gpu: int) -> list[int]:
    return [m for m in range(1, per_gpu + 1) if per_gpu % m == 0 and per_gpu // m <= MAX_GRAD_ACCUM]


def precisions(gpu_name: str) -> list[str]:
    return list(PRECISIONS) if "fp8" in get_gpu(gpu_name).peak_flops else ["bf16"]


def _comm_variants(gpus: int, ss: int, ds_list: list[int]) -> list[tuple[int, str, int]]:
    strategies = [("fully_sharded", 1)]
    if gpus // ss > 1:
        strategies += [("replicated_sync", n) for n in SYNC_INTERVALS]
    return [(d, st, n) for st, n in strategies for d in ds_list]


# ---- scenarios from candidates -----------------------------------------------------------------
def apply(s: Scenario, c: Candidate, *, gpus: int, gpu: str, network: str,
          global_batch: int) -> Scenario:  # fmt: skip
    """``s`` with the candidate's choices (no validation: the space is valid by construction)."""
    attn, mlp = PRECISIONS[c.precision]
    p = s.parallelism.model_copy(update={
        "dense_shard": c.dense_shard, "dense_replicate": gpus // c.dense_shard,
        "expert": c.expert, "sparse_shard": c.sparse_shard,
        "sparse_replica": gpus // c.sparse_shard, "sparse_strategy": c.sparse_strategy,
        "sparse_sync_interval": c.sparse_sync_interval, "table_sharding": "auto",
        "activation_checkpointing": c.activation_checkpointing,
    })  # fmt: skip
    return s.model_copy(update={
        "hardware": s.hardware.model_copy(update={"gpu": gpu, "num_gpus": gpus, "network": network}),
        "parallelism": p,
        "precision": s.precision.model_copy(update={"attention": attn, "mlp": mlp}),
        "training": s.training.model_copy(update={"micro_batch": c.micro_batch,
                                                  "global_batch": global_batch}),
    })  # fmt: skip


def _given_candidate(s: Scenario) -> Candidate | None:
    p, pr = s.parallelism, s.precision
    prec = next((k for k, v in PRECISIONS.items() if v == (pr.attention, pr.mlp)), None)
    if prec is None:
        return None
    return Candidate(s.training.micro_batch, p.activation_checkpointing, prec, p.expert,
                     p.sparse_shard, p.dense_shard, p.sparse_strategy,
                     p.sparse_sync_interval if p.sparse_strategy == "replicated_sync" else 1)  # fmt: skip


# ---- bounds ----------------------------------------------------------------------------------
KEY_AXES = ("sparse_shard", "expert")  # collectives timed per key; the others count as zero


class _Bounds:
    """Lower bounds on the step, built from one micro-batch's op graph per compute choice."""

    def __init__(self, s: Scenario, gpus: int, gpu: str, network: str, expert_options: list[int],
                 shared: dict | None = None):  # fmt: skip
        self.s, self.gpus, self.gpu, self.network = s, gpus, gpu, network
        # the template turns every key collective on (a zero-time op where a key has group 1)
        self.t_expert = max(expert_options)
        self.t_ss = 2 if gpus % 2 == 0 else 1
        # Templates do not depend on the GPU count (per-rank compute; collectives re-timed or
        # zero), only on the GPU type and on which key collectives they hold: plans of one
        # scenario at several GPU counts (the forecast) share them through ``shared``.
        store = {} if shared is None else shared
        tk = (s.name, gpu, self.t_expert > 1, self.t_ss > 1)
        self.parts: dict[tuple, tuple[float, float, float]] = store.setdefault(("parts", tk), {})
        self.templates: dict[tuple, list[tuple]] = store.setdefault(("templates", tk), {})
        self.replica: dict[tuple, tuple[list, list]] = store.setdefault(("replica", tk), {})
        self.emb: dict[int, float] = {}
        self.moe: dict[tuple, float] = {}
        self.net = get_network(network)

    def _flat(self, micro: int, ckpt: str, prec: str, expert=1, ss=1) -> Scenario:
        c = Candidate(micro, ckpt, prec, expert, ss, 1)
        return apply(self.s, c, gpus=self.gpus, gpu=self.gpu, network=self.network,
                     global_batch=micro * self.gpus)  # fmt: skip

    def _template(self, micro: int, ckpt: str, prec: str) -> list[tuple]:
        """One micro-batch's ops, compressed, as ``(what, (rest, lookups, experts), deps, kind,
        bytes, axis)``: ``what`` 's' is a run of compute ops (seconds of other compute, of
        embedding lookups and of expert matmuls, the latter two at load factor 1), 'k' a key
        collective, 'z' any other collective (zero). A run ends where a collective depends on
        its last op and a new one starts at a compute op that waits for a collective, so inside
        a run each op starts when the previous one ends; ``deps`` index earlier entries."""
        k = (micro, ckpt, prec)
        if k in self.templates:
            return self.templates[k]
        flat = self._flat(micro, ckpt, prec, expert=self.t_expert, ss=self.t_ss)
        ef, mf = embedding_load_factor(flat), moe_load_factor(flat)
        ops = [op for op in build_graph(flat, Hardware.of(flat)).ops if op.op_class != "optimizer"]
        waited_on = {d for op in ops if op.stream != COMPUTE for d in op.deps}
        rows: list[list] = []
        where: dict[str, int] = {}  # op name -> its entry
        run = None  # the open run of compute ops
        for op in ops:
            deps = {where[d] for d in op.deps}
            if op.stream != COMPUTE:
                run = None
                what = "k" if op.axis in KEY_AXES else "z"
                rows.append([what, (0.0, 0.0, 0.0), tuple(sorted(deps)), op.op_class, op.bytes,
                             op.axis])  # fmt: skip
            else:
                if run is None or any(rows[d][0] != "s" for d in deps):
                    rows.append(["s", [0.0, 0.0, 0.0], tuple(sorted(d for d in deps
                                 if rows[d][0] != "s")), "", 0.0, ""])  # fmt: skip
                    run = rows[-1]
                if op.op_class == "embedding":
                    run[1][1] += op.duration_s / ef
                elif ".experts_up." in op.name or ".experts_down." in op.name:
                    run[1][2] += op.duration_s / mf
                else:
                    run[1][0] += op.duration_s
            where[op.name] = len(rows) - 1
            if op.stream == COMPUTE and op.name in waited_on:
                run = None  # a collective waits for this op: the run ends here
        self.templates[k] = [(w, tuple(d), deps, kind, nb, ax) for w, d, deps, kind, nb, ax in rows]
        runs = [i for i, r in enumerate(rows) if r[0] == "s"]
        first, last = runs[0], runs[-1]
        head = [(r[3], r[4]) for i, r in enumerate(rows) if r[5] == "sparse_replica"
                and not r[2] and i in rows[first][2]]  # fmt: skip
        tail = [(r[3], r[4]) for i, r in enumerate(rows) if r[5] == "sparse_replica"
                and last in r[2] and i > last]  # fmt: skip
        self.replica[k] = (head, tail)
        return self.templates[k]

    def _split(self, micro: int, ckpt: str, prec: str) -> tuple[float, float, float]:
        """Compute seconds of one micro-batch: (the rest, embedding lookups, expert matmuls)."""
        k = (micro, ckpt, prec)
        if k not in self.parts:
            runs = [d for what, d, *_ in self._template(micro, ckpt, prec) if what == "s"]
            self.parts[k] = tuple(sum(r[i] for r in runs) for i in range(3))  # type: ignore[assignment]
        return self.parts[k]

    def _factors(self, c: Candidate) -> tuple[float, float]:
        if c.sparse_shard not in self.emb:
            flat = self._flat(c.micro_batch, c.activation_checkpointing, c.precision,
                              ss=c.sparse_shard)  # fmt: skip
            self.emb[c.sparse_shard] = embedding_load_factor(flat)
        mk = (c.micro_batch, c.expert)
        if mk not in self.moe:
            flat = self._flat(c.micro_batch, c.activation_checkpointing, c.precision, expert=c.expert)
            self.moe[mk] = moe_load_factor(flat)
        return self.emb[c.sparse_shard], self.moe[mk]

    def compute_bound_s(self, c: Candidate, per_gpu: int) -> float:
        """Sum of the rank's compute ops (less the optimizer): the compute stream's busy time."""
        rest, emb, exp = self._split(c.micro_batch, c.activation_checkpointing, c.precision)
        ef, mf = self._factors(c)
        return per_gpu // c.micro_batch * (rest + ef * emb + mf * exp)

    def bound_s(self, c: Candidate, per_gpu: int) -> float:
        """The communication-aware bound (module docstring): never below ``compute_bound_s``."""
        ef, mf = self._factors(c)
        sizes = {"sparse_shard": c.sparse_shard, "expert": c.expert}
        sm_free = self.s.parallelism.sm_free_collectives
        times: dict[tuple, float] = {}
        finish: list[float] = []
        chain = 0.0  # end of the last compute op (program order on the compute stream)
        stream_sum = dict.fromkeys(KEY_AXES, 0.0)
        for what, (rest, emb, exp), deps, kind, nbytes, axis in self._template(
                c.micro_batch, c.activation_checkpointing, c.precision):  # fmt: skip
            start = max([finish[i] for i in deps], default=0.0)
            if what == "s":
                start = max(start, chain)
                chain = start + rest + ef * emb + mf * exp
                finish.append(chain)
                continue
            d = 0.0
            if what == "k" and sizes[axis] > 1 and nbytes > 0:
                tk = (kind, nbytes, axis)
                if tk not in times:
                    times[tk] = collective_cost(
                        kind=kind, msg_bytes=nbytes, group_size=sizes[axis], stride=1,
                        network=self.net, sm_free=sm_free,
                        imbalance=mf if axis == "expert" else 1.0).time_s  # fmt: skip
                d = times[tk]
                stream_sum[axis] += d
            finish.append(start + d)
        accum = per_gpu // c.micro_batch
        return accum * max(chain, *stream_sum.values())


    def variant_extra_s(self, c: Candidate) -> float:
        """What a fully sharded layout adds to the key's bound: the first micro-batch's lookups
        wait for its replica all-gather (nothing runs before it), and the step's end waits for
        the replica reduce-scatter after the last backward op (nothing runs after it). 0 for
        ``replicated_sync`` (its all-reduce is not bounded here) or one replica."""
        replicas = self.gpus // c.sparse_shard
        if c.sparse_strategy != "fully_sharded" or replicas <= 1:
            return 0.0
        self._template(c.micro_batch, c.activation_checkpointing, c.precision)
        head, tail = self.replica[(c.micro_batch, c.activation_checkpointing, c.precision)]
        sm_free = self.s.parallelism.sm_free_collectives

        def t(ops):
            return max([collective_cost(kind=kind, msg_bytes=nb, group_size=replicas,
                                        stride=c.sparse_shard, network=self.net,
                                        sm_free=sm_free).time_s for kind, nb in ops if nb > 0],
                       default=0.0)  # fmt: skip

        return t(head) + t(tail)


# ---- search ----------------------------------------------------------------------------------
def _resolve(s: Scenario, gpus: int, gpu: str | None, network: str | None) -> tuple[str, str, int]:
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus ({gpus}) must be a positive integer; pass e.g. --gpus 8")
    gpu_name = (gpu or s.hardware.gpu).lower()
    try:
        get_gpu(gpu_name)
    except ValueError as e:
        raise ValueError(f"gpu: {e}") from None
    if network is None:
        network = s.hardware.network if gpu_name == s.hardware.gpu.lower() else DEFAULT_NETWORK.get(gpu_name)
        if network is None:
            raise ValueError(f"gpu '{gpu_name}' has no default network preset; pass --network")
    try:
        net = get_network(network)
    except ValueError as e:
        raise ValueError(f"network: {e}") from None
    if gpus > net.max_gpus:
        raise ValueError(f"gpus ({gpus}) exceeds network '{net.name}' ({net.max_gpus} GPUs); "
                         "pick a larger preset with --network")  # fmt: skip
    return gpu_name, net.name, net.tiers[0].domain_gpus


def _with(vals: list[int], extra: int, ok: bool) -> list[int]:
    return sorted(set(vals) | ({extra} if ok else set()))


def plan(
    s: Scenario, *, gpus: int, gpu: str | None = None, network: str | None = None, top: int = 5,
    budget_s: float | None = None, imbalance_final: bool = True, exhaustive_comm: int = EXHAUSTIVE_COMM,
    space: dict[str, list] | None = None, comm_bound: bool = True, compare_given: bool = True,
    bound_cache: dict | None = None,
) -> PlanResult:  # fmt: skip
    """Search the space (module docstring) for the ``top`` fastest layouts that fit in memory.

    ``comm_bound=False``: order and prune keys by the compute-only bound (for comparison).
    ``compare_given=False``: do not simulate the scenario as given (``PlanResult.given`` None).
    ``bound_cache``: a dict kept across plans of the same scenario (one micro-batch op graph
    per compute choice is reused at every GPU count; the caller keeps the scenario fixed).

    ``space``: restrict axes to the given values (keys: micro_batch, activation_checkpointing,
    precision, expert, sparse_shard, dense_shard), intersected with the valid ones (the forecast
    uses this to stay cheap). ``imbalance_final``: re-simulate the top with rank imbalance.
    """
    t0 = time.perf_counter()
    if not isinstance(top, int) or top < 1:
        raise ValueError(f"top ({top}) must be a positive integer; pass e.g. --top 5")
    if budget_s is not None and budget_s <= 0:
        raise ValueError(f"budget_s ({budget_s}) must be positive; pass e.g. 60")
    gpu_name, net_name, domain = _resolve(s, gpus, gpu, network)
    per_gpu = per_gpu_batch(s.training.global_batch, gpus)
    gb = per_gpu * gpus
    notes = []
    if gb != s.training.global_batch:
        notes.append(f"training.global_batch {s.training.global_batch} is not a multiple of "
                     f"{gpus} GPUs: planned at {per_gpu} per GPU = {gb}")  # fmt: skip
    mine = _given_candidate(s)
    own = s.hardware.num_gpus == gpus
    ds_list = _with(dense_shards(gpus, domain), s.parallelism.dense_shard,
                    own and gpus % s.parallelism.dense_shard == 0)  # fmt: skip
    ss_list = _with(sparse_shards(gpus, domain), s.parallelism.sparse_shard,
                    own and gpus % s.parallelism.sparse_shard == 0)  # fmt: skip
    mb_list = _with(micro_batches(per_gpu), s.training.micro_batch,
                    per_gpu % s.training.micro_batch == 0)  # fmt: skip
    space = dict(space or {})
    unknown_axes = set(space) - {"micro_batch", "activation_checkpointing", "precision", "expert",
                                 "sparse_shard", "dense_shard"}  # fmt: skip
    if unknown_axes:
        raise ValueError(f"space has unknown axes {sorted(unknown_axes)}; use micro_batch, "
                         "activation_checkpointing, precision, expert, sparse_shard, dense_shard")  # fmt: skip

    def pick(axis, vals):
        if axis not in space:
            return list(vals)
        kept = [v for v in vals if v in space[axis]]
        return kept or list(vals)[-1:]

    ds_list = pick("dense_shard", ds_list)
    ss_list = pick("sparse_shard", ss_list)
    keys = [(m, ck, pr, e, ss) for m in pick("micro_batch", mb_list)
            for ck in pick("activation_checkpointing", CHECKPOINTING)
            for pr in pick("precision", precisions(gpu_name))
            for e in pick("expert", experts(s, gpus)) for ss in ss_list]  # fmt: skip
    bounds = _Bounds(s, gpus, gpu_name, net_name, experts(s, gpus), shared=bound_cache)
    compute_bound = {k: bounds.compute_bound_s(Candidate(*k, 1), per_gpu) for k in keys}
    key_bound = ({k: bounds.bound_s(Candidate(*k, 1), per_gpu) for k in keys} if comm_bound
                 else compute_bound)  # fmt: skip
    scored = sorted((key_bound[k], k) for k in keys)
    counts = PlanCounts(keys=len(keys))
    variants = {ss: _comm_variants(gpus, ss, ds_list) for ss in ss_list}
    counts.enumerated = sum(len(variants[k[4]]) for k in keys)

    done: list[tuple[float, Candidate, Scenario, SimResult, float]] = []
    costs: dict[tuple, list] = {}
    gpu_spec = get_gpu(gpu_name)
    exhausted = False

    def kth() -> float:
        return sorted(d[0] for d in done)[top - 1] if len(done) >= top else math.inf

    def try_one(c: Candidate, bound: float) -> float | None:
        nonlocal exhausted
        if comm_bound:
            bound += bounds.variant_extra_s(c)
            if bound >= kth():
                counts.pruned_by_bound += 1
                return None
        sc = apply(s, c, gpus=gpus, gpu=gpu_name, network=net_name, global_batch=gb)
        ck = (c.micro_batch, c.precision)
        if ck not in costs:
            costs[ck] = model_costs(sc.model, batch=c.micro_batch, precision=sc.precision)
        if not memory_per_rank(sc, costs=costs[ck], gpu=gpu_spec).fits:
            counts.pruned_by_memory += 1
            return None
        if budget_s is not None and done and time.perf_counter() - t0 > budget_s:
            exhausted = True
            counts.not_examined_budget += 1
            return None
        r = simulate(sc, imbalance=False)
        counts.simulated += 1
        done.append((r.step_time_s, c, sc, r, bound))
        return r.step_time_s

    for i, (bound, k) in enumerate(scored):
        vs = variants[k[4]]
        if exhausted:
            counts.not_examined_budget += len(vs)
            continue
        if bound >= kth():
            counts.pruned_by_bound += sum(len(variants[kk[4]]) for _, kk in scored[i:])
            break
        counts.keys_visited += 1
        cands = [Candidate(*k, d, st, n) for d, st, n in vs]
        if len(cands) <= exhaustive_comm:
            for c in cands:
                try_one(c, bound)
            continue
        # coordinate descent: dense_shard at each strategy until one fits, then the strategies
        seen = set()
        best = None
        for strategy in dict.fromkeys((c.sparse_strategy, c.sparse_sync_interval) for c in cands):
            for c in cands:
                if (c.sparse_strategy, c.sparse_sync_interval) == strategy:
                    seen.add(c)
                    t = try_one(c, bound)
                    if t is not None and (best is None or t < best[0]):
                        best = (t, c)
            if best is not None:
                break
        if best is not None:
            for c in cands:
                if c.dense_shard == best[1].dense_shard and c not in seen:
                    seen.add(c)
                    try_one(c, bound)
        counts.skipped_by_descent += len(cands) - len(seen)
        # the given layout is always tried when it belongs to this key
        if mine is not None and own and mine.key == k and mine not in seen and mine in cands:
            counts.skipped_by_descent -= 1
            try_one(mine, bound)

    done.sort(key=lambda d: (d[0], d[1]))
    entries = []
    for _, c, sc, r, bound in done[:top]:
        if imbalance_final:
            r = simulate(sc)
        entries.append(PlanEntry(c, sc, r, bound, compute_bound[c.key]))
    entries.sort(key=lambda e: (e.result.step_time_s, e.candidate))
    given = None
    if compare_given:
        try:
            given = simulate(s, imbalance=imbalance_final)
        except ValueError as e:
            notes.append(f"the scenario as given does not simulate: {e}")
    return PlanResult(s.name, gpu_name, net_name, gpus, gb, entries, given, counts,
                      time.perf_counter() - t0, exhausted, notes, mine)  # fmt: skip


# ---- output ----------------------------------------------------------------------------------
def changed_fields(base: Scenario, best: Scenario) -> dict[str, Any]:
    """The sections/fields of ``best`` that differ from ``base`` (for an ``extends:`` file)."""
    a, b = base.model_dump(mode="json"), best.model_dump(mode="json")
    out: dict[str, Any] = {}
    for sec in ("hardware", "parallelism", "precision", "training"):
        diff = {k: v for k, v in b[sec].items() if a[sec].get(k) != v}
        if diff:
            out[sec] = diff
    return out


def write_best_yaml(result: PlanResult, base: Scenario, path: str | os.PathLike,
                    *, extends: str | None = None) -> Path:  # fmt: skip
    """Write the best configuration: ``extends: <ref>`` plus the changed fields when a ref is
    given, else the full scenario. Atomic (temp file + rename)."""
    if result.best is None:
        raise ValueError("plan found no configuration that fits in memory; nothing to write "
                         "(try more --gpus)")  # fmt: skip
    best = result.best.scenario
    if extends:
        data: dict[str, Any] = {"extends": str(extends), "name": f"{base.name}-planned",
                                "description": _desc(result), **changed_fields(base, best)}  # fmt: skip
    else:
        data = best.model_dump(mode="json")
        data.update(name=f"{base.name}-planned", description=_desc(result))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(data, f, sort_keys=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _desc(r: PlanResult) -> str:
    b = r.best.result
    return (f"gemtwin plan: best of {r.counts.simulated} simulated for {r.gpus} x {r.gpu} on "
            f"{r.network}: {b.samples_per_s:,.0f} samples/s, MFU {b.mfu:.1%}")  # fmt: skip


def plan_tables(r: PlanResult) -> list:
    """Rich renderables: the search counts, the top configurations side by side, why they win."""
    from rich.table import Table

    c = r.counts
    head = Table(title=f"plan: {r.scenario} on {r.gpus} x {r.gpu} ({r.network}), "
                       f"global batch {r.global_batch}")  # fmt: skip
    for col in ("keys", "enumerated", "pruned by memory", "pruned by bound", "skipped by descent",
                "not examined (budget)", "simulated", "wall s"):  # fmt: skip
        head.add_column(col, justify="right")
    head.add_row(str(c.keys), f"{c.enumerated:,}", f"{c.pruned_by_memory:,}", f"{c.pruned_by_bound:,}",
                 f"{c.skipped_by_descent:,}", f"{c.not_examined_budget:,}", f"{c.simulated:,}",
                 f"{r.wall_s:.1f}")  # fmt: skip
    cols = [(f"#{i}", e.result, e.candidate) for i, e in enumerate(r.top, 1)]
    if r.given is not None:
        cols.append(("given", r.given, r.given_candidate))
    t = Table(title="top configurations (ms unless noted)")
    t.add_column("")
    for name, _, _ in cols:
        t.add_column(name, justify="right")
    def row(label, f):
        t.add_row(label, *[f(res, cand) for _, res, cand in cols])
    row("micro_batch", lambda x, c: str(c.micro_batch) if c else "")
    row("checkpointing", lambda x, c: c.activation_checkpointing if c else "")
    row("precision attn/mlp", lambda x, c: "/".join(PRECISIONS[c.precision]) if c else "")
    row("dense shard×repl", lambda x, c: f"{c.dense_shard}×{x.num_gpus // c.dense_shard}" if c else "")
    row("expert", lambda x, c: str(c.expert) if c else "")
    row("sparse shard×repl", lambda x, c: f"{c.sparse_shard}×{x.num_gpus // c.sparse_shard}" if c else "")
    row("sparse strategy", lambda x, c: (c.sparse_strategy if c.sparse_strategy == "fully_sharded"
                                          else f"sync/{c.sparse_sync_interval}") if c else "")  # fmt: skip
    row("samples/s", lambda x, c: f"{x.samples_per_s:,.0f}")
    row("MFU", lambda x, c: f"{x.mfu:.1%}")
    row("step", lambda x, c: f"{x.step_time_s * 1e3:.1f}")
    bounds = {id(e.result): e for e in r.top}
    row("  lower bound", lambda x, c: (f"{bounds[id(x)].bound_s * 1e3:.1f}"
                                       if id(x) in bounds else ""))  # fmt: skip
    row("compute", lambda x, c: f"{_compute(x) * 1e3:.1f}")
    row("exposed comm", lambda x, c: f"{x.breakdown_s['exposed_comm'] * 1e3:.1f}")
    axes = sorted({a for _, x, _ in cols for a in x.exposed_comm_s_by_axis})
    for a in axes:
        row(f"  exposed {a}", lambda x, c, a=a: f"{x.exposed_comm_s_by_axis.get(a, 0.0) * 1e3:.1f}")
    row("straggler", lambda x, c: f"{x.straggler_s * 1e3:.1f}")
    row("memory GB", lambda x, c: f"{x.memory_total_bytes / 1e9:.1f}/{x.memory_capacity_bytes / 1e9:.0f}")
    out = [head, t]
    out += [line for line in r.why()] + r.notes
    if r.budget_exhausted:
        out.append("search stopped at the time budget: the top list is the best found so far")
    return out



# ---- command (registered by twin/cli.py: app.command("plan")(friendly(plan_command))) --------
def plan_command(
    scenario: Annotated[str, typer.Argument(help="A bundled scenario name or a YAML path.")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs to plan for.")],
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU type (default: the scenario's).")] = None,
    network: Annotated[Optional[str], typer.Option("--network", help="Network preset (default: the scenario's, or the GPU's usual one).")] = None,
    out: Annotated[Optional[Path], typer.Option("-o", "--out", help="Write the best as a scenario YAML (extends: SCENARIO).")] = None,
    top: Annotated[int, typer.Option("--top", help="Configurations to show.")] = 5,
    budget_s: Annotated[Optional[float], typer.Option("--budget-s", help="Stop the search after this many seconds.")] = 120.0,
) -> None:  # fmt: skip
    """Search the 5D layout, checkpointing, micro-batch and precision for the best samples/s that fits."""
    import scenarios
    from rich.console import Console

    if out is not None and out.is_dir():
        raise ValueError(f"-o {out} is a folder; give a file name such as best.yaml")
    s = scenarios.load(scenario)
    r = plan(s, gpus=gpus, gpu=gpu, network=network, top=top, budget_s=budget_s)
    con = Console()
    for x in plan_tables(r):
        con.print(x, highlight=False, soft_wrap=isinstance(x, str))
    if out is not None:
        ref = scenario if Path(scenario).suffix not in (".yaml", ".yml") else str(Path(scenario).resolve())
        con.print(f"wrote {write_best_yaml(r, s, out, extends=ref)}")
