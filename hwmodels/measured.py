"""Measured ceilings of GPUs we ran on (`data/measured/<gpu>_<date>.yaml`), with provenance.

These are what a real kernel reached, not what a datasheet promises; `kernels.DEFAULT_EFFICIENCY`
and the `h200x2-nv18` network preset are derived from them.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hwmodels._data import DATA_DIR, load_yaml


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SdpaMeasurement(_Frozen):
    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int
    fwd_flops: float = Field(description="achieved FLOP/s, forward")
    fwd_bwd_flops: float | None = Field(None, description="achieved FLOP/s, forward + backward")


class EmbeddingBagMeasurement(_Frozen):
    rows: int
    dim: int
    bags: int
    ids_per_bag: int
    dtype: str
    read_Bps: float = Field(description="bytes of embedding rows read per second")


class NcclRow(_Frozen):
    kind: Literal["all_reduce", "all_to_all", "all_gather"]
    msg_bytes: int = Field(description="nccl-tests 'size': the full buffer (gathered size for all_gather)")
    bus_bw_Bps: float = Field(description="nccl-tests bus bandwidth")
    time_s: float | None = None


class NcclMeasurement(_Frozen):
    gpus: int
    link: str
    link_bw_Bps: float = Field(description="per NVLink, per direction")
    all_reduce_4B_latency_s: float
    rows: list[NcclRow]


class Environment(_Frozen):
    torch: str
    triton: str
    nccl: str


class Device(_Frozen):
    sms: int
    memory_bytes: int


class MeasuredCeilings(_Frozen):
    """One measurement session on one GPU type; `file` is the repo path it was read from."""

    gpu: str
    date: str
    provenance: str
    environment: Environment
    device: Device
    copy_Bps: float = Field(description="device-to-device copy, bytes read + written per second")
    matmul_flops: dict[str, float]
    sdpa: list[SdpaMeasurement]
    embedding_bag: list[EmbeddingBagMeasurement]
    nccl: NcclMeasurement | None = None
    file: str = ""


@cache
def _index() -> dict[str, list[str]]:
    """GPU name -> its measurement files, oldest first (file names sort by ISO date)."""
    out: dict[str, list[str]] = {}
    for entry in sorted(p.name for p in DATA_DIR.joinpath("measured").iterdir() if p.name.endswith(".yaml")):
        out.setdefault(entry.split("_", 1)[0], []).append(entry)
    return out


def measured_ceilings(gpu: str) -> MeasuredCeilings:
    """The newest measured ceilings for `gpu` (case-insensitive)."""
    files = _index().get(gpu.lower())
    if not files:
        known = ", ".join(sorted(_index()))
        raise ValueError(f"no measured ceilings for GPU {gpu!r}; measured: {known}; "
                         f"add hwmodels/data/measured/{gpu.lower()}_<date>.yaml")
    rel = f"measured/{files[-1]}"
    return MeasuredCeilings(**load_yaml(rel), file=f"hwmodels/data/{rel}")


def kernel_sweep(gpu: str) -> dict | None:
    """The newest `data/measured/<gpu>_kernel_sweep_<date>.json` (hwmodels/bench/kernel_sweep.py output), or None."""
    import json

    files = sorted(p.name for p in DATA_DIR.joinpath("measured").iterdir()
                   if p.name.startswith(f"{gpu.lower()}_kernel_sweep_") and p.name.endswith(".json"))
    if not files:
        return None
    data = json.loads(DATA_DIR.joinpath("measured", files[-1]).read_text(encoding="utf-8"))
    return data | {"file": f"hwmodels/data/measured/{files[-1]}"}
