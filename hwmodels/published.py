"""The collective model against published nccl-tests results (data/published/nccl_collectives.yaml).

    python -m hwmodels.published        # the table: predicted vs published time, error per row

Each row is priced as nccl-tests runs it: one group of ``gpus`` consecutive ranks, ``msg_bytes`` in
the nccl-tests convention, the fastest algorithm; no fitting to these rows (the file says how they
were chosen, and which preset each system is priced on). tests/hwmodels/test_published_collectives.py
holds the errors reached; hwmodels/GROUPS.md discusses them.
"""

from __future__ import annotations

import statistics
import sys
from typing import NamedTuple

from hwmodels._data import load_yaml
from hwmodels.collectives import collective_cost
from hwmodels.network import NetworkPreset, get_network

GB300_RACK_GPUS = 64  # the 16 hosts x 4 GPUs OCI used per NVL72 rack
GB300_NIC_BPS = 2 * 400e9 / 8  # 8 x 400 Gb/s per 4-GPU host (OCI's shape table)
ROCE_EFFICIENCY = 0.92  # h100-roce-3tier's Ethernet tier


class Compared(NamedTuple):
    source: str
    system: str
    kind: str
    gpus: int
    msg_bytes: int
    published_s: float
    predicted_s: float
    algorithm: str

    @property
    def error(self) -> float:
        """predicted / published - 1 (time: positive = the model is slower)."""
        return self.predicted_s / self.published_s - 1


def oci_gb300() -> NetworkPreset:
    """gb200-nvl72's NVLink tier as OCI's GB300 racks were used (64 GPUs a rack), then RoCE at
    2 x 400 Gb/s per GPU."""
    nvl72 = get_network("gb200-nvl72")
    nvlink, leaf = nvl72.tiers[0], nvl72.tiers[1]
    rack = nvlink.model_copy(update={"domain_gpus": GB300_RACK_GPUS})
    roce = leaf.model_copy(update={"name": "roce", "fabric": "ethernet", "domain_gpus": 1 << 20,
                                   "bw_per_gpu_Bps": GB300_NIC_BPS, "efficiency": ROCE_EFFICIENCY})
    return NetworkPreset(name="oci-gb300", description="OCI GB300 NVL72 racks of 64 GPUs over RoCE, as published",
                         tiers=[rack, roce], sources=dict(nvl72.sources))  # fmt: skip


def systems() -> dict[str, NetworkPreset]:
    return {"oci-gb300": oci_gb300(), "h100-ib": get_network("h100-ib")}


def compare() -> list[Compared]:
    """Every published row, priced."""
    data, nets, out = load_yaml("published/nccl_collectives.yaml"), systems(), []
    for r in data["rows"]:
        n, m = r["gpus"], r["msg_bytes"]
        published = r["time_us"] * 1e-6 if "time_us" in r else _time_from_busbw(r["kind"], m, n, r["busbw_GBps"])
        c = collective_cost(kind=r["kind"], msg_bytes=m, group_size=n, network=nets[r["system"]])
        out.append(Compared(r["source"], r["system"], r["kind"], n, m, published, c.time_s, c.algorithm))
    return out


def _time_from_busbw(kind: str, m: int, n: int, busbw_GBps: float) -> float:
    factor = 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n
    return m * factor / (busbw_GBps * 1e9)


def format_table(rows: list[Compared]) -> str:
    lines = [f"{'system':10s} {'kind':10s} {'GPUs':>4s} {'size':>8s} {'published':>11s} {'predicted':>11s} "
             f"{'error':>7s}  algorithm"]  # fmt: skip
    for r in rows:
        lines.append(f"{r.system:10s} {r.kind:10s} {r.gpus:4d} {_size(r.msg_bytes):>8s} {r.published_s * 1e6:9.1f}us "
                     f"{r.predicted_s * 1e6:9.1f}us {r.error:+7.1%}  {r.algorithm}")  # fmt: skip
    for kind in dict.fromkeys(r.kind for r in rows):
        errs = [abs(r.error) for r in rows if r.kind == kind]
        lines.append(f"{kind}: {len(errs)} rows, median |error| {statistics.median(errs):.1%}, max {max(errs):.1%}")
    return "\n".join(lines)


def _size(m: int) -> str:
    return f"{m >> 30} GiB" if m >= 1 << 30 else f"{m >> 20} MiB"


if __name__ == "__main__":  # pragma: no cover
    print(format_table(compare()))
    sys.exit(0)
