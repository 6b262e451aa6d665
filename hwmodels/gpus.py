"""GPU catalog: dense peaks per dtype, HBM, SMs, NVLink, TDP; each number with its source.

The numbers live in `data/gpus.yaml`; measured ceilings of the machines we ran on live in
`data/measured/` (see `measured.py`).
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from hwmodels._data import load_yaml, unknown

Dtype = Literal["fp32", "tf32", "bf16", "fp8", "mxfp8", "fp4"]
DTYPES: tuple[str, ...] = get_args(Dtype)
_SCALARS = ("hbm_bytes", "hbm_bw_Bps", "sms", "nvlink_bw_Bps", "tdp_w")


class GPUSpec(BaseModel):
    """One GPU. `sources` maps each number's field (`peak_flops.bf16`, `hbm_bw_Bps`...) to its source."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    peak_flops: dict[Dtype, float] = Field(description="dense peak FLOP/s per dtype (no sparsity)")
    hbm_bytes: float = Field(gt=0)
    hbm_bw_Bps: float = Field(gt=0)
    sms: int = Field(gt=0, description="SMs (NVIDIA) or compute units (AMD)")
    nvlink_bw_Bps: float = Field(gt=0, description="NVLink/xGMI bytes/s per GPU, per direction")
    tdp_w: float = Field(gt=0)
    sources: dict[str, str]
    notes: dict[str, str] = {}
    device_names: tuple[str, ...] = Field((), description="what torch.cuda.get_device_name() reports")
    base: str = Field("", description="the bundled entry this one stands in for (a probe profile's `cpu`): "
                      "its efficiency curves, calibrations and storage defaults; '' for a bundled entry")

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype`; ValueError naming the GPU, the dtype and the choices."""
        if dtype not in self.peak_flops:
            have = ", ".join(d for d in DTYPES if d in self.peak_flops)
            why = "not in the catalog for this GPU" if dtype in DTYPES else "unknown dtype"
            raise ValueError(f"GPU {self.name!r} has no peak for dtype {dtype!r} ({why}); use one of: {have}")
        return self.peak_flops[dtype]


def _entry(raw: dict[str, Any], field: str, refs: dict[str, str], sources: dict, notes: dict) -> Any:
    """Unpack one `{value, source, note}` entry, resolving the source key to its full text."""
    sources[field] = refs.get(raw["source"], raw["source"])
    if "note" in raw:
        notes[field] = raw["note"]
    return raw["value"]


def _spec(name: str, raw: dict[str, Any], refs: dict[str, str]) -> GPUSpec:
    sources: dict[str, str] = {}
    notes: dict[str, str] = {}
    peaks = {d: _entry(v, f"peak_flops.{d}", refs, sources, notes) for d, v in raw["peak_flops"].items()}
    scalars = {f: _entry(raw[f], f, refs, sources, notes) for f in _SCALARS}
    return GPUSpec(name=name, description=raw.get("description", ""), peak_flops=peaks,
                   sources=sources, notes=notes, device_names=tuple(raw.get("device_names", ())),
                   base=raw.get("base", ""),
                   **scalars)  # fmt: skip


@cache
def _catalog() -> dict[str, GPUSpec]:
    data = load_yaml("gpus.yaml")
    return {name: _spec(name, raw, data["references"]) for name, raw in data["gpus"].items()}


def list_gpus() -> list[str]:
    """Names of the catalog's GPUs, sorted."""
    return sorted(_catalog())


SHARED_SEP = "/"  # "<entry>/<k>": the entry time-shared by k processes (shared_entry)
CPU_GPUS = ("cpu", "cpu-rank8")  # catalog entries that are CPU processes, not GPUs


def is_cpu(gpu: str) -> bool:
    """A CPU entry: ``cpu``, ``cpu-rank8``, one shared by processes (``cpu/4``) or a probe profile
    (``probe:PATH``, always of a CPU)."""
    return gpu.lower().split(SHARED_SEP)[0] in CPU_GPUS or gpu.startswith("probe:")


def get_gpu(name: str) -> GPUSpec:
    """The catalog entry for `name` (case-insensitive), a probe profile's for ``probe:PATH``
    (hwmodels/profile.py), or ``<entry>/<k>``: a CPU entry shared by k processes (``shared_entry``)."""
    if name.startswith("probe:"):
        from hwmodels.profile import load_profile, probe_path

        return load_profile(probe_path(name))[0]
    if SHARED_SEP in name:
        return shared_entry(name)
    spec = _catalog().get(name.lower())
    if spec is None:
        raise unknown("GPU", name, list_gpus())
    return spec


def catalog_name(device: str, device_name: str) -> str:
    """The catalog entry a measured device is: ``("cuda", "NVIDIA H200")`` -> ``"h200"``.

    A run on the CPU is the ``cpu`` entry whatever the CPU model (the profile of the project's
    CPU machines; a calibration then corrects it for another CPU). ValueError, one line, for a
    GPU the catalog does not list.
    """
    if device == "cpu":
        return get_gpu("cpu").name
    want = device_name.strip().lower()
    for spec in _catalog().values():
        if any(want == n.lower() for n in spec.device_names):
            return spec.name
    known = ", ".join(f"{n!r} ({s.name})" for s in _catalog().values() for n in s.device_names)
    raise ValueError(f"device {device_name!r} is not in the GPU catalog (known: {known}); add an entry "
                     "with its device_names to hwmodels/data/gpus.yaml")


SHARED_SOURCE = ("derived: the {base} entry's measured rates (FLOP/s, memory bandwidth) times {share:.4g} and its "
                 "memory over {k}: {k} processes (ranks) time-share its {cores} cores evenly, each with its "
                 "share of the threads (torchrun's default); an assumption, checked by gemtwin validate on the "
                 "CPU campaign (hwmodels/data/runs/cpu-2026-12-02-campaign)")


@cache
def shared_entry(name: str) -> GPUSpec:
    """``<entry>/<k>``: one of k processes sharing a CPU entry's machine (the ``cpu`` profile was
    measured with all its cores): 1/k of its rates, memory and TDP; its cores (a collective's thread
    competes with the compute for one of them as on the whole machine), its efficiency curves and
    calibrations (``base``). What a CPU run of k ranks on one machine is
    priced on (``twin.calibrate.as_measured``)."""
    base_name, _, k_text = name.rpartition(SHARED_SEP)
    if not k_text.isdigit() or int(k_text) < 1:
        raise ValueError(f"GPU {name!r}: after '{SHARED_SEP}' give the processes sharing the entry, e.g. cpu/4")
    base, k = get_gpu(base_name), int(k_text)
    if k == 1:
        return base
    if not is_cpu(base_name):
        raise ValueError(f"GPU {name!r}: only a CPU entry is shared between processes (a GPU is one per rank); "
                         f"use {base.name}")
    share = 1.0 / k
    src = SHARED_SOURCE.format(base=base.name, share=share, k=k, cores=base.sms)
    return GPUSpec(name=f"{base.name}{SHARED_SEP}{k}", description=f"one of {k} processes sharing {base.description}",
                   peak_flops={d: v * share for d, v in base.peak_flops.items()}, hbm_bytes=base.hbm_bytes / k,
                   hbm_bw_Bps=base.hbm_bw_Bps * share, sms=base.sms, nvlink_bw_Bps=base.nvlink_bw_Bps,
                   tdp_w=base.tdp_w / k, sources={f: src for f in base.sources}, notes={},
                   base=base.base or base.name)  # fmt: skip
