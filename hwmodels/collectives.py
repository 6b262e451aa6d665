"""Collective cost: ring alpha-beta over one network tier, with a size-dependent efficiency.

    time_s = latency_s × steps(n)  +  bus_factor(n) × msg_bytes / bw(msg_bytes)
    bw(m)  = bw_per_gpu_Bps × efficiency × m / (m + half_eff_bytes) / oversubscription

so small messages are latency bound and large ones approach `tier.effective_bw_Bps`. Note that
the efficiency curve is the same as adding `bus_factor × half_eff_bytes / bw` of fixed cost:
an extra, size-independent term that stands for protocol and pipelining start-up.

What `msg_bytes` means, per kind (the nccl-tests "size" convention, so busbw tables compare
directly), with n = group_size:

| kind           | msg_bytes                                       | bus factor  | steps    |
|----------------|-------------------------------------------------|-------------|----------|
| all_reduce     | the buffer each rank reduces (input = output)   | 2(n-1)/n    | 2(n-1)   |
| reduce_scatter | each rank's full input (n × its output shard)   | (n-1)/n     | n-1      |
| all_gather     | each rank's full gathered output (n × input)    | (n-1)/n     | n-1      |
| all_to_all     | each rank's whole send buffer (n chunks)        | (n-1)/n     | n-1      |
| broadcast      | the buffer broadcast                            | 1           | n-1      |
| send_recv      | the bytes one rank sends to its peer            | 1           | 1        |

The tier is the one the whole group spans (`NetworkPreset.tier_for_group`); hierarchical
algorithms (NVLink inside, NIC across) are not modelled in this version.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

from hwmodels.network import Tier

CollectiveKind = Literal["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv"]
COLLECTIVE_KINDS: tuple[str, ...] = get_args(CollectiveKind)

# Copy-engine (SM-free) collectives: NCCL 2.28 added them for all-gather and all-to-all inside
# an NVLink domain (ANCHORS.md, "Collectives"); reductions need SMs.
SM_FREE_KINDS = ("all_gather", "all_to_all")

# SMs an SM-based NCCL collective occupies: one CTA per channel, one SM per CTA. Documented
# default to refine from profiler traces (gridDim of the nccl kernels): NCCL runs ~16-32
# channels on NVLink and fewer across NICs; NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS override
# (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
DEFAULT_SMS = {"nvlink": 24, "infiniband": 16, "ethernet": 16}
SEND_RECV_SMS = 8  # p2p uses fewer channels per peer; documented default


class CollectiveCost(BaseModel):
    """Breakdown of one collective; adds up."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    latency_s: float = 0.0
    transfer_s: float = 0.0

    @property
    def time_s(self) -> float:
        return self.latency_s + self.transfer_s

    def __add__(self, other: CollectiveCost) -> CollectiveCost:
        return CollectiveCost(latency_s=self.latency_s + other.latency_s,
                              transfer_s=self.transfer_s + other.transfer_s)


def _check_kind(kind: str) -> None:
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; known: {', '.join(COLLECTIVE_KINDS)}")


def _factor_and_steps(kind: str, n: int) -> tuple[float, int]:
    if kind == "all_reduce":
        return 2 * (n - 1) / n, 2 * (n - 1)
    if kind in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n, n - 1
    if kind == "broadcast":
        return 1.0, n - 1
    return 1.0, 1  # send_recv


def effective_bw_Bps(*, tier: Tier, msg_bytes: float) -> float:
    """Achieved bytes/s per GPU for a message of `msg_bytes` on `tier` (0 for an empty message)."""
    if msg_bytes <= 0:
        return 0.0
    return tier.effective_bw_Bps * msg_bytes / (msg_bytes + tier.half_eff_bytes)


def collective_cost(*, kind: str, msg_bytes: float, group_size: int, tier: Tier) -> CollectiveCost:
    """Latency and transfer time of one collective; see the module docstring for `msg_bytes`."""
    _check_kind(kind)
    if msg_bytes < 0 or group_size < 1:
        raise ValueError(f"{kind}: msg_bytes ({msg_bytes}) must be >= 0 and group_size ({group_size}) >= 1")
    if group_size == 1:
        return CollectiveCost()
    factor, steps = _factor_and_steps(kind, group_size)
    bw = effective_bw_Bps(tier=tier, msg_bytes=msg_bytes)
    transfer_s = factor * msg_bytes / bw if msg_bytes > 0 else 0.0
    return CollectiveCost(latency_s=tier.latency_s * steps, transfer_s=transfer_s)


def collective_time_s(*, kind: str, msg_bytes: float, group_size: int, tier: Tier) -> float:
    """Seconds for one collective of `kind` over `group_size` ranks on `tier`; 0 for one rank."""
    return collective_cost(kind=kind, msg_bytes=msg_bytes, group_size=group_size, tier=tier).time_s


def sm_free_supported(*, kind: str, tier: Tier) -> bool:
    """Whether `kind` can run on copy engines (no SMs) on `tier`."""
    _check_kind(kind)
    return kind in SM_FREE_KINDS and tier.fabric == "nvlink"


def collective_sms(*, kind: str, sm_free: bool, tier: Tier) -> int:
    """SMs the collective takes from compute while it runs: 0 when SM-free, else a channel count."""
    if sm_free:
        if not sm_free_supported(kind=kind, tier=tier):
            raise ValueError(f"sm_free {kind} is not possible on tier {tier.name!r} ({tier.fabric}): copy engines "
                             f"only do {', '.join(SM_FREE_KINDS)} inside an NVLink domain; set sm_free=False")
        return 0
    _check_kind(kind)
    return SEND_RECV_SMS if kind == "send_recv" else DEFAULT_SMS[tier.fabric]
