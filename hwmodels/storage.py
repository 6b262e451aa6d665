"""Checkpoint storage presets, device-to-host copy rates and failure rates, each with its source.

The numbers live in ``data/storage.yaml``. The twin asks narrow questions of them:
``get_storage(name).write_Bps(num_gpus)``, ``host_copy_Bps(gpu)``, ``get_failures(name).per_gpu_hour``.
A scenario names its store and failure catalog in ``hardware.storage`` / ``hardware.failures``;
``auto`` picks the local disk and no failures for the CPU entries, Tectonic and Llama 3's H100
failure rate otherwise (``resolve_storage`` / ``resolve_failures``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hwmodels._data import load_yaml, unknown
from hwmodels.gpus import is_cpu

AUTO = "auto"


class StoragePreset(BaseModel):
    """A checkpoint store. Aggregate and per-GPU bandwidths in bytes/s; None: no such limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    aggregate_write_Bps: float | None = Field(None, gt=0)
    aggregate_read_Bps: float | None = Field(None, gt=0)
    per_gpu_write_Bps: float | None = Field(None, gt=0)
    per_gpu_read_Bps: float | None = Field(None, gt=0)
    sources: dict[str, str] = Field(description="field -> its source text")

    def write_Bps(self, num_gpus: int) -> float:
        """Bytes/s a job of ``num_gpus`` GPUs writes at: min(aggregate, num_gpus x per-GPU)."""
        return _limit(self.aggregate_write_Bps, self.per_gpu_write_Bps, num_gpus)

    def read_Bps(self, num_gpus: int) -> float:
        """Bytes/s a job of ``num_gpus`` GPUs reads at."""
        return _limit(self.aggregate_read_Bps, self.per_gpu_read_Bps, num_gpus)


def _limit(aggregate: float | None, per_gpu: float | None, n: int) -> float:
    limits = [x for x in (aggregate, None if per_gpu is None else per_gpu * n) if x is not None]
    return min(limits)


class FailureRates(BaseModel):
    """Failures per GPU-hour that stop a synchronous job (each restarts it from a checkpoint)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    per_gpu_hour: float = Field(ge=0)
    source: str


def _value(raw: dict[str, Any] | None, field: str, refs: dict[str, str], sources: dict) -> float | None:
    if raw is None:
        return None
    sources[field] = refs.get(raw["source"], raw["source"])
    return raw["value"]


@cache
def _storage() -> dict[str, StoragePreset]:
    data = load_yaml("storage.yaml")
    out = {}
    for name, raw in data["storage"].items():
        src: dict[str, str] = {}
        vals = {f"aggregate_{k}": _value(raw.get(k), k, data["references"], src) for k in ("write_Bps", "read_Bps")}
        vals |= {k: _value(raw.get(k), k, data["references"], src) for k in ("per_gpu_write_Bps", "per_gpu_read_Bps")}
        out[name] = StoragePreset(name=name, description=raw["description"], sources=src, **vals)
    return out


@cache
def _failures() -> dict[str, FailureRates]:
    data = load_yaml("storage.yaml")
    refs = data["references"]
    return {name: FailureRates(name=name, description=raw["description"], per_gpu_hour=raw["per_gpu_hour"]["value"],
                               source=refs.get(raw["per_gpu_hour"]["source"], raw["per_gpu_hour"]["source"]))
            for name, raw in data["failures"].items()}  # fmt: skip


def list_storage() -> list[str]:
    """Names of the bundled storage presets, sorted."""
    return sorted(_storage())


def list_failures() -> list[str]:
    """Names of the bundled failure catalogs, sorted."""
    return sorted(_failures())


def get_storage(name: str) -> StoragePreset:
    """The bundled storage preset ``name`` (case-insensitive); ValueError naming the known ones."""
    preset = _storage().get(name.lower())
    if preset is None:
        raise unknown("storage preset", name, list_storage())
    return preset


def get_failures(name: str) -> FailureRates:
    """The bundled failure catalog ``name`` (case-insensitive)."""
    rates = _failures().get(name.lower())
    if rates is None:
        raise unknown("failure catalog", name, list_failures())
    return rates


def resolve_storage(name: str, gpu: str) -> StoragePreset:
    """``name``, or for ``auto``: ``local-disk`` on the CPU entries, ``tectonic-llama3`` otherwise."""
    if name.lower() == AUTO:
        name = "local-disk" if is_cpu(gpu) else "tectonic-llama3"
    return get_storage(name)


def resolve_failures(name: str, gpu: str) -> FailureRates:
    """``name``, or for ``auto``: ``none`` on the CPU entries, ``llama3-h100`` otherwise."""
    if name.lower() == AUTO:
        name = "none" if is_cpu(gpu) else "llama3-h100"
    return get_failures(name)


def host_copy_Bps(gpu: str) -> float:
    """Device-to-host copy bytes/s of one GPU (``default`` where the GPU has no entry)."""
    table = load_yaml("storage.yaml")["host_copy"]
    return float(table.get(gpu.lower(), table["default"])["value"])


def host_copy_source(gpu: str) -> str:
    data = load_yaml("storage.yaml")
    raw = data["host_copy"].get(gpu.lower(), data["host_copy"]["default"])
    return data["references"][raw["source"]]


def restart_overhead_s() -> float:
    """The default time from a failure to training again, reading the checkpoint excluded."""
    return float(load_yaml("storage.yaml")["restart_overhead_s"]["value"])
