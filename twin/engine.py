"""Discrete-event engine: run one rank's op graph on simpy and return its timeline.

Model (see ENGINE.md): one simpy process per stream, running the stream's ops in program order;
an op starts once the previous op on its stream and all its deps have finished (each op owns a
``done`` event). Collectives run for their isolated ``duration_s``. While SM-based collectives
run, the compute stream progresses at rate ``1 - min(sum of their sm_fraction, cap)``.
Everything lives in one ``simpy.Environment`` per call: runs are independent and deterministic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass

import simpy

from twin.graph import COMPUTE_STREAM, Op, OpGraph

DEFAULT_MAX_COMM_SM_FRACTION = 0.9


@dataclass(frozen=True, slots=True)
class Span:
    """One op as it ran: [start_s, end_s) on its stream."""

    name: str
    stream: str
    start_s: float
    end_s: float
    op_class: str = "other"
    phase: str = "fwd"
    layer: str = ""
    flops: float = 0.0
    bytes: float = 0.0
    axis: str = ""
    isolated_duration_s: float = 0.0  # the op's duration_s without contention
    kernel: str = ""  # kernel kind of a compute op

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def is_compute(self) -> bool:
        return self.stream == COMPUTE_STREAM


@dataclass(frozen=True)
class Timeline:
    """Spans of one step in program order, and the step's time breakdown (all in seconds).

    Build with ``Timeline.from_spans``, which computes every field after ``spans``.
    """

    spans: tuple[Span, ...]
    step_time_s: float  # last end, or host_s when that is later (0 for an empty step)
    compute_s: float  # busy time of the compute stream, contention included
    comm_s: float  # busy time summed over comm streams
    comm_s_by_stream: dict[str, float]
    exposed_comm_s: float  # some comm stream busy while the compute stream is idle
    overlapped_comm_s: float  # some comm stream busy while the compute stream is busy
    idle_s: float  # no stream busy, within [0, step_time_s]
    compute_s_by_op_class: dict[str, float]  # as run: SM contention included
    isolated_compute_s_by_op_class: dict[str, float]  # each op at its isolated duration
    compute_s_by_phase: dict[str, float]
    compute_s_by_kernel: dict[str, float]
    slowdown_s: float  # extra compute time caused by SM contention
    host_s: float = 0.0  # the host's time to issue the step (OpGraph.host_s): a floor under step_time_s

    @classmethod
    def from_spans(cls, spans: Iterable[Span], *, host_s: float = 0.0) -> Timeline:
        """The timeline of ``spans``; ``host_s``: the host's time to issue them, which the step
        cannot be shorter than (the time past the last span is idle)."""
        spans = tuple(spans)
        compute = [s for s in spans if s.is_compute]
        comm = [s for s in spans if not s.is_compute]
        compute_busy = _union(compute)
        comm_busy = _union(comm)
        step_time_s = max(max((s.end_s for s in spans), default=0.0), host_s)
        overlapped_s = _length(_intersect(compute_busy, comm_busy))
        return cls(
            spans=spans,
            step_time_s=step_time_s,
            compute_s=_busy_s(compute),
            comm_s=_busy_s(comm),
            comm_s_by_stream=_sum_by(comm, "stream"),
            exposed_comm_s=_length(comm_busy) - overlapped_s,
            overlapped_comm_s=overlapped_s,
            idle_s=step_time_s - _length(_union(spans)),
            compute_s_by_op_class=_sum_by(compute, "op_class"),
            isolated_compute_s_by_op_class=_sum_by(compute, "op_class", "isolated_duration_s"),
            compute_s_by_phase=_sum_by(compute, "phase"),
            compute_s_by_kernel=_sum_by(compute, "kernel"),
            slowdown_s=sum(s.duration_s - s.isolated_duration_s for s in compute),
            host_s=host_s,
        )

    def exposed_comm_s_by_stream(self) -> dict[str, float]:
        """Per comm stream: time it is busy while the compute stream is idle (overlaps between
        comm streams count for each of them, so the values can add up to more than
        ``exposed_comm_s``)."""
        compute = _union(s for s in self.spans if s.is_compute)
        out: dict[str, float] = {}
        for stream in dict.fromkeys(s.stream for s in self.spans if not s.is_compute):
            busy = _union(s for s in self.spans if s.stream == stream)
            out[stream] = _length(busy) - _length(_intersect(busy, compute))
        return out

    def exposed_comm_s_split_by_stream(self) -> dict[str, float]:
        """Per comm stream: its split of ``exposed_comm_s``. Where several comm streams are busy
        at once over idle compute, the interval is split evenly among them, so the values add
        up to ``exposed_comm_s`` (to float rounding)."""
        events: list[tuple[float, int, str]] = []  # (time, +1 start / -1 end, stream)
        for s in self.spans:
            if s.end_s > s.start_s:
                events += [(s.start_s, 1, s.stream), (s.end_s, -1, s.stream)]
        events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
        busy: defaultdict[str, int] = defaultdict(int)
        out = dict.fromkeys((s.stream for s in self.spans if not s.is_compute), 0.0)
        last_s = 0.0
        for t, delta, stream in events:
            if t > last_s and busy[COMPUTE_STREAM] == 0:
                running = [k for k, n in busy.items() if n > 0 and k != COMPUTE_STREAM]
                for k in running:
                    out[k] += (t - last_s) / len(running)
            busy[stream] += delta
            last_s = t
        return out

    def span(self, name: str) -> Span:
        """The span of op ``name`` (linear search; for tests and reports)."""
        for s in self.spans:
            if s.name == name:
                return s
        raise KeyError(name)


def simulate_graph(
    graph: OpGraph, *, max_comm_sm_fraction: float = DEFAULT_MAX_COMM_SM_FRACTION
) -> Timeline:
    """Run ``graph`` to completion in a fresh ``simpy.Environment`` and return its timeline.

    ``max_comm_sm_fraction`` caps the SM share all running collectives together take from compute
    (so compute always keeps at least ``1 - cap`` of the GPU).
    """
    return simulate_ranks({"rank": graph}, max_comm_sm_fraction=max_comm_sm_fraction)["rank"]


def simulate_ranks(
    graphs: Mapping[str, OpGraph], *, max_comm_sm_fraction: float = DEFAULT_MAX_COMM_SM_FRACTION
) -> dict[str, Timeline]:
    """Run several ranks' graphs together; collectives of the same name synchronise across them.

    Each rank has its own streams and its own SM load. A collective (an op off the compute
    stream) that appears in several ranks' graphs starts on all of them at once, when the last
    of them is ready: a fast rank waits for the slowest (its span starts late; the wait is the
    straggler's cost, visible as the gap before the span). Ranks stand for classes of
    equivalent GPUs, so a collective's duration is its own and does not grow with the classes.
    """
    if not 0 <= max_comm_sm_fraction < 1:
        raise ValueError(
            f"max_comm_sm_fraction ({max_comm_sm_fraction}) must be in [0, 1); "
            "compute must keep some SMs"
        )
    env = simpy.Environment()
    barriers = _barriers(env, graphs)
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for rank, graph in graphs.items():
        load = _SmLoad(env, max_comm_sm_fraction)
        links = _LinkLoad(env)
        done = {op.name: env.event() for op in graph}
        out[rank] = times = {}
        for ops in graph.by_stream().values():
            env.process(_run_stream(env, ops, done, load, links, times, barriers))
    env.run()
    timelines = {}
    for rank, graph in graphs.items():
        times = out[rank]
        if len(times) != len(graph):  # cannot happen for validated graphs; guard the invariant
            raise RuntimeError(f"engine stalled on {rank} after {len(times)} of {len(graph)} ops")
        timelines[rank] = Timeline.from_spans((_span(op, *times[op.name]) for op in graph), host_s=graph.host_s)
    return timelines


class _Barrier:
    """All ranks holding a collective must arrive before it starts on any of them."""

    __slots__ = ("waiting", "released")

    def __init__(self, env: simpy.Environment, members: int) -> None:
        self.waiting = members
        self.released = env.event()

    def arrive(self) -> simpy.Event:
        self.waiting -= 1
        if self.waiting == 0:
            self.released.succeed()
        return self.released


def _barriers(env: simpy.Environment, graphs: Mapping[str, OpGraph]) -> dict[str, _Barrier]:
    members: defaultdict[str, int] = defaultdict(int)
    for graph in graphs.values():
        for op in graph:
            if not op.is_compute:
                members[op.name] += 1
    return {name: _Barrier(env, n) for name, n in members.items() if n > 1}


class _SmLoad:
    """SM share taken by running collectives, and an event that fires whenever it changes."""

    __slots__ = ("_env", "_cap", "_running", "changed")

    def __init__(self, env: simpy.Environment, cap: float) -> None:
        self._env = env
        self._cap = cap
        self._running: dict[str, float] = {}  # op name -> sm_fraction
        self.changed: simpy.Event = env.event()

    def compute_rate(self) -> float:
        """Work done per second by the compute stream now (1 with no SM-based collective)."""
        return 1.0 - min(sum(self._running.values()), self._cap)

    def start(self, op: Op) -> None:
        self._running[op.name] = op.sm_fraction
        self._notify()

    def finish(self, op: Op) -> None:
        del self._running[op.name]
        self._notify()

    def _notify(self) -> None:
        fired, self.changed = self.changed, self._env.event()
        fired.succeed()


def _run_stream(
    env: simpy.Environment,
    ops: Sequence[Op],
    done: dict[str, simpy.Event],
    load: _SmLoad,
    links: _LinkLoad,
    times: dict[str, tuple[float, float]],
    barriers: Mapping[str, _Barrier],
) -> Generator[simpy.Event, object, None]:
    """Process of one stream: for each op in program order, wait for its deps, then run it.

    Timing: an op starts at the instant its last dep (or its stream predecessor) ends — a
    collective shared with other ranks also waits for them; no launch latency, no gaps.
    """
    for op in ops:
        for dep in op.deps:
            if not done[dep].processed:
                yield done[dep]
        barrier = barriers.get(op.name) if not op.is_compute else None
        if barrier is not None:
            released = barrier.arrive()
            if not released.processed:
                yield released
        start_s = float(env.now)
        if op.is_compute:
            yield from _run_compute(env, op, load)
        else:
            yield from _run_collective(env, op, load, links)
        times[op.name] = (start_s, float(env.now))
        done[op.name].succeed()


class _LinkLoad:
    """Collectives running on each network link (tier) of one rank, and a change event per link."""

    __slots__ = ("_env", "_running", "_changed")

    def __init__(self, env: simpy.Environment) -> None:
        self._env = env
        self._running: defaultdict[str, int] = defaultdict(int)
        self._changed: dict[str, simpy.Event] = {}

    def share(self, link: str) -> float:
        """Fraction of the link one of its running collectives gets (equal shares)."""
        return 1.0 / max(self._running[link], 1)

    def changed(self, link: str) -> simpy.Event:
        if link not in self._changed:
            self._changed[link] = self._env.event()
        return self._changed[link]

    def start(self, link: str) -> None:
        self._running[link] += 1
        self._notify(link)

    def finish(self, link: str) -> None:
        self._running[link] -= 1
        self._notify(link)

    def _notify(self, link: str) -> None:
        fired = self._changed.pop(link, None)
        if fired is not None:
            fired.succeed()


def _run_collective(
    env: simpy.Environment, op: Op, load: _SmLoad, links: _LinkLoad
) -> Generator[simpy.Event, object, None]:
    """A collective does ``duration_s`` of work at full link rate; while it runs it holds
    ``op.sm_fraction`` SMs.

    Timing: collectives on the same ``link`` share it equally (progress-based, as compute shares
    SMs: each segment runs at 1/n of the link until a collective on it starts or ends); one
    without a link, or alone on its link, takes its isolated duration. Compute does not slow
    collectives down. The whole duration is shared, latency included (a simplification).
    """
    holds_sms = op.sm_fraction > 0 and op.duration_s > 0
    if holds_sms:
        load.start(op)
    if not op.link:
        yield env.timeout(op.duration_s)
    else:
        links.start(op.link)
        remaining_s = op.duration_s
        while remaining_s > 0:
            rate, segment_start_s = links.share(op.link), env.now
            segment_s = remaining_s / rate
            yield env.timeout(segment_s) | links.changed(op.link)
            if env.now >= segment_start_s + segment_s:
                break
            remaining_s -= (env.now - segment_start_s) * rate
        links.finish(op.link)
    if holds_sms:
        load.finish(op)


def _run_compute(
    env: simpy.Environment, op: Op, load: _SmLoad
) -> Generator[simpy.Event, object, None]:
    """A compute op does ``duration_s`` seconds of full-rate work, at the rate the SMs allow.

    Method (progress-based): the op runs in segments of constant rate. Each segment waits for
    either the op's end at the current rate or a change of the SM load (a collective starting or
    ending), whichever comes first. On a change, the work done in the segment
    (elapsed × rate) is subtracted and a new segment starts at the new rate. So an op is slowed
    only for the part of its run that overlaps SM-based collectives.
    """
    remaining_s = op.duration_s  # work left, in seconds at full rate
    while remaining_s > 0:
        rate = load.compute_rate()
        segment_start_s = env.now
        segment_s = remaining_s / rate
        yield env.timeout(segment_s) | load.changed
        if env.now >= segment_start_s + segment_s:  # same float expression as the timeout's time
            return
        remaining_s -= (env.now - segment_start_s) * rate


def _span(op: Op, start_s: float, end_s: float) -> Span:
    return Span(
        name=op.name,
        stream=op.stream,
        start_s=start_s,
        end_s=end_s,
        op_class=op.op_class,
        phase=op.phase,
        layer=op.layer,
        flops=op.flops,
        bytes=op.bytes,
        axis=op.axis,
        isolated_duration_s=op.duration_s,
        kernel=op.kernel,
    )


# -- interval arithmetic on sorted, disjoint [start, end) lists ---------------------------------

Interval = tuple[float, float]


def _union(spans: Iterable[Span]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted((s.start_s, s.end_s) for s in spans if s.end_s > s.start_s):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def _busy_s(spans: Iterable[Span]) -> float:
    return sum(s.duration_s for s in spans)


def _sum_by(spans: Iterable[Span], key: str, value: str = "duration_s") -> dict[str, float]:
    totals: defaultdict[str, float] = defaultdict(float)
    for s in spans:
        totals[getattr(s, key)] += getattr(s, value)
    return dict(totals)
