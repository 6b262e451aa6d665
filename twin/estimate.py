"""The fast step estimator: an analytic schedule of one rank's op graph, for searches (torch-free).

``twin.engine`` runs a graph as a discrete-event simulation on simpy: every op a process, every
change of the SM or link load an event. The planner and the forecast rank thousands of layouts,
and only the best few need that. ``estimate_graph`` computes the same quantities in a few array
passes over the graph, with no event queue:

1. **Critical path with stream order.** In program order, an op starts when its stream's previous
   op and its deps have ended (the engine's rule), at its isolated duration: the longest path
   through the dependencies and the streams' program orders.
2. **Overlap and contention, as a fixed point.** An op shares a resource with the others that
   use it at the same time: a compute op the SMs with the SM-based collectives (it progresses at
   ``1 - min(sum of sm_fraction, cap)``, the engine's progress-based rate), a collective its
   network link with the collectives on it (``1 / (1 + others)``). Each round redoes the schedule
   in program order, integrating every op's work over the load it sees: the ops of the same
   round placed before it in program order where this round put them, the later ones where the
   last round did (Gauss-Seidel: with only the last round's positions, a collective a compute op
   waited for stays where it was and slows the compute that now overlaps it, and the rounds
   settle far from the engine). Rounds run undamped until the step turns back, then each op's
   duration moves half-way (``DAMPING``); at most ``ROUNDS``.
3. **Exposed communication per axis** comes from the estimated spans (``GraphEstimate.timeline``),
   as the engine's ``Timeline`` reports it.

The first round (no contention) is a true lower bound on the engine's step (``lower_bound_s``):
contention and barriers only delay ops. What the estimate leaves out against the engine: the
barrier that makes a collective shared by several rank classes start on all of them at once
(``estimate`` takes the slowest class's own step), and a fixed point the rounds have not reached
(``GraphEstimate.converged``). It is not trusted (``trusted``) where collectives hold more than
``MAX_TRUSTED_SM_SHARE`` of the SMs at once. ``python -m twin.bench_estimate`` measures the error
against the engine on every bundled scenario and on random valid layouts (288 rows: at most
1.03%, p95 0.14%, of the trusted); the planner lets the engine decide only where an estimate is
within 2% of the best (``twin.planner``). In pure Python it is not cheaper than the engine on
one graph (1.1-1.9x a simulation of the graph): the search saves by needing the rounds rarely
(the lower bound rules most layouts out) and the engine's bookkeeping never.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from scenarios.schema import Scenario
from twin.engine import DEFAULT_MAX_COMM_SM_FRACTION, Span, Timeline
from twin.graph import COMPUTE_STREAM, OpGraph

ROUNDS = 8  # at most; rounds stop once no op end moves by more than TOL_S
TOL_S = 1e-9
DAMPING = 0.5
CONVERGED_REL = 0.005  # a step that still moves more than this between the last rounds is not trusted
# Above this SM share held by collectives at once, compute crawls while they run and the rounds
# swing instead of settling (the CPU entries: gloo collectives hold every core, sm_fraction 1):
# such an estimate is not trusted.
MAX_TRUSTED_SM_SHARE = 0.5
LONG = 8.0  # _Load: an interval this many times its load's median length is kept apart


@dataclass
class GraphEstimate:
    """One graph's estimated schedule: ``start_s[i]`` and ``end_s[i]`` of ``graph.ops[i]``."""

    graph: OpGraph
    start_s: list[float]
    end_s: list[float]
    rounds: int
    converged: bool = True  # the last two rounds' steps within CONVERGED_REL of each other
    peak_sm_share: float = 0.0  # the most SM share collectives held at once (before the cap)
    lower_bound_s: float = 0.0  # the schedule without contention: the engine's step is never below it

    @property
    def trusted(self) -> bool:
        """Whether a search may rule a layout out on this estimate (module docstring)."""
        return self.converged and self.peak_sm_share <= MAX_TRUSTED_SM_SHARE

    @property
    def step_time_s(self) -> float:
        return max(max(self.end_s, default=0.0), self.graph.host_s)

    def timeline(self) -> Timeline:
        """The estimated spans as the engine's ``Timeline`` (its breakdown: exposed comm per stream, ...)."""
        return Timeline.from_spans(
            (Span(op.name, op.stream, s, e, op.op_class, op.phase, op.layer, op.flops, op.bytes, op.axis,
                  op.duration_s, op.kernel) for op, s, e in zip(self.graph.ops, self.start_s, self.end_s)),
            host_s=self.graph.host_s)  # fmt: skip


class _Steps:
    """A right-continuous step function: ``value[j]`` on ``[times[j], times[j+1])``, ``default``
    before the first time and from the last one on."""

    __slots__ = ("times", "values")

    def __init__(self, deltas: list[tuple[float, float]], base: float) -> None:
        deltas.sort()
        self.times: list[float] = []
        self.values: list[float] = []
        level = base
        for t, d in deltas:
            level += d
            if self.times and self.times[-1] == t:
                self.values[-1] = level
            else:
                self.times.append(t)
                self.values.append(level)

    def segment(self, t: float) -> int:
        return bisect.bisect_right(self.times, t) - 1


class _Load:
    """One shared resource (the SMs, a link) in one round: the last round's intervals of its users
    ``(start, end, weight, op)`` and those placed so far in this round (ops are placed in program
    order, which is not time order across streams). Each set is kept sorted by start, its few long
    intervals (over ``LONG`` × the median) apart, so that a query scans back only as far as the
    longest short one."""

    __slots__ = ("old", "new", "cut")

    def __init__(self, users: list[tuple[int, float]], old_s: list[float], old_e: list[float]) -> None:
        olds = [(old_s[i], old_e[i], w, i) for i, w in users if old_e[i] > old_s[i]]
        lengths = sorted(o[1] - o[0] for o in olds)
        self.cut = LONG * lengths[len(lengths) // 2] if lengths else math.inf
        self.old, self.new = _Intervals(self.cut), _Intervals(self.cut)
        for o in sorted(olds):
            self.old.add(o)

    def place(self, s: float, e: float, w: float) -> None:
        self.new.add((s, e, w, -1))

    def around(self, i: int, t: float, horizon: float) -> list[tuple[float, float]]:
        """The load's changes on ``[t, horizon)`` as op ``i`` (placed at ``t``) sees it: the other
        users placed in this round, and those after ``i`` in program order where they last ran."""
        deltas: list[tuple[float, float]] = []
        for x in self.new.overlapping(t, horizon):
            deltas += ((x[0], x[2]), (x[1], -x[2]))
        for o in self.old.overlapping(t, horizon):
            if o[3] > i:
                deltas += ((o[0], o[2]), (o[1], -o[2]))
        return deltas


class _Intervals:
    """Intervals ``(start, end, ...)``: the short ones sorted by start, the long ones apart."""

    __slots__ = ("cut", "short", "starts", "longest", "long")

    def __init__(self, cut: float) -> None:
        self.cut, self.short, self.starts, self.longest, self.long = cut, [], [], 0.0, []

    def add(self, x: tuple) -> None:
        n = x[1] - x[0]
        if n > self.cut:
            self.long.append(x)
            return
        k = bisect.bisect_right(self.starts, x[0])
        self.starts.insert(k, x[0])
        self.short.insert(k, x)
        if n > self.longest:
            self.longest = n

    def overlapping(self, t: float, horizon: float):
        """Those with ``end > t`` and ``start < horizon``."""
        short, k = self.short, bisect.bisect_left(self.starts, t - self.longest)
        n = len(short)
        while k < n:
            x = short[k]
            if x[0] >= horizon:
                break
            if x[1] > t:
                yield x
            k += 1
        for x in self.long:
            if x[1] > t and x[0] < horizon:
                yield x


def _integrate(steps: _Steps, rate_of, t: float, work: float) -> float:
    """The instant at which ``work`` seconds of full-rate work started at ``t`` are done, the rate
    on each segment being ``rate_of(j, level)`` (``j = -1``: before the first change)."""
    times, values = steps.times, steps.values
    j = steps.segment(t)
    n = len(times)
    while True:
        level = values[j] if j >= 0 else None
        rate = rate_of(j, level)
        seg_end = times[j + 1] if j + 1 < n else math.inf
        if rate > 0:
            can = (seg_end - t) * rate
            if can >= work:
                return t + work / rate
            work -= can
        t = seg_end
        j += 1


def estimate_graph(graph: OpGraph, *, max_comm_sm_fraction: float = DEFAULT_MAX_COMM_SM_FRACTION,
                   rounds: int = ROUNDS) -> GraphEstimate:  # fmt: skip
    """The analytic schedule of ``graph`` (module docstring)."""
    ops = graph.ops
    n = len(ops)
    pos = {op.name: i for i, op in enumerate(ops)}
    deps = [tuple(pos[d] for d in op.deps) for op in ops]
    stream_ids: dict[str, int] = {}
    stream = [stream_ids.setdefault(op.stream, len(stream_ids)) for op in ops]
    compute = [op.stream == COMPUTE_STREAM for op in ops]
    dur = [op.duration_s for op in ops]
    sm_ops = [i for i, op in enumerate(ops) if not compute[i] and op.sm_fraction > 0 and op.duration_s > 0]
    links: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        if not compute[i] and op.link:
            links.setdefault(op.link, []).append(i)
    shared = {lk: ix for lk, ix in links.items() if len(ix) > 1}  # alone on a link: no sharing
    link_of = {i: lk for lk, ix in shared.items() for i in ix}

    start, end = _schedule(n, deps, stream, len(stream_ids), lambda i, t: t + dur[i])
    lower = max(end, default=0.0)  # no contention: a lower bound on the engine's step
    done, moved, peak = 1, 0.0, 0.0
    damping, trend = 1.0, 0.0  # undamped until the step swings back
    cap = max_comm_sm_fraction
    sm_f = {i: ops[i].sm_fraction for i in sm_ops}

    def compute_rate(j, level):
        return 1.0 if level is None else 1.0 - min(level, cap)

    while done < rounds and (sm_ops or shared):
        old_s, old_e = start, end
        # what an op shares (the SMs, a link) with the ops already placed in this round (earlier in
        # program order) and with the later ones where the last round put them
        sms = _Load([(i, sm_f[i]) for i in sm_ops], old_s, old_e)
        peak = max(_Steps([d for i in sm_ops if old_e[i] > old_s[i] for d in ((old_s[i], sm_f[i]), (old_e[i], -sm_f[i]))],
                           0.0).values, default=0.0)
        on_link = {lk: _Load([(i, 1.0) for i in ix], old_s, old_e) for lk, ix in shared.items()}

        def link_rate(j, level):
            return 1.0 if level is None else 1.0 / (1.0 + level)

        def run(i: int, t: float) -> float:
            if dur[i] <= 0:
                return t
            if compute[i]:
                deltas = sms.around(i, t, t + dur[i] / (1.0 - cap))
                return _integrate(_Steps(deltas, 0.0), compute_rate, t, dur[i]) if deltas else t + dur[i]
            lk = link_of.get(i)
            if lk is None:
                return t + dur[i]
            load = on_link[lk]
            deltas = load.around(i, t, t + dur[i] * len(shared[lk]))
            return _integrate(_Steps(deltas, 0.0), link_rate, t, dur[i]) if deltas else t + dur[i]

        # damped: each op's duration moves part-way from the last round's to this round's (a
        # collective's start and the compute it slows move each other; undamped, the rounds can
        # swing between two schedules)
        old_d = [e - s for s, e in zip(old_s, old_e)]

        def damped(i: int, t: float) -> float:
            e = t + damping * (run(i, t) - t) + (1.0 - damping) * old_d[i]
            if e > t:
                if i in sm_f:
                    sms.place(t, e, sm_f[i])
                if i in link_of:
                    on_link[link_of[i]].place(t, e, 1.0)
            return e

        start, end = _schedule(n, deps, stream, len(stream_ids), damped)
        done += 1
        last, now = max(old_e, default=0.0), max(end, default=0.0)
        moved = abs(now - last) / now if now > 0 else 0.0
        if (now - last) * trend < 0:  # the step turned: from here on, damped
            damping = DAMPING
        trend = now - last
        if max((abs(a - b) for a, b in zip(end, old_e)), default=0.0) <= TOL_S:
            break
    return GraphEstimate(graph, start, end, done, moved <= CONVERGED_REL, peak, lower)


def _schedule(n: int, deps: list[tuple[int, ...]], stream: list[int], streams: int, run) -> tuple[list, list]:
    """Program order: an op starts when its stream's last op and its deps have ended; ``run(i, t)``
    is its end when it starts at ``t``."""
    start = [0.0] * n
    end = [0.0] * n
    free = [0.0] * streams
    for i in range(n):
        t = free[stream[i]]
        for d in deps[i]:
            if end[d] > t:
                t = end[d]
        start[i] = t
        end[i] = free[stream[i]] = run(i, t)
    return start, end


@dataclass
class Estimate:
    """The estimate of one step of a scenario (one rank at the expected load, in each topology
    position, as ``simulate(s, imbalance=False)`` runs it): the slowest position's numbers."""

    scenario: str
    step_time_s: float
    samples_per_s: float
    mfu: float
    graphs: Mapping[str, GraphEstimate] = field(repr=False)

    @property
    def trusted(self) -> bool:
        """Every position's estimate is trusted (``GraphEstimate.trusted``): a search may rule the
        layout out on it; else it simulates."""
        return all(g.trusted for g in self.graphs.values())

    @property
    def slowest(self) -> GraphEstimate:
        return max(self.graphs.values(), key=lambda g: g.step_time_s)

    def breakdown_s(self) -> dict[str, float]:
        """As ``SimResult.breakdown_s``, of the slowest position."""
        t = self.slowest.timeline()
        return {"compute": t.compute_s - t.slowdown_s, "sm_contention": max(0.0, t.slowdown_s),
                "exposed_comm": t.exposed_comm_s, "overlapped_comm": t.overlapped_comm_s,
                "idle": t.idle_s + (self.step_time_s - t.step_time_s)}

    def exposed_comm_s_split_by_axis(self) -> dict[str, float]:
        """As ``SimResult.exposed_comm_s_split_by_axis``: exposed time per axis, adding up to the total."""
        return {k.removeprefix("comm."): v for k, v in self.slowest.timeline().exposed_comm_s_split_by_stream().items()}


def class_graphs(s: Scenario, *, calibration=None, first: bool = False,
                 have: Mapping[str, OpGraph] | None = None) -> dict[str, OpGraph]:  # fmt: skip
    """The graphs ``simulate(s, imbalance=False)`` runs (one rank at the expected load in each
    topology position), by class name: ``simulate_timelines(built=)`` takes them back, so that a
    search that estimates first and simulates only where it must builds each graph once.
    ``first``: only the first (the most common position's): any one class's lower bound bounds the
    step, so a search can try it before building the others. ``have``: graphs already built."""
    from twin.simulate import _classes
    from twin.workload import Hardware, build_graph

    hw = Hardware.of(s, calibration)
    classes, _ = _classes(s, hw, per_rank=False, imbalance=False)
    have = have or {}
    return {c.name: have[c.name] if c.name in have else build_graph(s, hw, c.seq, c.shapes)
            for c in classes[:1 if first else None]}  # fmt: skip


def lower_bound_s(graphs: Mapping[str, OpGraph]) -> float:
    """A lower bound on the engine's step of these class graphs: the slowest class's schedule with
    no contention (contention and the barriers between classes only delay ops)."""
    return max(lower_bound_parts(graphs))


def lower_bound_parts(graphs: Mapping[str, OpGraph]) -> tuple[float, float]:
    """``lower_bound_s`` as (the devices' part, the host's issue time): the step is at least the
    larger of the two (``twin.fold`` extends each on its own line)."""
    return (max((_free_end_s(g) for g in graphs.values()), default=0.0),
            max((g.host_s for g in graphs.values()), default=0.0))  # fmt: skip


def _free_end_s(graph: OpGraph) -> float:
    """The end of ``graph``'s schedule with no contention: ``estimate_graph``'s first round
    (``_schedule``, each op at its isolated duration), the same sums, without the rest of its
    set-up (a planner asks for it on every candidate it does not rule out sooner)."""
    end: dict[str, float] = {}
    free: dict[str, float] = {}
    last = 0.0
    for op in graph.ops:
        t = free.get(op.stream, 0.0)
        for d in op.deps:
            if end[d] > t:
                t = end[d]
        end[op.name] = free[op.stream] = e = t + op.duration_s
        if e > last:
            last = e
    return last


def estimate(s: Scenario, *, calibration=None, graphs: Mapping[str, OpGraph] | None = None) -> Estimate:
    """Estimate the step of ``s`` as ``simulate(s, imbalance=False)`` would simulate it (``graphs``:
    its ``class_graphs``, when already built)."""
    from twin.simulate import model_flops_per_step
    from twin.workload import Hardware

    hw = Hardware.of(s, calibration)
    graphs = graphs if graphs is not None else class_graphs(s, calibration=calibration)
    est = {name: estimate_graph(g) for name, g in graphs.items()}
    step = max(g.step_time_s for g in est.values())
    dtype = s.hardware.mfu_peak_dtype
    peak = hw.gpu.peak("fp8" if dtype == "mxfp8" else dtype)
    return Estimate(s.name, step, s.training.global_batch / step,
                    model_flops_per_step(s) / (step * s.hardware.num_gpus * peak), est)


__all__ = ["Estimate", "GraphEstimate", "class_graphs", "estimate", "estimate_graph", "lower_bound_parts",
           "lower_bound_s"]
