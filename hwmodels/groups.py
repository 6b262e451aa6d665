"""Where the rank groups of one mesh axis sit on the tiers: their shapes, and who shares an uplink.

A collective's cost depends on how its group lies on the fabric (see GROUPS.md beside this file):
which tiers it crosses, how many of its ranks sit in each inner domain (the links its rings get
in parallel), how many peers each member reaches through each tier (the all-to-all's bytes and
per-peer latency), and how loaded the uplinks it crosses are (congestion). ``GroupShape`` holds
those numbers; ``collective_cost(shape=...)`` prices them.

- ``rank0_shape(network, size=, stride=)``: the shape of the group of rank 0, every uplink it
  crosses counted full (congestion = the tier's oversubscription, as if every GPU of the machine
  ran the same collective). What a bare ``collective_cost(group_size=, stride=)`` call prices.
- ``axis_layout(network, size=, stride=, num_gpus=)``: the distinct shapes of all the groups of an
  axis on a job of ``num_gpus`` ranks, and which one each rank's group has. Exact for any size
  and stride: a group of 12 on 8-GPU domains is split 8+4 or 4+8, not priced as 8 NICs in
  parallel. Congestion per tier: ``max(1, oversubscription × senders / inner domain_gpus)``, the
  worst inner domain the group touches, where ``senders`` are the links that leave that inner
  domain through this tier at once for the collective at hand, summed over every group of the
  axis: each member whose group crosses the tier (all-to-all, hierarchical phases:
  ``congestion``), or each group's k parallel rings (ring, tree: ``ring_congestion``). GPUs of
  the domain outside the job send nothing (the job has its domains to itself).

Cost: a layout whose groups provably all have rank 0's shape (each tier's domain a multiple of the
group's block, or the block a multiple of the domain with the stride dividing it or divisible by
it) is answered from rank 0's group alone; otherwise one vectorised pass over the job's ranks
(numpy, milliseconds at 100,000 GPUs), cached per (network, size, stride, num_gpus).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hwmodels.network import NetworkPreset


class ShapeLevel(NamedTuple):
    """One tier a group crosses. Counts are of the group's ranks; "inner domains" are the domains
    of the tier below (single ranks below the innermost tier)."""

    tier: int  # index into NetworkPreset.tiers
    members: int  # the most inner domains under one domain of this tier
    ranks_per_member: int  # the fewest group ranks in one inner domain: links crossing in parallel
    far: int  # the most peers one member reaches through this tier (outside its inner domain)
    inner: int  # inner domains the group touches
    outer: int  # domains of this tier the group touches
    congestion: float  # >= 1: divides the tier's per-GPU bandwidth when every member sends (all-to-all)
    ring_congestion: float  # >= 1: the same when each group's rings leave an inner domain on its k links


class GroupShape(NamedTuple):
    """How one rank group lies on the tiers it crosses, innermost first (empty for one rank)."""

    size: int
    levels: tuple[ShapeLevel, ...]
    even: bool  # every inner domain of every level holds the same number of ranks (hierarchical applies)


class AxisLayout(NamedTuple):
    """The distinct shapes of an axis's groups, and each rank's (None: one shape for all ranks)."""

    shapes: tuple[GroupShape, ...]
    rank_shape: np.ndarray | None  # [num_gpus] index into shapes


_RANK0: dict[tuple, tuple[NetworkPreset, GroupShape]] = {}


def rank0_shape(network: NetworkPreset, *, size: int, stride: int = 1) -> GroupShape:
    """The shape of the group of ranks 0, stride, ..., (size-1)·stride, every uplink it crosses
    counted full (congestion = the tier's oversubscription, as when every GPU of the machine runs
    the same collective). What a bare ``collective_cost(group_size=, stride=)`` prices; for a
    mesh axis whose groups differ, ``axis_layout`` gives each its own."""
    key = (id(network), size, stride)
    hit = _RANK0.get(key)
    if hit is not None and hit[0] is network:
        return hit[1]
    network.tier_for_group(group_size=size, stride=stride)  # validates, and checks the span fits
    members = np.arange(size, dtype=np.int64)[None, :] * stride
    shape = _shapes(network, members, size * stride, every_group_alike=True)[0][0]
    if len(_RANK0) > 65536:
        _RANK0.clear()
    _RANK0[key] = (network, shape)
    return shape


_LAYOUTS: dict[tuple, tuple[NetworkPreset, AxisLayout]] = {}


def axis_layout(network: NetworkPreset, *, size: int, stride: int, num_gpus: int) -> AxisLayout:
    """Shapes of the groups ranks r, r+stride, ..., r+(size-1)·stride of an axis (blocks of
    size·stride consecutive ranks hold stride interleaved groups) on ranks 0..num_gpus-1."""
    if size < 1 or stride < 1 or num_gpus % (size * stride):
        raise ValueError(f"axis_layout: num_gpus ({num_gpus}) must be a multiple of size ({size}) × stride "
                         f"({stride}); fix the mesh degrees")
    key = (id(network), size, stride, num_gpus)
    hit = _LAYOUTS.get(key)
    if hit is not None and hit[0] is network:
        return hit[1]
    if size == 1:
        layout = AxisLayout((GroupShape(1, (), True),), None)
    elif _uniform(network, size, stride, num_gpus):
        members = np.arange(size, dtype=np.int64)[None, :] * stride
        layout = AxisLayout(_shapes(network, members, num_gpus, every_group_alike=True)[0], None)
    else:
        layout = _enumerate(network, size, stride, num_gpus)
    if len(_LAYOUTS) > 4096:
        _LAYOUTS.clear()
    _LAYOUTS[key] = (network, layout)
    return layout


def _uniform(network: NetworkPreset, size: int, stride: int, num_gpus: int) -> bool:
    """Whether every group provably has rank 0's group's shape (tiers the job fits in do not count)."""
    block = size * stride
    for t in network.tiers:
        d = t.domain_gpus
        if d >= num_gpus or d % block == 0:
            continue
        if block % d or (stride % d and d % stride):
            return False
    return True


def _enumerate(network: NetworkPreset, size: int, stride: int, num_gpus: int) -> AxisLayout:
    blocks = np.arange(num_gpus // (size * stride), dtype=np.int64) * size * stride
    bases = (blocks[:, None] + np.arange(stride, dtype=np.int64)[None, :]).ravel()
    members = bases[:, None] + np.arange(size, dtype=np.int64)[None, :] * stride  # [groups, size], rows sorted
    shapes, of_group = _shapes(network, members, num_gpus)
    if len(shapes) == 1:
        return AxisLayout(shapes, None)
    rank_shape = np.empty(num_gpus, dtype=np.int32)
    rank_shape[members.ravel()] = np.repeat(of_group.astype(np.int32), size)
    return AxisLayout(shapes, rank_shape)


_FIELDS = 8  # crossed, members, ranks_per_member, far, inner, outer, congestion, ring_congestion


def _shapes(network: NetworkPreset, members: np.ndarray, num_gpus: int, *, every_group_alike: bool = False
            ) -> tuple[tuple[GroupShape, ...], np.ndarray]:
    """The distinct shapes of the rows of ``members`` (one group per row, ranks ascending), fewest
    levels first, and each row's index among them. ``members`` holds every group of the axis, or
    (``every_group_alike``) rank 0's alone, whose inner domains then count as full of senders."""
    groups, size = members.shape
    table = np.zeros((groups, _FIELDS * len(network.tiers) + 1))  # per tier _FIELDS columns, then even
    table[:, -1] = 1.0
    prev = members  # inner units of the innermost tier: the ranks themselves
    for ti, tier in enumerate(network.tiers):
        dom = members // tier.domain_gpus
        cols, even, outer = _level(network, ti, members, prev, dom, num_gpus, every_group_alike)
        crossed = cols[:, 0] > 0
        table[:, _FIELDS * ti:_FIELDS * (ti + 1)] = np.where(crossed[:, None], cols, 0.0)
        table[:, -1] *= ~crossed | even
        if (outer == 1).all():
            break
        prev = dom
    distinct, of_group = np.unique(table, axis=0, return_inverse=True)
    shapes = [_shape(network, size, row) for row in distinct]
    order = sorted(range(len(shapes)), key=lambda i: (len(shapes[i].levels), shapes[i]))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return tuple(shapes[i] for i in order), rank[of_group.ravel()]


def _level(network: NetworkPreset, ti: int, members: np.ndarray, prev: np.ndarray, dom: np.ndarray,
           num_gpus: int, full: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group, tier ``ti``'s ShapeLevel columns (the first: whether it crosses the tier), whether
    its inner domains are even, and how many of the tier's domains it touches. ``prev``/``dom``:
    each member's inner domain / domain of this tier."""
    groups, size = members.shape
    rows = np.arange(groups)[:, None]
    inner_runs, inner_len = _runs(prev, rows)
    outer_runs, outer_len = _runs(dom, rows)
    inner, outer = inner_runs[:, -1] + 1, outer_runs[:, -1] + 1
    crossed = inner > outer
    if not crossed.any():
        return np.zeros((groups, _FIELDS)), np.ones(groups, dtype=bool), outer
    per_outer = _per_run(outer_runs, _starts(prev), groups, size)  # inner domains under each domain
    even = (inner_len == inner_len[:, :1]).all(axis=1) & (per_outer == per_outer[:, :1]).all(axis=1)
    k = inner_len.min(axis=1)
    cong = _congestion(network, ti, members, crossed, np.ones_like(members), num_gpus, full)
    ring = _congestion(network, ti, members, crossed, _starts(prev) * k[:, None], num_gpus, full)
    far = (outer_len - inner_len).max(axis=1)
    cols = np.stack([crossed, per_outer.max(axis=1), k, far, inner, outer, cong, ring], axis=1)
    return cols, even, outer


def _shape(network: NetworkPreset, size: int, row: np.ndarray) -> GroupShape:
    levels = []
    for ti in range(len(network.tiers)):
        f = row[_FIELDS * ti:_FIELDS * (ti + 1)]
        if f[0]:
            levels.append(ShapeLevel(ti, int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[5]), float(f[6]),
                                     float(f[7])))
    return GroupShape(size, tuple(levels), bool(row[-1]))


def _runs(dom: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per element: the index of its run of equal values along the row, and that run's length."""
    runs = np.cumsum(_starts(dom), axis=1) - 1
    groups, size = dom.shape
    counts = np.bincount((runs + rows * size).ravel(), minlength=groups * size).reshape(groups, size)
    return runs, np.take_along_axis(counts, runs, axis=1)


def _starts(dom: np.ndarray) -> np.ndarray:
    new = np.ones(dom.shape, dtype=bool)
    new[:, 1:] = dom[:, 1:] != dom[:, :-1]
    return new


def _per_run(runs: np.ndarray, weights: np.ndarray, groups: int, size: int) -> np.ndarray:
    """Per element: the sum of ``weights`` over its run (``runs`` as from ``_runs``)."""
    flat = (runs + np.arange(groups)[:, None] * size).ravel()
    sums = np.bincount(flat, weights=weights.ravel().astype(np.float64), minlength=groups * size)
    return sums.reshape(groups, size)[np.arange(groups)[:, None], runs].astype(np.int64)


def _congestion(network: NetworkPreset, ti: int, members: np.ndarray, crossed: np.ndarray, sends: np.ndarray,
                num_gpus: int, full: bool) -> np.ndarray:
    """Per group: max(1, oversubscription × senders / inner domain size) over the inner domains it
    touches. ``sends[g, j]``: the links member j of group g puts through this tier's uplink when
    its group crosses the tier (1 each for an all-to-all; k at one member per inner domain for a
    ring); ``full``: every GPU of an inner domain sends (every group of the axis has this shape)."""
    tier = network.tiers[ti]
    if tier.oversubscription <= 1 or full:
        return np.full(len(members), tier.oversubscription)
    d_in = network.tiers[ti - 1].domain_gpus if ti else 1
    home = members // d_in
    senders = np.bincount(home.ravel(), weights=(sends * crossed[:, None]).ravel().astype(np.float64),
                          minlength=-(-num_gpus // d_in))  # fmt: skip
    load = (senders[home] / d_in).max(axis=1)
    return np.maximum(1.0, tier.oversubscription * load)
