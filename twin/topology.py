"""Topology-position rank classes: ranks whose groups lie differently on the fabric.

With an aligned mesh (each axis's group a divisor or a multiple of the tiers' domains) every group
of an axis crosses the same tiers in the same way, and one representative rank stands for all.
When an axis does not align (a ``sparse_shard`` group of 12 on 8-GPU NVLink domains, split 8+4
or 4+8; groups that straddle a leaf boundary while their neighbours do not), ranks differ in
which tiers their groups cross, how many links cross in parallel, how many peers sit behind each
tier and how loaded the uplinks are (``hwmodels.groups``). Each distinct combination over the
axes is a topology class, priced with its own group shapes; ``twin.simulate`` runs the load
classes (``twin.imbalance``) in the most common position and every other position at the
straggler's load, and since the classes' collectives of one name start together
(``twin.engine.simulate_ranks``), the step waits for the slowest.

Method (one vectorised pass over the ranks per misaligned axis, no per-GPU simulation):
1. per axis, ``hwmodels.groups.axis_layout``: the distinct group shapes and each rank's;
2. shapes of an axis whose probe cost (an all-to-all plus an all-reduce of ``PROBE_BYTES``) is
   within ``MERGE_TOLERANCE`` of a slower one are merged into it (a leaf- or a spine-crossing
   split of equal bandwidth costs the same to a few percent);
3. each rank's class is its tuple of shapes over the axes; at most ``MAX_CLASSES``: the
   ``MAX_CLASSES - 1`` most common stay, the rest fold into one class that takes, per axis, the
   costliest of their shapes (conservative).
See hwmodels/GROUPS.md for the shapes, the congestion rule and the checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hwmodels.collectives import collective_cost
from hwmodels.groups import AxisLayout, GroupShape, axis_layout
from hwmodels.network import NetworkPreset
from scenarios.memo import memo
from scenarios.placement import axis_group
from scenarios.schema import Scenario
from scenarios.vocab import COMM_GROUPS

MAX_CLASSES = 4
MERGE_TOLERANCE = 0.05
PROBE_BYTES = 16 << 20


@dataclass(frozen=True)
class TopologyClass:
    """Ranks whose groups lie alike: ``shapes``, their group's shape per axis (of more than one rank)."""

    name: str
    weight: float  # share of ranks
    shapes: dict[str, GroupShape] = field(default_factory=dict)


_CLASSES: dict = {}  # scenarios.memo's table


def topology_classes(s: Scenario, network: NetworkPreset) -> tuple[list[TopologyClass], np.ndarray | None]:
    """The scenario's topology classes, most common first, and each rank's class (None: one class).
    Once per network, GPU count and group layout (each axis's size and stride: all they read, with
    ``MAX_CLASSES`` and ``MERGE_TOLERANCE``; a plan asks for thousands of layouts that share a
    few). Callers must not change the result."""
    groups = tuple(axis_group(s, axis) for axis in COMM_GROUPS)
    key = (s.hardware.num_gpus, groups, MAX_CLASSES, MERGE_TOLERANCE)
    return memo(_CLASSES, (network,), key, lambda: _topology_classes(s, network), cap=256)


def _topology_classes(s: Scenario, network: NetworkPreset) -> tuple[list[TopologyClass], np.ndarray | None]:
    n = s.hardware.num_gpus
    shapes: dict[str, list[GroupShape]] = {}
    costs: dict[str, list[float]] = {}
    ids: dict[str, np.ndarray] = {}
    alike: dict[str, GroupShape] = {}  # axes whose groups all have one shape
    for axis in COMM_GROUPS:
        size, stride = axis_group(s, axis)
        if size <= 1:
            continue
        layout = axis_layout(network, size=size, stride=stride, num_gpus=n)
        if layout.rank_shape is None:
            alike[axis] = layout.shapes[0]
        else:
            shapes[axis], costs[axis], ids[axis] = _merge(network, layout, stride)
    if not ids:
        return [TopologyClass("all", 1.0, alike)], None
    key = np.zeros(n, dtype=np.int64)
    for axis in ids:  # mixed radix: one integer per combination of shapes
        key = key * len(shapes[axis]) + ids[axis]
    combos, of_rank, counts = _unique(key, int(np.prod([len(shapes[axis]) for axis in ids])))
    order = np.argsort(-counts, kind="stable")
    keep = order[:MAX_CLASSES] if len(combos) <= MAX_CLASSES else order[:MAX_CLASSES - 1]
    classes = [TopologyClass(f"topo{i}", float(counts[c] / n), alike | _decode(combos[c], shapes))
               for i, c in enumerate(keep)]  # fmt: skip
    rank_class = _renumber(of_rank.ravel(), keep)
    if len(combos) > len(keep):  # fold the rest: per axis, the costliest shape among them
        rest = rank_class == len(keep)
        folded = {a: shapes[a][max(np.unique(ids[a][rest]).tolist(), key=lambda i: costs[a][i])] for a in ids}
        classes.append(TopologyClass(f"topo{len(keep)}", float(rest.mean()), alike | folded))
    return classes, rank_class


def _unique(key: np.ndarray, combinations: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(key, return_inverse=True, return_counts=True)`` for keys in ``[0,
    combinations)``, a few: by counting, not sorting the ranks (a planner asks for thousands of
    layouts of up to 100k GPUs)."""
    all_counts = np.bincount(key, minlength=combinations)
    combos = np.flatnonzero(all_counts)
    index = np.zeros(combinations, dtype=np.intp)
    index[combos] = np.arange(len(combos), dtype=np.intp)
    return combos, index[key], all_counts[combos]


def _decode(key: int, shapes: dict[str, list[GroupShape]]) -> dict[str, GroupShape]:
    out = {}
    for axis in reversed(list(shapes)):
        key, i = divmod(int(key), len(shapes[axis]))
        out[axis] = shapes[axis][i]
    return dict(reversed(out.items()))


def _renumber(of_rank: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Each rank's position in ``keep`` (the kept combinations); len(keep) for folded ones."""
    pos = np.full(int(of_rank.max()) + 1, len(keep), dtype=np.int32)
    pos[keep] = np.arange(len(keep), dtype=np.int32)
    return pos[of_rank]


def _merge(network: NetworkPreset, layout: AxisLayout, stride: int
           ) -> tuple[list[GroupShape], list[float], np.ndarray]:
    """Merge shapes whose probe cost is within MERGE_TOLERANCE of a slower one; the kept shapes
    (slowest first), their probe costs, and each rank's index among them."""
    cost = [_probe(network, sh, stride) for sh in layout.shapes]
    kept: list[int] = []
    into = {}
    for i in sorted(range(len(cost)), key=lambda i: (-cost[i], i)):
        if kept and cost[i] * (1 + MERGE_TOLERANCE) >= cost[kept[-1]]:
            into[i] = len(kept) - 1
        else:
            kept.append(i)
            into[i] = len(kept) - 1
    remap = np.array([into[i] for i in range(len(cost))], dtype=np.int32)
    return [layout.shapes[i] for i in kept], [cost[i] for i in kept], remap[layout.rank_shape]


def _probe(network: NetworkPreset, shape: GroupShape, stride: int) -> float:
    """A shape's cost index: an all-to-all and an all-reduce of PROBE_BYTES over its group."""
    return sum(collective_cost(kind=k, msg_bytes=PROBE_BYTES, group_size=shape.size, stride=stride,
                               network=network, shape=shape).time_s for k in ("all_to_all", "all_reduce"))
