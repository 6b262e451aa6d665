"""Network presets as tiers from the inside out, and the one question the twin asks of them.

A tier's *domain* is the set of `domain_gpus` consecutive ranks (aligned at multiples of
`domain_gpus`) that reach each other through this tier or an inner one: 8 for an HGX NVLink
node, 72 for NVL72, a rack or rail group for a leaf, and so on. Domains nest: each tier's
`domain_gpus` divides the next one's. Ranks are numbered so that consecutive ranks share the
innermost domains (the usual torchrun / device-mesh order).
"""

from __future__ import annotations

from functools import cache
from typing import Literal, NamedTuple

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hwmodels._data import load_yaml, unknown

BUILD_GRAPH_MAX_GPUS = 4096


class Tier(BaseModel):
    """One level of the fabric. Bandwidth is per GPU, per direction, before efficiency."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    fabric: Literal["nvlink", "infiniband", "ethernet", "host"] = Field(
        description="nvlink, infiniband, ethernet; host: CPU ranks (processes) of one machine talking over gloo")
    domain_gpus: int = Field(ge=1)
    bw_per_gpu_Bps: float = Field(gt=0)
    latency_s: float = Field(ge=0, description="per ring step through this tier")
    efficiency: float = Field(gt=0, le=1, description="achievable fraction of bw at large messages")
    oversubscription: float = Field(1.0, ge=1)
    half_eff_bytes: float = Field(0.0, ge=0, description="message size reaching half the efficiency")
    ll_efficiency: float = Field(
        0.0, ge=0, le=1, description="fraction of bw NCCL's low-latency (LL) protocol reaches with no start-up "
        "cost; small messages take max(ll, curve) (0: no LL line)")
    base_latency_s: float = Field(0.0, ge=0, description="fixed cost per collective whose outermost tier is this one")
    peer_latency_s: float | None = Field(
        None, ge=0, description="an all-to-all's cost of each further peer reached through this tier (NCCL keeps "
        "several in flight); None: latency_s on NVLink and host tiers, hwmodels.collectives.NIC_PEER_LATENCY_S across NICs")
    kind_efficiency: dict[str, float] = Field(
        default_factory=dict, description="per collective kind override of `efficiency` (large-message fraction)")
    efficiency_points: dict[str, list[tuple[float, float]]] = Field(
        default_factory=dict, description="per kind (msg_bytes, efficiency) points, log-size interpolated; replace "
        "the efficiency × m/(m+half_eff_bytes) curve for that kind (fitted to measurements)")
    kind_latency_s: dict[str, float] = Field(
        default_factory=dict, description="per kind total latency of a group inside this one tier (measured)")
    nvls_efficiency: float | None = Field(
        None, gt=0, le=1, description="NVLS all-reduce algorithm bandwidth as a fraction of bw; None: no NVLS")
    nvls_latency_s: float = Field(0.0, ge=0, description="fixed cost of an NVLS all-reduce")
    sources: list[str] = Field(min_length=1, description="keys of NetworkPreset.sources")

    @property
    def effective_bw_Bps(self) -> float:
        """Large-message bytes/s per GPU: bw × efficiency / oversubscription."""
        return self.bw_per_gpu_Bps * self.efficiency / self.oversubscription


class NetworkPreset(BaseModel):
    """A named fabric: `tiers` from the inside out; `sources` maps reference keys to citations."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    tiers: list[Tier] = Field(min_length=1)
    sources: dict[str, str]

    @model_validator(mode="after")
    def _check(self) -> NetworkPreset:
        for inner, outer in zip(self.tiers, self.tiers[1:]):
            if outer.domain_gpus <= inner.domain_gpus or outer.domain_gpus % inner.domain_gpus:
                raise ValueError(f"network {self.name!r}: tier {outer.name!r} domain_gpus ({outer.domain_gpus}) "
                                 f"must be a larger multiple of tier {inner.name!r} ({inner.domain_gpus})")
        for tier in self.tiers:
            if missing := [s for s in tier.sources if s not in self.sources]:
                raise ValueError(f"network {self.name!r}: tier {tier.name!r} cites unknown sources {missing}; "
                                 f"add them to references")
        return self

    @property
    def max_gpus(self) -> int:
        return self.tiers[-1].domain_gpus

    def group_levels(self, *, group_size: int, stride: int = 1) -> tuple[GroupLevel, ...]:
        """The tiers a group of ranks r, r+stride, ... spans, innermost first (empty for one rank).

        Per level: `members` = the inner domains (or single ranks, at the innermost level) one
        domain of this tier holds of the group, and `ranks_per_member` = the group's ranks in each
        of them, which move data through this tier in parallel (each GPU has its own link / NIC).
        The product of `members` over the levels is `group_size`. Same aligned-placement
        assumption as `tier_for_group`; answered from domain sizes, no graph search.
        """
        return _group_levels(self, group_size, stride)

    def bottleneck_bw_Bps(self, *, group_size: int, stride: int = 1) -> float:
        """Large-message bytes/s per rank a ring over the group gets: min over the spanned tiers of
        ranks_per_member × the tier's effective bw (a domain's ranks use their own NICs at once).
        0 for one rank (nothing moves)."""
        levels = self.group_levels(group_size=group_size, stride=stride)
        return min((lv.ranks_per_member * lv.tier.effective_bw_Bps for lv in levels), default=0.0)

    def tier_for_group(self, *, group_size: int, stride: int = 1) -> Tier:
        """The tier a collective over ranks r, r+stride, ..., r+(group_size-1)*stride runs through.

        The group covers a span of (group_size-1)*stride+1 consecutive ranks; it is answered by
        the innermost tier whose domain holds that span, i.e. the outermost tier the group
        crosses. Assumes aligned placement (r at a domain boundary or the span fitting inside
        one domain), which holds for device-mesh axes whose sizes divide the domain sizes.
        A group of one rank gets the innermost tier (it moves no data).
        """
        if group_size < 1 or stride < 1:
            raise ValueError(f"tier_for_group: group_size ({group_size}) and stride ({stride}) must be >= 1")
        span = (group_size - 1) * stride + 1
        for tier in self.tiers:
            if span <= tier.domain_gpus:
                return tier
        raise ValueError(f"group of {group_size} ranks at stride {stride} spans {span} GPUs, more than network "
                         f"{self.name!r} holds ({self.max_gpus}); shrink the group or pick a larger preset")


class GroupLevel(NamedTuple):
    """One tier a rank group spans; see `NetworkPreset.group_levels`."""

    tier: Tier
    members: int
    ranks_per_member: int


_LEVELS: dict[tuple[int, int, int], tuple[NetworkPreset, tuple[GroupLevel, ...]]] = {}


def _group_levels(preset: NetworkPreset, group_size: int, stride: int) -> tuple[GroupLevel, ...]:
    key = (id(preset), group_size, stride)
    hit = _LEVELS.get(key)
    if hit is not None and hit[0] is preset:
        return hit[1]
    preset.tier_for_group(group_size=group_size, stride=stride)  # validates and checks the span fits
    levels, inner = [], 1  # inner: the group's ranks inside one domain of the level below
    for tier in preset.tiers:
        ranks = min(group_size, max(1, -(-tier.domain_gpus // stride)))
        if ranks > inner:
            levels.append(GroupLevel(tier, -(-ranks // inner), inner))
            inner = ranks
        if inner >= group_size:
            break
    if len(_LEVELS) > 65536:
        _LEVELS.clear()
    _LEVELS[key] = (preset, tuple(levels))
    return _LEVELS[key][1]


@cache
def _presets() -> dict[str, NetworkPreset]:
    data = load_yaml("networks.yaml")
    refs = data["references"]
    out = {}
    for name, raw in data["presets"].items():
        used = {key for tier in raw["tiers"] for key in tier["sources"]}
        out[name] = NetworkPreset(name=name, **raw, sources={k: refs.get(k, "") for k in sorted(used)})
    return out


def list_networks() -> list[str]:
    """Names of the bundled network presets, sorted."""
    return sorted(_presets())


def get_network(name: str) -> NetworkPreset:
    """The bundled preset `name` (case-insensitive; a former name in `aliases:` still works, so
    that RunRecords and scenarios written under it keep loading), or a probe profile's preset for
    ``probe:PATH`` (hwmodels/profile.py)."""
    if name.startswith("probe:"):
        from hwmodels.profile import load_profile, probe_path

        return load_profile(probe_path(name), field="hardware.network")[1]
    key = name.lower()
    key = (load_yaml("networks.yaml").get("aliases") or {}).get(key, key)
    preset = _presets().get(key)
    if preset is None:
        raise unknown("network preset", name, list_networks())
    return preset


def build_graph(preset: NetworkPreset, n_gpus: int) -> nx.Graph:
    """A small topology graph: GPU nodes `gpu<i>`, one switch node `<tier><k>` per domain.

    Tiers are added from the inside out until one domain holds all `n_gpus`. Each edge carries
    `bw_Bps` (aggregate bytes/s per direction of the GPUs below it, after oversubscription),
    `latency_s` and `tier`. Meant for inspection and plots, not for the twin's hot path.
    """
    if not 1 <= n_gpus <= min(preset.max_gpus, BUILD_GRAPH_MAX_GPUS):
        raise ValueError(f"build_graph: n_gpus ({n_gpus}) must be in 1..{min(preset.max_gpus, BUILD_GRAPH_MAX_GPUS)} "
                         f"for network {preset.name!r}; use tier_for_group for large clusters")
    g = nx.Graph(name=preset.name)
    below = [f"gpu{i}" for i in range(n_gpus)]  # one node per domain of the level below
    g.add_nodes_from(below, kind="gpu")
    below_size = 1  # GPUs under each node of `below`
    for tier in preset.tiers:
        switches = [f"{tier.name}{j}" for j in range(-(-n_gpus // tier.domain_gpus))]
        g.add_nodes_from(switches, kind="switch", tier=tier.name)
        for k, node in enumerate(below):
            gpus_under = min(below_size, n_gpus - k * below_size)
            g.add_edge(node, switches[k * below_size // tier.domain_gpus], tier=tier.name,
                       latency_s=tier.latency_s, bw_Bps=gpus_under * tier.bw_per_gpu_Bps / tier.oversubscription)
        if tier.domain_gpus >= n_gpus:
            break
        below, below_size = switches, tier.domain_gpus
    return g
