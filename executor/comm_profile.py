"""Profiler events → collective time per mesh axis, busy and exposed (what the twin's
``comm_s_by_axis`` and ``exposed_comm_s_by_axis`` predict).

Which axis a collective ran on comes from where it was issued:

- inside a ``record_function("comm.<axis>")`` range (``comm_region``: the executor's own
  collectives, named like the twin's comm streams: ``comm.expert``, ``comm.sparse_shard`` ...);
- inside FSDP2's ranges, ``FSDP::<what> (<module fqn>)``: the unit's shard axis for its
  all-gathers and reduce-scatters, its replicate axis for the all-reduce of HSDP
  (``fsdp_axes``: each unit's pair, from ``executor.parallelize``; unknown units are dense);
- elsewhere, ``world`` (the loop's own: the loss, the measurements).

How long it ran, and whether compute hid it:

- **CUDA**: a collective is its NCCL kernels (the GPU events the ``c10d::`` op launched, by the
  profiler's correlation ids); compute is every other kernel. Overlapped time is the part of a
  collective's kernels during which some compute kernel ran; the rest is exposed.
- **CPU (gloo)**: gloo runs a collective on its own worker threads (``gloo:<kind>`` events),
  issued by a ``c10d::`` op on the training thread. Each gloo event is paired with the earliest
  unpaired ``c10d::`` op of its kind issued before it (same payload size preferred): gloo runs
  one group's collectives in issue order. Compute is the training thread's outermost
  ``aten::`` ops; a collective's time while none of them ran is exposed (the thread waited).

Every figure is seconds per step over the profiled steps, this rank's.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from torch.autograd import DeviceType
from torch.profiler import record_function

COMM_PREFIX = "comm."
_FSDP = re.compile(r"^FSDP::(\w+) \((.*)\)$")
# the c10d op kinds, and the gloo worker event each one runs as (gloo reduce-scatters by all-reduce)
_C10D = {"allgather": "all_gather", "_allgather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
         "reduce_scatter": "all_reduce", "_reduce_scatter_base": "all_reduce",
         "reduce_scatter_tensor_coalesced": "all_reduce", "allreduce": "all_reduce",
         "allreduce_coalesced": "all_reduce", "alltoall_base": "all_to_all", "alltoall": "all_to_all",
         "broadcast": "broadcast", "barrier": "barrier", "gather": "gather", "scatter": "scatter"}  # fmt: skip
_REDUCE_KINDS = ("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced")


def comm_region(axis: str):
    """``record_function("comm.<axis>")``: the collectives issued inside count for ``axis``."""
    return record_function(COMM_PREFIX + str(axis))


@dataclass
class AxisComm:
    """One axis's collectives, seconds per step."""

    busy_s: float = 0.0
    exposed_s: float = 0.0
    count: float = 0.0

    @property
    def overlapped_s(self) -> float:
        return self.busy_s - self.exposed_s


@dataclass
class CommProfile:
    by_axis: dict[str, AxisComm] = field(default_factory=dict)

    def busy(self) -> dict[str, float]:
        return {a: c.busy_s for a, c in sorted(self.by_axis.items())}

    def exposed(self) -> dict[str, float]:
        return {a: c.exposed_s for a, c in sorted(self.by_axis.items())}

    def overlapped(self) -> dict[str, float]:
        return {a: c.overlapped_s for a, c in sorted(self.by_axis.items())}


def _c10d_kind(name: str) -> str | None:
    if not name.startswith("c10d::"):
        return None
    kind = name.removeprefix("c10d::").rstrip("_")
    return kind if kind in _C10D else None


def _ancestors(e):
    while e is not None:
        yield e
        e = e.cpu_parent


def axis_of(op, fsdp_axes: dict[str, tuple[str, str]]) -> str:
    """The mesh axis of the collective ``c10d::`` op ``op`` (see the module docstring)."""
    kind = _c10d_kind(op.name) or ""
    for a in _ancestors(op):
        if a.name.startswith(COMM_PREFIX):
            return a.name.removeprefix(COMM_PREFIX)
        if m := _FSDP.match(a.name):
            shard, replicate = fsdp_axes.get(m.group(2), ("dense_shard", "dense_replicate"))
            return replicate if kind.startswith("allreduce") else shard
    return "world"


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _covered(span: tuple[float, float], union: list[tuple[float, float]]) -> float:
    s, e = span
    return sum(max(0.0, min(e, b) - max(s, a)) for a, b in union if a < e and b > s)


def collective_times(prof, *, per_steps: int, device: str = "cpu",
                     fsdp_axes: dict[str, tuple[str, str]] | None = None) -> CommProfile:
    """Busy and exposed collective seconds per step, per mesh axis (module docstring)."""
    fsdp_axes = fsdp_axes or {}
    events = list(prof.events())
    spans = _cuda_spans(events) if device == "cuda" else _gloo_spans(events)
    comm, compute = spans
    union = _union(compute)
    out: dict[str, AxisComm] = defaultdict(AxisComm)
    n = max(per_steps, 1)
    for op, (s, e) in comm:
        c = out[axis_of(op, fsdp_axes)]
        c.busy_s += (e - s) * 1e-6 / n
        c.exposed_s += (e - s - _covered((s, e), union)) * 1e-6 / n
        c.count += 1 / n
    return CommProfile(dict(out))


def _cuda_spans(events):
    """((issuing c10d op, NCCL kernel span), ...) and the compute kernels' spans, in µs."""
    cpu = {e.id: e for e in events if e.device_type == DeviceType.CPU}
    comm, compute = [], []
    for k in events:
        if k.device_type != DeviceType.CUDA:
            continue
        span = (k.time_range.start, k.time_range.end)
        if "nccl" not in k.name.lower():
            compute.append(span)
            continue
        op = cpu.get(k.linked_correlation_id)
        while op is not None and _c10d_kind(op.name) is None:
            op = op.cpu_parent
        if op is not None:
            comm.append((op, span))
    return comm, compute


def _gloo_spans(events):
    """((issuing c10d op, gloo worker span), ...) and the training thread's compute spans, in µs."""
    ops = sorted((e for e in events if e.device_type == DeviceType.CPU and _c10d_kind(e.name)),
                 key=lambda e: e.time_range.start)  # fmt: skip
    work = sorted((e for e in events if e.name.startswith("gloo:")), key=lambda e: e.time_range.start)
    threads = {op.thread for op in ops}
    compute = [(e.time_range.start, e.time_range.end) for e in events
               if e.device_type == DeviceType.CPU and e.thread in threads and e.name.startswith("aten::")
               and not any(a.name.startswith("aten::") for a in _ancestors(e.cpu_parent))]  # fmt: skip
    free = list(ops)
    comm = []
    for w in work:
        kind = w.name.removeprefix("gloo:")
        size = _numel(w.input_shapes[0]) if w.input_shapes else None
        cands = [o for o in free if _C10D[_c10d_kind(o.name)] == kind and o.time_range.start <= w.time_range.start]
        if not cands:
            continue
        sized = [o for o in cands if size is not None and _payload(o) == size]
        op = (sized or cands)[0]
        free.remove(op)
        comm.append((op, (w.time_range.start, w.time_range.end)))
    return comm, compute


def _numel(shape) -> int | None:
    if not shape:
        return None
    n = 1
    for d in shape:
        n *= d
    return n


def _payload(op) -> int | None:
    """The elements gloo's worker is handed: the input (reduce-scatter: the full input, which
    gloo all-reduces; all-gather: this rank's part)."""
    shapes = [s for s in op.input_shapes if s]
    if not shapes:
        return None
    kind = _c10d_kind(op.name)
    if kind in ("_allgather_base", "allgather_into_tensor_coalesced"):
        return _numel(shapes[1]) if len(shapes) > 1 else None
    if kind in _REDUCE_KINDS:
        return _numel(shapes[1]) if len(shapes) > 1 else None
    return _numel(shapes[0])
