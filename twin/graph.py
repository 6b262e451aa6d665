"""The op graph of one training step, for one representative rank.

Ops are listed in program order. Each op runs on one stream: ``"compute"`` (the GPU's SMs) or a
communication channel (any other name, by convention ``"comm.<axis>"``). Streams behave like
CUDA streams: a stream runs its ops one at a time in program order, and an op starts once the
previous op on its stream and all of its ``deps`` have finished. A dep must come earlier in
program order, so every graph that validates is acyclic and cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

COMPUTE_STREAM = "compute"


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel or collective of the step.

    ``duration_s`` is the isolated duration (no contention). ``bytes`` is HBM traffic for compute
    ops and the message size for collectives. ``sm_fraction`` is the share of the GPU's SMs a
    collective occupies while it runs (0 for compute ops and SM-free collectives).
    """

    name: str
    stream: str
    duration_s: float
    deps: tuple[str, ...] = ()
    op_class: str = "other"
    phase: str = "fwd"
    layer: str = ""
    flops: float = 0.0
    bytes: float = 0.0
    axis: str = ""
    sm_fraction: float = 0.0
    link: str = ""  # network tier a collective crosses; concurrent collectives on it share it
    kernel: str = ""  # kernel kind of a compute op (e.g. attention.gdpa), for calibration

    @property
    def is_compute(self) -> bool:
        return self.stream == COMPUTE_STREAM


class OpGraph:
    """Ops of one step in program order, validated on construction (see ``_validate``)."""

    __slots__ = ("_ops", "_index", "host_s")

    def __init__(self, ops: Iterable[Op], *, host_s: float = 0.0) -> None:
        self.host_s = host_s  # the host's time to issue the ops (0 where it never bounds the step)
        self._ops: tuple[Op, ...] = tuple(ops)
        self._index: dict[str, int] = _index_names(self._ops)
        for position, op in enumerate(self._ops):
            _validate_op(op, position, self._index)

    @property
    def ops(self) -> tuple[Op, ...]:
        return self._ops

    def __len__(self) -> int:
        return len(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self._ops)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __getitem__(self, name: str) -> Op:
        return self._ops[self._index[name]]

    def position(self, name: str) -> int:
        """Index of op ``name`` in program order."""
        return self._index[name]

    def streams(self) -> tuple[str, ...]:
        """Stream names in order of first appearance."""
        return tuple(dict.fromkeys(op.stream for op in self._ops))

    def by_stream(self) -> dict[str, tuple[Op, ...]]:
        """Ops of each stream in program order, streams in order of first appearance."""
        grouped: dict[str, list[Op]] = {stream: [] for stream in self.streams()}
        for op in self._ops:
            grouped[op.stream].append(op)
        return {stream: tuple(ops) for stream, ops in grouped.items()}

    def total_duration(self, stream: str | None = None) -> float:
        """Sum of isolated durations in seconds, of one stream or of all."""
        return sum(op.duration_s for op in self._ops if stream is None or op.stream == stream)

    def total_flops(self) -> float:
        return sum(op.flops for op in self._ops)


def _index_names(ops: tuple[Op, ...]) -> dict[str, int]:
    index: dict[str, int] = {}
    for position, op in enumerate(ops):
        if not isinstance(op.name, str) or not op.name:
            raise ValueError(f"op #{position}: name ({op.name!r}) must be a non-empty string")
        if op.name in index:
            raise ValueError(
                f"op {op.name!r} (#{position}): duplicate name, first used by op "
                f"#{index[op.name]}; give each op a unique name"
            )
        index[op.name] = position
    return index


def _validate_op(op: Op, position: int, index: dict[str, int]) -> None:
    """One-line ValueError naming the op, the field, the value and the fix."""
    if not op.stream:
        raise ValueError(f"op {op.name!r}: stream is empty; use 'compute' or a comm channel name")
    if not op.duration_s >= 0:  # also rejects NaN
        raise ValueError(f"op {op.name!r}: duration_s ({op.duration_s}) must be >= 0")
    if not 0 <= op.sm_fraction <= 1:
        raise ValueError(f"op {op.name!r}: sm_fraction ({op.sm_fraction}) must be in [0, 1]")
    if op.is_compute and op.sm_fraction != 0:
        raise ValueError(
            f"op {op.name!r}: sm_fraction ({op.sm_fraction}) must be 0 on the compute stream; "
            "only collectives take SMs away from compute"
        )
    for dep in op.deps:
        _validate_dep(op, position, dep, index)


def _validate_dep(op: Op, position: int, dep: str, index: dict[str, int]) -> None:
    if dep not in index:
        raise ValueError(f"op {op.name!r}: dep {dep!r} is not an op of the graph; check the name")
    if index[dep] >= position:
        raise ValueError(
            f"op {op.name!r} (#{position}): dep {dep!r} (#{index[dep]}) is not earlier in "
            "program order; list every op after the ops it depends on"
        )
