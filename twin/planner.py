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

Objective: the highest samples/s whose memory per rank fits, ranked at the end by goodput-adjusted
throughput (effective samples/s = samples/s × ``twin.goodput``'s useful fraction: checkpoint
stalls, rework and restarts on the scenario's storage and failure catalog). The search below
prunes by step time; goodput moves little between layouts of one GPU count (the checkpoint's
unique bytes and the MTBF are the same), so it only reorders the simulated top. Search, cheapest
work first:

1. **Bound** (no simulation), communication-aware. The engine runs each stream's ops in
   program order and contention only lengthens ops, so the step is at least the longest path
   through the dependencies plus the compute stream's program order. Per compute-relevant
   choice ``(micro_batch, checkpointing, precision)`` one micro-batch's op graph is built
   once (grad_accum 1, dense_shard 1, expert and sparse_shard > 1 so every collective of the
   key is present) as a template; per key ``(micro_batch, checkpointing, precision, expert,
   sparse_shard)`` its ops are re-timed: embedding lookups as the graph prices them at the
   key's micro-batch and ``sparse_shard`` (``twin.workload.lookup_seconds``: the load factor
   and a shard's distinct rows move with ``sparse_shard``), experts × ``moe_load_factor``, the
   key's own collectives (the embedding all-to-alls over
   ``sparse_shard``, the MoE dispatch/combine over ``expert``, with its imbalance) by the
   collective model for the key's group, and every collective the key does not fix (FSDP,
   gradient all-reduces, the sparse replica traffic, which move with ``dense_shard`` and the
   strategy) at zero. A collective between two compute ops (the MoE all-to-alls, the embedding
   gradient all-to-all) then stretches the chain in full; the embedding output all-to-all only
   by what the bottom MLP does not hide. With ``T`` the chain's compute end, the bound is
   ``grad_accum · T``, and at least each key collective stream's serial sum
   (``grad_accum`` × its ops per micro-batch). It is never below the compute-only bound
   (``comm_bound=False``: the sum of compute ops, ``PlanEntry.compute_bound_s``). Per
   candidate, its dense optimizer step is added (it waits for everything else, and its time
   moves with ``dense_shard`` and ``expert``), and a fully sharded layout adds its first replica
   all-gather (before the first lookup) and its last replica reduce-scatter (after the last
   backward op). Beside that, each candidate has a floor of its own (``Bounds.floor_s``): its
   compute (the compute stream runs one op at a time), then ``replicated_sync``'s all-reduce of
   the table shard (it waits for the embeddings' backward, the compute stream's last op, and
   the optimizer waits for it), then the optimizer step; and the host's time to issue the step's
   calls where no CUDA graph hides it (``twin.workload.host_issue_s``: ``OpGraph.host_s``
   without the graph). A candidate whose bound, the larger of the two, reaches the ``top``-th
   best step is **pruned by bound** without a simulation. ``python -m twin.bench_bounds``
   checks the bounds against simulated steps on random layouts (``twin/data/bound_safety.json``).
2. **Best-first**: keys are visited by increasing bound; once a key's bound is no better than
   the ``top``-th best step found, it and every later key are **pruned by bound**.
3. **Communication-only axes last**: inside a key, ``dense_shard`` and the sparse replica
   strategy move communication (and memory) only. A key whose activations, expert states and
   workspace alone overflow the HBM (``memory_floor_bytes``) has all its variants **pruned by
   memory** at once; otherwise each variant is first checked against memory
   (``memory_per_rank``: **pruned by memory**), then simulated (``simulate(...,
   imbalance=False)``). When a key has at most ``EXHAUSTIVE_COMM`` variants all are tried;
   otherwise a coordinate descent: every ``dense_shard`` at ``fully_sharded``, then every
   strategy at the best ``dense_shard`` (the rest are **skipped by descent**).
   Before a variant is simulated, once ``top`` have been, it is bounded by its own collectives
   (``Bounds.stream_floor_s``, from ``twin.workload.messages`` without a graph, for each
   topology class of its ranks with its groups' own shapes: the busiest stream's serial sum; the
   compute of all micro-batches but the last, behind the replica rows' all-gather, then the last
   one's chain with its FSDP gathers and reduce-scatters queued on their stream, then the
   embeddings' gradient reductions; each plus the optimizer): **pruned by bound** when that
   reaches the ``top``-th best step. Then it is estimated (``twin.estimate``, on
   the graphs the simulation would run, built once): it is **ruled out by estimate** when the
   schedule without contention (the estimator's first round, a true lower bound) already reaches
   the ``top``-th best step (and, with ``estimate_rounds``, when its trusted estimate, taken
   ``ESTIMATE_MARGIN`` too high, still does).
4. The ``top`` configurations are re-simulated with rank imbalance (stragglers) and ranked by
   effective samples/s (then step time); the best is what ``write_best_yaml`` writes.

**Folding** (``twin.fold``): a GEM model of many identical layers is evaluated (bounds, memory,
lower bound, simulation) on two shallow copies of itself and the line through them; a candidate
of many micro-batches has its lower bound, not its simulation, drawn from copies of 2 and 3
micro-batches. Both are exact to rounding on random layouts of the bundled models but for one
step 3e-4 off (``python -m twin.bench_fold``, ``twin/data/fold_error.json``); simulations folded
along micro-batches are not (0.75% off at worst), so the search does not use them. The final
re-simulation (step 4) is always of the model itself.

**A goal** (``goal_samples_per_s``, a forecast's question at one GPU count): the search prunes
against the step that would reach it and stops at the first layout that does.

``budget`` stops the search (not the final re-simulation) after that many simulations
(evaluations), once at least one configuration that fits has been simulated (so a plan has a
best whenever the search reaches one). It counts work, not seconds: the same command gives the
same plan on any machine, loaded or not.
"""

from __future__ import annotations

import heapq
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import yaml

from hwmodels.gpus import get_gpu
from hwmodels.network import get_network
from scenarios.files import write_text_atomic
from scenarios.schema import Scenario
from twin.flops import model_costs
from twin.memory import memory_floor_bytes, memory_per_rank
from twin.fold import Fold, depth_fold, fold_memory, fold_result, with_accum, with_accum_fold
from twin.plan_bounds import Bounds, FoldedBounds
from twin.plan_space import (
    CHECKPOINTING, EXHAUSTIVE_COMM, PRECISIONS,
    Candidate, _comm_variants, _given_candidate, apply, dense_shards, experts,
    micro_batches, per_gpu_batch, precisions, sparse_shards,
)
from twin.estimate import class_graphs, estimate, lower_bound_parts, lower_bound_s
from twin.side_by_side import side_by_side
from twin.simulate import SimResult, simulate, simulate_timelines

DEFAULT_BUDGET = 1000  # simulations a plan may run (the CLI's --budget)
# A trusted estimate rules a candidate out when, even this much too high, it is no better than the
# top-th best simulated step: twin.estimate's error on 294 random layouts and the bundled scenarios
# is at most 1.33% (twin/data/estimate_error.json, python -m twin.bench_estimate; 2026-12-05, after
# the Hopper attention and norm refit).
ESTIMATE_MARGIN = 0.02
# A deep model's two shallow copies (twin.fold) are simulated side by side in a forked process
# (twin.side_by_side) once the last one took this long: a fork and its result cost a few ms, and
# a forecast's small layouts simulate in ~10 ms (gem-h200-1gpu's: slower side by side).
# Performance only: the same numbers either way.
SIDE_BY_SIDE_S = 0.05
DEFAULT_NETWORK = {"h100": "h100-roce-3tier", "h200": "h200-ib", "b200": "b200-ib",
                   "gb200": "gb200-nvl72"}  # fmt: skip


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
    pruned_by_estimate: int = 0
    simulated: int = 0
    keys: int = 0
    keys_visited: int = 0
    not_examined_goal: int = 0  # left once a layout reached the goal (plan's goal_samples_per_s)


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
    reached: bool | None = None  # with a goal: whether a layout reached it (else None)

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
            lines.append(f"#{i} {e.candidate.label()}: {(r.step_time_s - b.step_time_s) * 1e3:+.1f}"
                         f" ms, mostly {worst} (+{deltas[worst] * 1e3:.1f} ms)")  # fmt: skip
        return lines


def effective_samples_per_s(r: SimResult) -> float:
    """Goodput-adjusted throughput: samples/s × the useful fraction of wall time (``twin.goodput``)."""
    return r.goodput.effective_samples_per_s if r.goodput is not None else r.samples_per_s


def _compute(r: SimResult) -> float:
    return r.breakdown_s["compute"] + r.breakdown_s["sm_contention"]


def _top_axis(r: SimResult) -> str:
    if not r.exposed_comm_s_split_by_axis:
        return "none"
    a = max(r.exposed_comm_s_split_by_axis, key=r.exposed_comm_s_split_by_axis.get)
    return f"{a} ({r.exposed_comm_s_split_by_axis[a] * 1e3:.1f} ms)"


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
    budget: int | None = None, imbalance_final: bool = True, exhaustive_comm: int = EXHAUSTIVE_COMM,
    space: dict[str, list] | None = None, comm_bound: bool = True, compare_given: bool = True,
    bound_cache: dict | None = None, screen: bool = True, estimate_rounds: bool = False,
    fold: bool = True, goal_samples_per_s: float | None = None, evals: dict | None = None,
) -> PlanResult:  # fmt: skip
    """Search the space (module docstring) for the ``top`` fastest layouts that fit in memory.

    ``comm_bound=False``: order and prune keys by the compute-only bound (for comparison).
    ``screen=False``: simulate every candidate that fits instead of estimating it first (for comparison).
    ``estimate_rounds``: also rule candidates out on the estimator's contention rounds (a trusted
    estimate ``ESTIMATE_MARGIN`` too high), not only on its no-contention lower bound. Off by
    default: in pure Python the rounds cost more than the simulation they would save (gem-h100-4k:
    about as much; a forecast's 64x-deep year-3 model: 10.6 s an estimate against 1.5 s a simulation).
    ``fold``: evaluate a deep GEM model, and a candidate of many micro-batches, from a few small
    copies of it (memory, bounds, lower bound and simulation: ``twin.fold``); the final
    re-simulation with imbalance is always in full. ``fold=False`` evaluates every candidate in
    full (for comparison).
    ``goal_samples_per_s``: answer only whether some layout reaches this throughput (a forecast's
    question at each GPU count it tries): every candidate whose bound cannot reach it is pruned,
    and the search stops at the first simulated layout that does (``PlanResult.reached``); the
    top is then that layout, not the best.
    ``evals``: a dict kept across plans of this very search (same scenario, GPU count, GPU and
    network), such as a forecast's goal plan and full plan at one count: what each candidate's
    evaluation found (its memory, its lower bound, its simulation) is reused, not computed again,
    and counted as before; simulated layouts also start the top list, so the bounds prune against
    them from the first key.
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
    if budget is not None and (not isinstance(budget, int) or budget < 1):
        raise ValueError(f"budget ({budget}) must be a positive number of simulations; pass e.g. --budget 600")
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
    # what each candidate is evaluated on: itself, or its shallow copies (twin.fold), each also at a
    # few micro-batches when the candidate has many
    dfold = depth_fold(s) if fold else Fold()
    bases = dfold.copies(s) if dfold else [s]
    shared = {} if bound_cache is None else bound_cache
    each = [Bounds(b, gpus, gpu_name, net_name, experts(s, gpus), shared=shared) for b in bases]
    bounds = FoldedBounds(each, dfold) if dfold else each[0]
    def compute_bound(k: tuple) -> float:
        return bounds.compute_bound_s(Candidate(*k, 1), per_gpu)

    def key_bound(k: tuple) -> float:
        return bounds.bound_s(Candidate(*k, 1), per_gpu) if comm_bound else compute_bound(k)

    # keys by increasing bound, each first with a cheaper, looser one (its compute alone, then
    # its chain, both without the lookups, whose graph-free pricing costs more than the rest),
    # tightened only when it comes first: keys are visited in the order of their full bounds, and
    # most are pruned on a loose one (level 2: the full bound)
    def tighter(level: int, k: tuple) -> float:
        return bounds.bound_s(Candidate(*k, 1), per_gpu, lookups=False) if level == 1 else key_bound(k)

    scored = [(bounds.compute_bound_s(Candidate(*k, 1), per_gpu, lookups=False), 0 if comm_bound else 1, k)
              for k in keys]  # fmt: skip
    heapq.heapify(scored)
    counts = PlanCounts(keys=len(keys))
    variants = {ss: _comm_variants(gpus, ss, ds_list) for ss in ss_list}
    counts.enumerated = sum(len(variants[k[4]]) for k in keys)

    evals = {} if evals is None else evals  # candidate -> {"mem": report, "lb": s, "sim": (result, scenario)}
    done: list[tuple[float, Candidate, Scenario, SimResult, float]] = []
    for c, ev in sorted(evals.items(), key=lambda kv: kv[0]):
        if "sim" in ev:
            done.append((ev["sim"][0].step_time_s, c, ev["sim"][1], ev["sim"][0], ev["bound"]))
    seeded = {d[1] for d in done}
    costs: dict[tuple, list] = {}
    gpu_spec = get_gpu(gpu_name)
    exhausted = reached = False
    # with a goal, a step above gb / goal cannot reach it (the bounds and estimates prune against it)
    goal_step = math.inf if goal_samples_per_s is None else gb / goal_samples_per_s * (1 + 1e-12)

    copy_s = [0.0]  # the last simulation's seconds a copy (how long a fold's copies take: twin.side_by_side)

    def kth() -> float:
        return min(goal_step, sorted(d[0] for d in done)[top - 1] if len(done) >= top else math.inf)

    def copies_of(c: Candidate) -> list[Scenario]:
        """``c`` laid out on each base: the scenario itself, or its shallow copies (twin.fold)."""
        return [apply(b, c, gpus=gpus, gpu=gpu_name, network=net_name, global_batch=gb) for b in bases]

    def costs_of(i: int, c: Candidate, v: Scenario) -> list:
        """One micro-batch's ops of base ``i`` at ``c``'s micro-batch and precision (``v``: ``c`` on it)."""
        ck = (i, c.micro_batch, c.precision)
        if ck not in costs:
            costs[ck] = model_costs(v.model, batch=c.micro_batch, precision=v.precision)
        return costs[ck]

    def try_one(c: Candidate, bound: float) -> float | None:
        nonlocal exhausted, reached
        if reached:
            counts.not_examined_goal += 1
            return None
        if comm_bound:
            bound = max(bound + bounds.variant_extra_s(c), bounds.floor_s(c, per_gpu))
            if bound >= kth():
                counts.pruned_by_bound += 1
                return None
        ev = evals.setdefault(c, {})
        if "sim" in ev:  # simulated by an earlier plan of this search
            counts.simulated += 1
            if c not in seeded:
                done.append((ev["sim"][0].step_time_s, c, ev["sim"][1], ev["sim"][0], bound))
            return ev["sim"][0].step_time_s
        def real() -> Scenario:
            return apply(s, c, gpus=gpus, gpu=gpu_name, network=net_name, global_batch=gb)

        views = None
        if "mem" not in ev:
            views = copies_of(c)
            mems = [memory_per_rank(v, costs=costs_of(i, c, v), gpu=gpu_spec) for i, v in enumerate(views)]
            ev["mem"] = fold_memory(real(), mems, dfold) if dfold else mems[0]
        mem = ev["mem"]
        if not mem.fits:
            counts.pruned_by_memory += 1
            return None
        if budget is not None and done and counts.simulated >= budget:
            exhausted = True
            counts.not_examined_budget += 1
            return None
        # the simulation folds depth only (exact to rounding); the lower bound, which has no
        # contention, folds micro-batches as well (exact to rounding too: twin/data/fold_error.json)
        views = views or copies_of(c)
        cfold = with_accum_fold(dfold, per_gpu // c.micro_batch) if fold else Fold()
        lb_views = [with_accum(v, k) for v in views for k in cfold.accums] if cfold.accum else views
        graphs = None
        if screen and math.isfinite(kth()):  # estimate first; simulate only what it cannot rule out
            def lb_of(gs: list) -> float:
                if not cfold:
                    return lower_bound_s(gs[0])
                parts = [lower_bound_parts(g) for g in gs]  # the devices' and the host's, each on its line
                return max(cfold.combine([p[0] for p in parts]), cfold.combine([p[1] for p in parts]))

            if "lb" not in ev and "streams" not in ev:  # its own collectives, before any graph is built
                ev["streams"] = bounds.stream_floor_s(c, per_gpu)
            if "lb" not in ev and ev["streams"] >= kth():
                counts.pruned_by_bound += 1
                return ev["streams"]  # the descent compares variants on it
            if "lb" not in ev:  # the first rank class's bound first: it bounds the step too
                graphs = [class_graphs(v, first=True) for v in lb_views]
                lb = lb_of(graphs)
                if lb < kth():
                    full = [class_graphs(v, have=g) for v, g in zip(lb_views, graphs)]
                    if len(full[0]) > len(graphs[0]):
                        lb = lb_of(full)
                    graphs = full
                ev["lb"] = lb
            if cfold.accum:
                graphs = None  # the simulation's graphs are the depth copies' own
            if ev["lb"] >= kth():
                counts.pruned_by_estimate += 1
                return ev["lb"]  # the descent compares variants on it
            if estimate_rounds:
                graphs = graphs or [class_graphs(v) for v in views]
                ests = [estimate(v, graphs=g) for v, g in zip(views, graphs)]
                e = dfold.combine([x.step_time_s for x in ests]) if dfold else ests[0].step_time_s
                if all(x.trusted for x in ests) and e * (1 - ESTIMATE_MARGIN) >= kth():
                    counts.pruned_by_estimate += 1
                    return e
        def sim(i: int) -> SimResult:
            return simulate_timelines(views[i], imbalance=False,
                                      built=graphs[i] if graphs else class_graphs(views[i]))[0]  # fmt: skip

        # a deep model's copies (twin.fold) side by side, once one has taken long enough to be worth a fork
        t_sim, paired = time.perf_counter(), copy_s[0] >= SIDE_BY_SIDE_S
        calls = [lambda i=i: sim(i) for i in range(len(views))]
        rs = side_by_side(calls) if paired else [call() for call in calls]
        copy_s[0] = (time.perf_counter() - t_sim) / (1 if paired else len(views))
        sc = real() if dfold else views[0]
        r = fold_result(sc, rs, dfold, memory=mem) if dfold else rs[0]
        ev["sim"], ev["bound"] = (r, sc), bound
        counts.simulated += 1
        done.append((r.step_time_s, c, sc, r, bound))
        reached = reached or (goal_samples_per_s is not None and r.step_time_s <= goal_step)
        return r.step_time_s

    while scored:
        if exhausted or reached:
            left = sum(len(variants[kk[4]]) for *_, kk in scored)
            if exhausted:
                counts.not_examined_budget += left
            else:
                counts.not_examined_goal += left
            break
        bound, level, k = scored[0]
        if bound >= kth():
            counts.pruned_by_bound += sum(len(variants[kk[4]]) for *_, kk in scored)
            break
        if level < 2:
            heapq.heapreplace(scored, (tighter(level + 1, k), level + 1, k))
            continue
        heapq.heappop(scored)
        vs = variants[k[4]]
        counts.keys_visited += 1
        cands = [Candidate(*k, d, st, n) for d, st, n in vs]
        # what every layout of the key holds (activations, expert states): none fits if that does not
        floors = [memory_floor_bytes(v, costs=costs_of(j, cands[0], v)) for j, v in enumerate(copies_of(cands[0]))]
        if (dfold.combine(floors) if dfold else floors[0]) > gpu_spec.hbm_bytes:
            counts.pruned_by_memory += len(cands)
            continue
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
        entries.append(PlanEntry(c, sc, r, bound, compute_bound(c.key)))
    entries.sort(key=lambda e: (-effective_samples_per_s(e.result), e.result.step_time_s, e.candidate))
    given = None
    if compare_given:
        try:
            given = simulate(s, imbalance=imbalance_final)
        except ValueError as e:
            notes.append(f"the scenario as given does not simulate: {e}")
    return PlanResult(s.name, gpu_name, net_name, gpus, gb, entries, given, counts,
                      time.perf_counter() - t0, exhausted, notes, mine,
                      None if goal_samples_per_s is None else reached)  # fmt: skip


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
    # atomic, with the mode an ordinary new file gets (not mkstemp's owner-only 0600)
    return write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))


def _desc(r: PlanResult) -> str:
    b = r.best.result
    return (f"gemtwin plan: best of {r.counts.simulated} simulated for {r.gpus} x {r.gpu} on "
            f"{r.network}: {b.samples_per_s:,.0f} samples/s ({effective_samples_per_s(b):,.0f} effective), "
            f"MFU {b.mfu:.1%}")  # fmt: skip


def plan_tables(r: PlanResult) -> list:
    """Rich renderables: the search counts, the top configurations side by side, why they win."""
    from rich.table import Table

    c = r.counts
    head = Table(title=f"plan: {r.scenario} on {r.gpus} x {r.gpu} ({r.network}), "
                       f"global batch {r.global_batch}")  # fmt: skip
    for col in ("keys", "enumerated", "pruned by memory", "pruned by bound", "ruled out by estimate",
                "skipped by descent", "not examined (budget)", "simulated", "wall s"):  # fmt: skip
        head.add_column(col, justify="right")
    head.add_row(str(c.keys), f"{c.enumerated:,}", f"{c.pruned_by_memory:,}", f"{c.pruned_by_bound:,}",
                 f"{c.pruned_by_estimate:,}", f"{c.skipped_by_descent:,}", f"{c.not_examined_budget:,}", f"{c.simulated:,}",
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
    row("effective samples/s", lambda x, c: f"{effective_samples_per_s(x):,.0f}")
    row("goodput", lambda x, c: f"{x.goodput.goodput:.2%}" if x.goodput is not None else "")
    row("MFU", lambda x, c: f"{x.mfu:.1%}")
    row("step", lambda x, c: f"{x.step_time_s * 1e3:.1f}")
    bounds = {id(e.result): e for e in r.top}
    row("  lower bound", lambda x, c: (f"{bounds[id(x)].bound_s * 1e3:.1f}"
                                       if id(x) in bounds else ""))  # fmt: skip
    row("compute", lambda x, c: f"{_compute(x) * 1e3:.1f}")
    row("exposed comm", lambda x, c: f"{x.breakdown_s['exposed_comm'] * 1e3:.1f}")
    # the split (time exposed on several axes at once shared between them), so these rows add
    # up to the exposed comm row above
    axes = sorted({a for _, x, _ in cols for a in x.exposed_comm_s_split_by_axis})
    for a in axes:
        row(f"  exposed {a}", lambda x, c, a=a: f"{x.exposed_comm_s_split_by_axis.get(a, 0.0) * 1e3:.1f}")
    row("straggler", lambda x, c: f"{x.straggler_s * 1e3:.1f}")
    row("memory GB", lambda x, c: f"{x.memory_total_bytes / 1e9:.1f}/{x.memory_capacity_bytes / 1e9:.0f}")
    out = [head, t]
    out += [line for line in r.why()] + r.notes
    if r.budget_exhausted:
        out.append(f"search stopped at the budget of {r.counts.simulated} simulations: the top list is the best "
                   "found so far (--budget)")
    return out



# ---- command (registered by twin/cli.py: app.command("plan")(friendly(plan_command))) --------
def plan_command(
    scenario: Annotated[str, typer.Argument(help="A bundled scenario name or a YAML path.")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs to plan for.")],
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU type (default: the scenario's).")] = None,
    network: Annotated[Optional[str], typer.Option("--network", help="Network preset (default: the scenario's, or the GPU's usual one).")] = None,
    out: Annotated[Optional[Path], typer.Option("-o", "--out", help="Write the best as a scenario YAML (extends: SCENARIO).")] = None,
    top: Annotated[int, typer.Option("--top", help="Configurations to show.")] = 5,
    budget: Annotated[Optional[int], typer.Option(
        "--budget", help="Stop the search after this many simulations (evaluations, not seconds: the same "
        "command gives the same plan on any machine).")] = DEFAULT_BUDGET,
) -> None:  # fmt: skip
    """Search the 5D layout, checkpointing, micro-batch and precision for the best samples/s that fits."""
    from twin import api
    from twin.console import out as con

    if out is not None and out.is_dir():
        raise ValueError(f"-o {out} is a folder; give a file name such as best.yaml")
    s = api.load(scenario)
    r = api.plan(s, gpus=gpus, gpu=gpu, network=network, top=top, budget=budget)
    for x in plan_tables(r):
        con.print(x, highlight=False, soft_wrap=isinstance(x, str))
    if out is not None:
        ref = scenario if Path(scenario).suffix not in (".yaml", ".yml") else str(Path(scenario).resolve())
        con.print(f"wrote {api.write_best_yaml(r, out, base=s, extends=ref)}")
