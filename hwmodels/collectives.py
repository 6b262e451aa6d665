"""Collective cost over a rank group on a multi-tier network: NCCL-like algorithms, alpha-beta per tier.

One entry, `collective_cost(kind=, msg_bytes=, group_size=, network=, stride=, ...)`, returns a
`CollectiveCost` (algorithm, time_s, latency_s, transfer_s, sms, tiers). The group is ranks
r, r+stride, ..., r+(group_size-1)×stride; its `hwmodels.groups.GroupShape` says which tiers it
spans (innermost first), how many of its ranks sit in each inner domain (`ranks_per_member`, k,
the fewest), how many peers a member reaches through each tier (`far`) and how congested the
oversubscribed uplinks it crosses are. `shape=` passes it (`hwmodels.groups.axis_layout`: each
group of a mesh axis, misaligned ones included); without it, rank 0's group is priced with every
uplink full (hwmodels/GROUPS.md).

What `msg_bytes` means, per kind (the nccl-tests "size" convention, so busbw tables compare
directly), with n = group_size:

| kind           | msg_bytes                                       | bus factor f(n) |
|----------------|-------------------------------------------------|-----------------|
| all_reduce     | the buffer each rank reduces (input = output)   | 2(n-1)/n        |
| reduce_scatter | each rank's full input (n × its output shard)   | (n-1)/n         |
| all_gather     | each rank's full gathered output (n × input)    | (n-1)/n         |
| all_to_all     | each rank's whole send buffer (n chunks)        | (n-1)/n         |
| broadcast      | the buffer broadcast                            | 1               |
| send_recv      | the bytes one rank sends to its peer            | 1               |

Per tier (hwmodels/data/networks.yaml): bandwidth B per GPU per direction (divided by the
group's congestion at that tier: the oversubscription where the traffic fills the uplinks), a
large-message efficiency (per kind where measurements differ) shaped by
m / (m + half_eff_bytes) (NCCL's Simple protocol; the shape is a start-up cost of
f·half_eff_bytes/bw) or a flat low-latency-protocol fraction `ll_efficiency`, whichever is
faster, or measured efficiency points per kind (log-size interpolated) instead, a
per-step latency alpha and a fixed base latency (or, for groups inside one tier, a measured
latency per kind, `kind_latency_s`).

Algorithms (`algorithm=None` takes the fastest that applies, as NCCL's tuner does):

| algorithm    | kinds                          | applies when                 | latency               | transfer                          |
|--------------|--------------------------------|------------------------------|-----------------------|-----------------------------------|
| ring         | all but all_to_all, send_recv  | always                       | base + steps × hop α  | f·m / min_t(k_t·B_t·eff_t(m))     |
| nvls         | all_reduce                     | one NVLink tier with NVLS    | nvls_latency_s        | m / (B · nvls_efficiency)         |
| tree         | all_reduce, broadcast          | group spans > 1 tier         | base + chain + log2 α | 2m (or m) / bottleneck            |
| hierarchical | all_reduce, reduce_scatter, all_gather, broadcast | > 1 tier  | sum of the phases     | inner RS → outer op on m/k → inner AG |
| pairwise     | all_to_all                     | always                       | base + Σ_t far_t·α_t  | max_t(far_t·(m/n) / bw_t(m/n))    |
| direct       | send_recv                      | always                       | base + α              | m / (B·eff(m)) on the tier crossed |

Ring hop latency follows NCCL's model: along a ring path of n-1 hops, those between the inner
domains the group touches cross tier t (inner_t - outer_t of them; the rest stay inside);
all-reduce walks the path twice. The all-to-all is NCCL's n-1 send/recv pairs of m/n bytes:
each peer costs the step latency α of the tier it sits behind (one after another, the same
per-step cost the ring pays), and the bytes to the far_t peers behind tier t go through it at
the efficiency a message of m/n bytes reaches, so small per-peer messages lose bandwidth
(GROUPS.md has the published check). The hierarchical
all-reduce is intra-domain reduce-scatter, all-reduce across domains over 1/k of the data per
rank (each rank through its own NIC: rail-optimized or per-GPU ToR port), intra all-gather; it
needs every inner domain to hold as many of the group's ranks (`GroupShape.even`).

SM use: an SM-based collective occupies one SM per channel (`collective_sms`). With
`sm_free=True`, all-gather and all-to-all run on copy engines inside an NVLink domain (NCCL
2.28, ANCHORS.md "Collectives") and as hierarchical zero-SM collectives across nodes (NCCL
2.30.7: copy engines intra-node plus the RMA CPU proxy inter-node, NCCL_CTA_POLICY_ZERO,
https://docs.nvidia.com/deeplearning/nccl/release-notes/rel_2-30-7.html): sms = 0, the same
time (assumption: no public CE-vs-SM bandwidth table; calibrate). Other kinds fall back to SMs.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import NamedTuple

from hwmodels.groups import GroupShape, rank0_shape
from hwmodels.network import NetworkPreset, Tier
from scenarios.vocab import COLLECTIVE_KINDS
ALGORITHMS: tuple[str, ...] = ("ring", "nvls", "tree", "hierarchical", "pairwise", "direct")

# Copy-engine (SM-free) collectives: NCCL 2.28 for all-gather and all-to-all inside an NVLink
# domain (ANCHORS.md); NCCL 2.30.7 hierarchical zero-SM all-gather and all-to-all across nodes.
SM_FREE_KINDS = ("all_gather", "all_to_all")

# SMs an SM-based NCCL collective occupies: one CTA per channel, one SM per CTA. Documented
# default to refine from profiler traces (gridDim of the nccl kernels): NCCL runs ~16-32
# channels on NVLink and fewer across NICs; NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS override
# (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html). A multi-tier
# collective runs with the outermost tier's channel count.
DEFAULT_SMS = {"nvlink": 24, "infiniband": 16, "ethernet": 16,
               # CPU ranks over gloo ("sms" = cores, gpus.yaml cpu): assumption: a collective keeps one
               # core busy (gloo runs it on one of its threads, copying and reducing on the CPU)
               "host": 1}
# An all-to-all's cost of each further peer across a NIC tier: the OCI GB300 two-rack nccl-tests
# all-to-all (hwmodels/data/published/nccl_collectives.yaml, oci-gb300, 128 GPUs, 1 MiB: 505.2 us,
# 64 of the 127 peers behind the RoCE tier) less the NVLink peers' and the base latency, over 63:
# 7.2 us (the tier's full step latency, 17 us, made the row +125%). One published point, fitted;
# the other rows of that file stay checks.
NIC_PEER_LATENCY_S = 7.2e-6
NVLS_SMS = 16  # NVLS channels (NCCL_NVLS_NCHANNELS); assumption: 16 on HGX H100/H200 class
SEND_RECV_SMS = 8  # p2p uses fewer channels per peer; documented default

_KIND_INDEX = {k: i for i, k in enumerate(COLLECTIVE_KINDS)}
_MEMO_MAX = 1 << 17


class CollectiveCost(NamedTuple):
    """One collective: the algorithm chosen, its time (= (latency + transfer) × scale), the SMs
    it takes from compute while it runs (0 when SM-free) and the tiers it spans, innermost first.

    Immutable; a NamedTuple because a frozen dataclass costs ~2.5 us to build, 5x this.
    """

    algorithm: str
    time_s: float
    latency_s: float
    transfer_s: float
    sms: int
    tiers: tuple[str, ...]


class Span(NamedTuple):
    """Latency and transfer seconds of an algorithm, or of one phase of a hierarchical one: the
    phases of one collective add (``a + b``, field by field)."""

    latency_s: float
    transfer_s: float

    def __add__(self, other: Span) -> Span:  # type: ignore[override]
        return Span(self.latency_s + other.latency_s, self.transfer_s + other.transfer_s)

    @property
    def time_s(self) -> float:
        return self.latency_s + self.transfer_s


_new_cost = tuple.__new__  # positional, skips NamedTuple's keyword handling on the hot path
_ZERO = CollectiveCost(algorithm="none", time_s=0.0, latency_s=0.0, transfer_s=0.0, sms=0, tiers=())


class _TierTable:
    """Plain floats of one tier, precomputed for the hot path."""

    __slots__ = ("name", "fabric", "bw", "alpha", "base", "half", "eff", "points", "nvls_bw", "nvls_lat", "kind_lat", "ll",
                 "peer")

    def __init__(self, tier: Tier) -> None:
        self.name, self.fabric = tier.name, tier.fabric
        self.bw = tier.bw_per_gpu_Bps  # oversubscription divides per level (_Lv.cong), given the traffic
        self.alpha, self.base, self.half = tier.latency_s, tier.base_latency_s, tier.half_eff_bytes
        self.eff = tuple(tier.kind_efficiency.get(k, tier.efficiency) for k in COLLECTIVE_KINDS)
        self.points: tuple[tuple[list[float], list[float]] | None, ...] = tuple(
            _points(tier, k) for k in COLLECTIVE_KINDS)
        self.nvls_bw = tier.bw_per_gpu_Bps * tier.nvls_efficiency if tier.nvls_efficiency else 0.0
        self.nvls_lat = tier.nvls_latency_s
        self.ll = self.bw * tier.ll_efficiency
        self.kind_lat = tuple(tier.kind_latency_s.get(k) for k in COLLECTIVE_KINDS)
        nic = tier.fabric in ("infiniband", "ethernet")
        self.peer = tier.peer_latency_s if tier.peer_latency_s is not None else \
            (NIC_PEER_LATENCY_S if nic else tier.latency_s)  # fmt: skip

    def bw_Bps(self, kind_i: int, m: float) -> float:
        """Achieved bytes/s per GPU on this tier for a message of m bytes (m > 0)."""
        pts = self.points[kind_i]
        if pts is None:  # LL protocol line or the Simple curve, whichever is faster (same latency)
            curve = self.bw * self.eff[kind_i] * m / (m + self.half)
            return curve if curve > self.ll else self.ll
        xs, ys = pts
        x = math.log2(m)
        i = bisect_right(xs, x)
        if i == 0:
            return self.bw * ys[0]
        if i == len(xs):
            return self.bw * ys[-1]
        x0, x1 = xs[i - 1], xs[i]
        return self.bw * (ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0))


def _points(tier: Tier, kind: str) -> tuple[list[float], list[float]] | None:
    pts = tier.efficiency_points.get(kind)
    if not pts:
        return None
    pts = sorted(pts)
    return [math.log2(m) for m, _ in pts], [e for _, e in pts]


_TABLES: dict[int, tuple[object, dict[str, _TierTable]]] = {}
_MEMO: dict[tuple, CollectiveCost] = {}


def _tables(network: NetworkPreset) -> dict[str, _TierTable]:
    hit = _TABLES.get(id(network))
    if hit is not None and hit[0] is network:
        return hit[1]
    tables = {t.name: _TierTable(t) for t in network.tiers}
    _TABLES[id(network)] = (network, tables)
    return tables


class _Lv(NamedTuple):
    """One spanned tier of a group, as the algorithms read it (hwmodels.groups.ShapeLevel)."""

    tab: _TierTable
    members: int  # the most inner domains (or ranks) under one domain of this tier
    k: int  # the fewest ranks of the group in one inner domain: links crossing in parallel
    far: int  # the most peers one member reaches through this tier
    inner: int  # inner domains the group touches
    outer: int  # domains of this tier it touches
    cong: float  # >= 1: divides the tier's bandwidth when every member sends (oversubscribed uplinks)
    rcong: float  # >= 1: the same when each group's rings leave an inner domain on their k links


_LEVELS: dict[tuple, tuple[object, tuple[_Lv, ...], tuple[str, ...], bool]] = {}


def _levels(network: NetworkPreset, group_size: int, stride: int, shape: GroupShape | None
            ) -> tuple[tuple[_Lv, ...], tuple[str, ...], bool]:
    """The spanned tiers of the group (rank 0's, or ``shape``), innermost first, their names, and
    whether every inner domain holds as many of its ranks (``GroupShape.even``)."""
    key = (id(network), group_size, stride, shape)
    hit = _LEVELS.get(key)
    if hit is not None and hit[0] is network:
        return hit[1], hit[2], hit[3]
    if shape is None:
        shape = rank0_shape(network, size=group_size, stride=stride)
    elif shape.size != group_size:
        raise ValueError(f"shape: its size ({shape.size}) must equal group_size ({group_size}); pass the shape "
                         f"hwmodels.groups.axis_layout gives for this group")
    tables = _tables(network)
    levels = tuple(_Lv(tables[network.tiers[lv.tier].name], lv.members, lv.ranks_per_member, lv.far, lv.inner,
                       lv.outer, lv.congestion, lv.ring_congestion) for lv in shape.levels)  # fmt: skip
    if len(_LEVELS) >= _MEMO_MAX:
        _LEVELS.clear()
    _LEVELS[key] = (network, levels, tuple(lv.tab.name for lv in levels), shape.even)
    return levels, _LEVELS[key][2], shape.even


def _check_kind(kind: str) -> None:
    if kind not in _KIND_INDEX:
        raise ValueError(f"unknown collective kind {kind!r}; known: {', '.join(COLLECTIVE_KINDS)}")


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests bus bandwidth factor: busbw = msg_bytes / time × bus_factor."""
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0


# ---- algorithms: each returns a Span or None when it does not apply ---------------------------
# `levels` is a tuple of _Lv, innermost first; n = group size; `even` = GroupShape.even.

def _ring(ki: int, m: float, n: int, levels, even: bool = True) -> Span:
    hops_lat, bott = 0.0, math.inf
    for lv in levels:  # the ring path's n-1 hops: inner - outer of them cross this tier
        hops_lat += (lv.inner - lv.outer) * lv.tab.alpha
        bw = lv.k * lv.tab.bw_Bps(ki, m) / lv.rcong if m > 0 else math.inf
        if bw < bott:
            bott = bw
    kind = COLLECTIVE_KINDS[ki]
    if kind == "all_reduce":
        lat, f = 2 * hops_lat, 2 * (n - 1) / n
    elif kind == "broadcast":
        lat, f = hops_lat, 1.0
    else:
        lat, f = hops_lat, (n - 1) / n
    lat += levels[-1].tab.base
    if len(levels) == 1 and levels[0].tab.kind_lat[ki] is not None:
        lat = levels[0].tab.kind_lat[ki]
    return Span(lat, f * m / bott if m > 0 else 0.0)


def _tree(ki: int, m: float, n: int, levels, even: bool = True) -> Span | None:
    if len(levels) < 2:
        return None
    lat, bott = 0.0, math.inf
    for i, lv in enumerate(levels):
        lat += (lv.members - 1 if i == 0 else math.ceil(math.log2(lv.members))) * lv.tab.alpha  # chain, then tree
        bw = lv.k * lv.tab.bw_Bps(ki, m) / lv.rcong if m > 0 else math.inf
        bott = min(bott, bw)
    ways = 2 if COLLECTIVE_KINDS[ki] == "all_reduce" else 1  # reduce up then broadcast down
    return Span(levels[-1].tab.base + ways * lat, ways * m / bott if m > 0 else 0.0)


def _alone(lv: _Lv) -> _Lv:
    """A level as its own ring over its `members` inner domains, one rank (its own NIC) each: every
    rank of an inner domain runs such a ring at once, so every member sends (``cong``)."""
    return _Lv(lv.tab, lv.members, 1, lv.members - 1, lv.members, 1, lv.cong, lv.cong)


def _phase(kind: str, m: float, levels) -> Span:
    """Latency and transfer of `kind` run hierarchically over `levels` (no base latency)."""
    first = _alone(levels[0])
    if len(levels) == 1:
        lat, xfer = _ring(_KIND_INDEX[kind], m, first.members, (first,))
        return Span(lat - first.tab.base, xfer)
    inner, members = (first,), first.members
    rest = levels[1:]  # each rank through its own NIC
    if kind == "all_reduce":
        return (_phase("reduce_scatter", m, inner) + _phase("all_reduce", m / members, rest)
                + _phase("all_gather", m, inner))
    if kind == "reduce_scatter":
        a, b = _phase("reduce_scatter", m, inner), _phase("reduce_scatter", m / members, rest)
    elif kind == "all_gather":
        a, b = _phase("all_gather", m / members, rest), _phase("all_gather", m, inner)
    else:  # broadcast: across domains, then inside each
        a, b = _phase("broadcast", m, rest), _phase("broadcast", m, inner)
    return a + b


def _hierarchical(ki: int, m: float, n: int, levels, even: bool = True) -> Span | None:
    kind = COLLECTIVE_KINDS[ki]
    if len(levels) < 2 or not even or kind not in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
        return None  # uneven domains (a group of 12 split 8+4): no equal per-domain shards to exchange
    lat, xfer = _phase(kind, m, levels)
    return Span(levels[-1].tab.base + lat, xfer)


def _nvls(ki: int, m: float, n: int, levels, even: bool = True) -> Span | None:
    tab = levels[0].tab
    if len(levels) != 1 or not tab.nvls_bw or COLLECTIVE_KINDS[ki] != "all_reduce" or n < 3:
        return None
    return Span(tab.nvls_lat, m / tab.nvls_bw)


def _pairwise(ki: int, m: float, n: int, levels, even: bool = True) -> Span:
    """NCCL's all-to-all: n-1 send/recv pairs of m/n bytes each. The first peer behind a tier costs
    its step latency, each further one its per-peer cost (``peer_latency_s``: NCCL keeps several
    in flight, so less than a step across NICs); the bytes to the peers behind each tier go through
    it, all tiers at once, each at the efficiency a message of m/n bytes reaches (small per-peer
    messages lose it). The slowest member (the most peers behind a tier) sets the time."""
    lat, worst, per_peer = levels[-1].tab.base, 0.0, m / n
    for lv in levels:
        if lv.far > 0:
            lat += lv.tab.alpha + (lv.far - 1) * lv.tab.peer
        if m > 0:
            worst = max(worst, per_peer * lv.far * lv.cong / lv.tab.bw_Bps(ki, per_peer))
    if len(levels) == 1 and levels[0].tab.kind_lat[ki] is not None:
        lat = levels[0].tab.kind_lat[ki]
    return Span(lat, worst)


def _direct(ki: int, m: float, n: int, levels, even: bool = True) -> Span:
    lv = levels[-1]
    tab = lv.tab
    lat = tab.kind_lat[ki] if len(levels) == 1 and tab.kind_lat[ki] is not None else tab.base + tab.alpha
    return Span(lat, m * lv.cong / tab.bw_Bps(ki, m) if m > 0 else 0.0)


_BY_KIND = {
    "all_reduce": (("ring", _ring), ("nvls", _nvls), ("tree", _tree), ("hierarchical", _hierarchical)),
    "reduce_scatter": (("ring", _ring), ("hierarchical", _hierarchical)),
    "all_gather": (("ring", _ring), ("hierarchical", _hierarchical)),
    "broadcast": (("ring", _ring), ("tree", _tree), ("hierarchical", _hierarchical)),
    "all_to_all": (("pairwise", _pairwise),),
    "send_recv": (("direct", _direct),),
}


def algorithms_for(kind: str) -> tuple[str, ...]:
    """Algorithm names that may apply to `kind` (whether one does depends on the group's span)."""
    _check_kind(kind)
    return tuple(name for name, _ in _BY_KIND[kind])


def collective_cost(*, kind: str, msg_bytes: float, group_size: int, network: NetworkPreset | None = None,
                    stride: int = 1, sm_free: bool = False, algorithm: str | None = None, scale: float = 1.0,
                    imbalance: float = 1.0, tier: Tier | None = None, shape: GroupShape | None = None
                    ) -> CollectiveCost:
    """Cost of one collective over ranks r, r+stride, ... on `network`; see the module docstring.

    algorithm: None picks the fastest that applies. sm_free: copy engines / zero-SM where NCCL
    supports it (all_gather, all_to_all), SMs otherwise (check `.sms`). imbalance (>= 1):
    all_to_allv's slowest rank's bytes over the mean (multiplies the transfer). scale: a
    calibration factor on the time. `tier=` (legacy) treats one tier as the whole network.
    shape: where this group lies on the tiers (``hwmodels.groups.axis_layout``: a misaligned
    group's split, the congestion of the uplinks it crosses); None prices rank 0's group with
    every uplink full (``hwmodels.groups.rank0_shape``).
    """
    owner = network if network is not None else tier
    key = (id(owner), kind, msg_bytes, group_size, stride, sm_free, algorithm, scale, imbalance, shape)
    hit = _MEMO.get(key)
    if hit is not None and hit[0] is owner:  # an id can be reused once its object is gone
        return hit[1]
    if network is None:
        if tier is None:
            raise ValueError(f"{kind}: network is None; pass network=get_network(<preset>)")
        network = _one_tier_network(tier)
    cost = _collective_cost(kind, msg_bytes, group_size, network, stride, sm_free, algorithm, scale, imbalance,
                            shape)
    if len(_MEMO) >= _MEMO_MAX:
        _MEMO.clear()
    _MEMO[key] = (owner, cost)
    return cost


def _collective_cost(kind, msg_bytes, group_size, network, stride, sm_free, algorithm, scale, imbalance, shape):
    if kind not in _KIND_INDEX:
        _check_kind(kind)
    if msg_bytes < 0 or group_size < 1:
        raise ValueError(f"{kind}: msg_bytes ({msg_bytes}) must be >= 0 and group_size ({group_size}) >= 1")
    if imbalance < 1:
        raise ValueError(f"{kind}: imbalance ({imbalance}) must be >= 1 (slowest rank's bytes over the mean)")
    if scale <= 0:
        raise ValueError(f"{kind}: scale ({scale}) must be > 0 (a calibration factor on the time)")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} unknown; use None (fastest) or one of {', '.join(ALGORITHMS)}")
    if group_size == 1:
        return _ZERO
    levels, tiers, even = _levels(network, group_size, stride, shape)
    ki = _KIND_INDEX[kind]
    best, name = None, ""
    for algo, fn in _BY_KIND[kind]:
        if algorithm is not None and algo != algorithm:
            continue
        got = fn(ki, float(msg_bytes), group_size, levels, even)
        if got is not None and (best is None or got.time_s < best.time_s):
            best, name = got, algo
    if best is None:
        raise ValueError(f"algorithm {algorithm!r} does not apply to {kind} over {group_size} ranks at stride {stride} "
                         f"on {network.name!r}; use one of {', '.join(algorithms_for(kind))} or None")
    lat, xfer = best
    xfer *= imbalance
    outer = levels[-1].tab
    if sm_free and kind in SM_FREE_KINDS:
        sms = 0
        name = "copy_engine" if len(levels) == 1 and outer.fabric == "nvlink" else "hierarchical_zero_sm"
    elif kind == "send_recv":
        sms = SEND_RECV_SMS
    elif name == "nvls":
        sms = NVLS_SMS
    else:
        sms = DEFAULT_SMS[outer.fabric]
    return _new_cost(CollectiveCost, (name, (lat + xfer) * scale, lat * scale, xfer * scale, sms, tiers))


_ONE_TIER: dict[int, tuple[Tier, NetworkPreset]] = {}


def _one_tier_network(tier: Tier) -> NetworkPreset:
    hit = _ONE_TIER.get(id(tier))
    if hit is None or hit[0] is not tier:
        wide = tier.model_copy(update={"domain_gpus": 1 << 40})
        hit = (tier, NetworkPreset(name=tier.name, description="one tier", tiers=[wide],
                                   sources={s: "from the tier" for s in tier.sources}))
        _ONE_TIER[id(tier)] = hit
    return hit[1]


def collective_time_s(*, kind: str, msg_bytes: float, group_size: int, network: NetworkPreset | None = None,
                      stride: int = 1, sm_free: bool = False, algorithm: str | None = None, scale: float = 1.0,
                      imbalance: float = 1.0, tier: Tier | None = None) -> float:
    """Seconds for one collective (see `collective_cost`); 0 for one rank."""
    return collective_cost(kind=kind, msg_bytes=msg_bytes, group_size=group_size, network=network, stride=stride,
                           sm_free=sm_free, algorithm=algorithm, scale=scale, imbalance=imbalance, tier=tier).time_s


def effective_bw_Bps(*, tier: Tier, msg_bytes: float, kind: str = "all_reduce") -> float:
    """Achieved bytes/s per GPU for a message of `msg_bytes` on `tier` (0 for an empty message)."""
    _check_kind(kind)
    if msg_bytes <= 0:
        return 0.0
    return _TierTable(tier).bw_Bps(_KIND_INDEX[kind], msg_bytes)


def sm_free_supported(*, kind: str, tier: Tier | None = None, network: NetworkPreset | None = None,
                      group_size: int = 2, stride: int = 1) -> bool:
    """Whether `kind` can run without SMs: all_gather / all_to_all inside an NVLink tier (NCCL
    2.28 copy engines) or, given a network, across tiers (NCCL 2.30 hierarchical zero-SM)."""
    _check_kind(kind)
    if kind not in SM_FREE_KINDS:
        return False
    if network is not None:
        return True
    return tier is not None and tier.fabric == "nvlink"


def collective_sms(*, kind: str, sm_free: bool, tier: Tier) -> int:
    """SMs a collective whose outermost tier is `tier` takes from compute: 0 when SM-free."""
    if sm_free:
        if not sm_free_supported(kind=kind, tier=tier):
            raise ValueError(f"sm_free {kind} is not possible on tier {tier.name!r} ({tier.fabric}): copy engines "
                             f"only do {', '.join(SM_FREE_KINDS)} inside an NVLink domain; set sm_free=False")
        return 0
    _check_kind(kind)
    return SEND_RECV_SMS if kind == "send_recv" else DEFAULT_SMS[tier.fabric]


def fit_efficiency_points(*, tier: Tier, kind: str, rows: list[tuple[float, float]], group_size: int = 2
                          ) -> list[tuple[float, float]]:
    """Efficiency points (msg_bytes, efficiency) that make a one-tier ring reproduce measured
    (msg_bytes, time_s) rows: eff = f·m / (B × (t - latency)). For networks.yaml. all_to_all's
    points are keyed by the per-peer message, m / group_size (what `_pairwise` looks up)."""
    tab, ki, n = _TierTable(tier), _KIND_INDEX[kind], group_size
    fn = _pairwise if kind == "all_to_all" else _direct if kind == "send_recv" else _ring
    lat = fn(ki, 0.0, n, (_Lv(tab, n, 1, n - 1, n, 1, tier.oversubscription, tier.oversubscription),))[0]
    f = bus_factor(kind, n)
    bw = tier.bw_per_gpu_Bps / tier.oversubscription
    per = n if kind == "all_to_all" else 1
    return [(m / per, round(f * m / (bw * (t - lat)), 4)) for m, t in rows]
