"""Versioned calibration files: per-op-class time multipliers fitted on recorded runs.

A calibration's `scale[op_class]` MULTIPLIES the modelled kernel time of that class
(`kernels.kernel_time_s(..., scale=cal.scale)`): time_calibrated = time_default × scale.
`twin.calibrate` fits it so that the modelled per-class time equals the measured one; a class
that is absent keeps scale 1. It does not replace `kernels.DEFAULT_EFFICIENCY`: a scale of
0.9 on `gemm` means "GEMMs ran 10% faster than the roofline with default efficiency says".

Version 2 adds, all optional: `efficiency[kind]` (replaces fields of that kernel kind's curve
in data/efficiency.yaml: compute_eff_max, compute_x_half_flops, memory_eff_max,
memory_x_half_bytes, launch_s; `Calibration.kernel_model()` builds the KernelModel),
`collective_scale["tier/kind"]` (multiplies that collective's modelled time, e.g.
"nvlink/all_reduce"), `collective_alpha_beta["tier/kind"]` ({alpha_s, beta_Bps}: that collective
costs alpha_s + message bytes / beta_Bps, fitted on the collectives the runs measured per mesh
axis; it replaces the model for that tier and kind), `residuals` (per run, the relative error of
the step, of each op class and of each axis after the fit), and `fit_error` (relative step-time error per run after the fit, by run_id
or any label). Version 1 files load unchanged; a version 1 file may not use the version 2 fields.

Files are YAML (JSON is YAML too). `save_calibration` writes atomically: a temporary file in
the same folder, fsync, then os.replace, so an existing file is either old or new, never half.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, ValidationError, field_validator, model_validator

from hwmodels.gpus import get_gpu
from hwmodels.kernels import KERNEL_KINDS, OP_CLASSES, KernelModel
from scenarios.files import read_yaml, write_text_atomic, wrong_kind
from scenarios.messages import short

SUPPORTED_VERSIONS = (1, 2)
_V2_FIELDS = ("efficiency", "collective_scale", "collective_alpha_beta", "residuals", "fit_error", "measured_on",
              "gap_fraction", "sm_contention")


class CalibrationRun(BaseModel):
    """One recorded run a calibration was fitted on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str = Field(min_length=1)
    scenario: str = Field(min_length=1)
    source_path: str = Field(min_length=1, description="the RunRecord file the numbers come from")
    n_steps: int = Field(gt=0)
    step_time_s: PositiveFloat = Field(description="measured mean step time")


class Calibration(BaseModel):
    """Per-op-class multipliers on modelled kernel time, with the runs they were fitted on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1, 2]
    gpu: str = Field(description="the catalog entry of the hardware the runs were measured on; the "
                     "calibration applies to scenarios on that hardware only")
    measured_on: str = Field("", description="v2: the devices the runs ran on, as their RunRecords "
                             "name them ('cuda:NVIDIA H200', 'cpu:AMD EPYC')")
    created_utc: str = Field(description="ISO 8601 with a UTC offset, e.g. 2026-11-30T12:00:00Z")
    runs: list[CalibrationRun] = Field(min_length=1)
    scale: dict[str, PositiveFloat] = Field(
        description="multiplies modelled kernel time per op class, or per kernel kind (which wins)")
    overhead_s: float = Field(0.0, ge=0, description="per-step time outside any modelled kernel "
                              "(host, framework, unmodelled ops), added to the compute stream")
    sm_contention: PositiveFloat = Field(1.0, description="v2: multiplies the share of the compute that each "
                                         "SM-based (on a CPU: core-based) collective takes while it overlaps compute, "
                                         "fitted on multi-rank runs against single-rank ones (1: the model's shares)")
    gap_fraction: float = Field(0.0, ge=0, description="v2: device time between kernels, as a fraction of "
                                "the compute stream's kernel time, added with overhead_s (dependent kernels "
                                "wait for each other's tails: the step outgrows its kernels with the work)")
    efficiency: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="v2: per kernel kind, fields of its efficiency curve to replace "
        "(x_half_scale multiplies both sides' x_half)")
    collective_scale: dict[str, PositiveFloat] = Field(
        default_factory=dict, description="v2: multiplies modelled collective time, keyed 'tier/kind'")
    collective_alpha_beta: dict[str, dict[str, PositiveFloat]] = Field(
        default_factory=dict, description="v2: per 'tier/kind', {alpha_s, beta_Bps}: the collective's time is "
        "alpha_s + message bytes / beta_Bps (replaces the model and collective_scale for that tier and kind)")
    residuals: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="v2: per run_id, the relative error after the fit of the step "
        "('step'), each op class ('class:<name>') and each mesh axis's busy time ('axis:<name>')")
    fit_error: dict[str, float] = Field(
        default_factory=dict, description="v2: relative step-time error after the fit, per run_id (or label)")
    notes: str = ""

    @field_validator("scale")
    @classmethod
    def _scale_keys(cls, v: dict[str, float]) -> dict[str, float]:
        for key in v:
            if key not in OP_CLASSES and key not in KERNEL_KINDS:
                raise ValueError(f"scale key {key!r} is neither an op class ({', '.join(OP_CLASSES)}) "
                                 "nor a kernel kind (hwmodels.kernels.KERNEL_KINDS); fix the key")
        return v

    @field_validator("efficiency")
    @classmethod
    def _known_kinds(cls, v: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        KernelModel(v)  # one-line ValueError on an unknown kind, field or out-of-range value
        return v

    @field_validator("collective_scale")
    @classmethod
    def _tier_kind(cls, v: dict[str, float]) -> dict[str, float]:
        for key in v:
            if key.count("/") != 1 or not all(key.split("/")):
                raise ValueError(f"collective_scale key {key!r} is not 'tier/kind'; write it like 'nvlink/all_reduce'")
        return v

    @field_validator("collective_alpha_beta")
    @classmethod
    def _alpha_beta(cls, v: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for key, ab in v.items():
            if key.count("/") != 1 or not all(key.split("/")):
                raise ValueError(f"collective_alpha_beta key {key!r} is not 'tier/kind'; write it like 'cpu-host/all_gather'")
            if set(ab) != {"alpha_s", "beta_Bps"}:
                raise ValueError(f"collective_alpha_beta[{key!r}] has {sorted(ab)}; give exactly alpha_s and beta_Bps")
        return v

    @model_validator(mode="after")
    def _v2_fields_need_v2(self) -> Calibration:
        fields = type(self).model_fields
        used = [f for f in _V2_FIELDS if getattr(self, f) != fields[f].get_default(call_default_factory=True)]
        if self.version == 1 and used:
            raise ValueError(f"{', '.join(used)} need version: 2 (this file says version: 1); set version: 2")
        return self

    def check_applies(self, gpu: str, *, where: str = "calibration", target: str = "") -> None:
        """One-line ValueError unless this calibration was measured on catalog entry ``gpu``.

        ``where`` names the calibration (its file), ``target`` what ``gpu`` belongs to
        (default: the scenario's ``hardware.gpu``)."""
        if self.gpu == gpu:
            return
        on = f" ({self.measured_on})" if self.measured_on else ""
        target = target or f"hardware.gpu is {gpu!r}"
        raise ValueError(f"{where} was measured on {self.gpu}{on}, but {target}: fit a calibration "
                         f"on {gpu} runs, or simulate {self.gpu} with --set hardware.gpu={self.gpu}")

    def kernel_model(self) -> KernelModel:
        """The efficiency curves with this calibration's per-kind overrides (pass as `kernel_cost(model=...)`)."""
        return KernelModel(self.efficiency)

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        return get_gpu(v).name

    @field_validator("created_utc")
    @classmethod
    def _utc(cls, v: str) -> str:
        when = datetime.fromisoformat(v)
        if when.utcoffset() is None or when.utcoffset().total_seconds() != 0:
            raise ValueError(f"{v!r} is not UTC; write it like 2026-11-30T12:00:00Z")
        return v


def utc_now() -> str:
    """The current time as `created_utc` wants it."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _one_line(err: ValidationError, where: str) -> ValueError:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return ValueError(f"{where}: {loc} = {short(first.get('input'))}: {first['msg']}{more}")


def _read(path: Path) -> Any:
    if not path.is_file():
        raise ValueError(f"calibration file {str(path)!r} not found; run `gemtwin calibrate` or fix the path")
    return read_yaml(path, label=f"calibration file {str(path)!r}")


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    """Read and validate a calibration file; one-line ValueError on any problem."""
    path = Path(path)
    raw = _read(path)
    if not isinstance(raw, dict):
        raise ValueError(f"calibration file {str(path)!r}: expected a mapping with `version: 2`, "
                         f"got {type(raw).__name__}")
    other = wrong_kind(path, raw, expected="a calibration",
                       fix="fit one from RunRecords with: gemtwin calibrate RUN.json -o cal.yaml")
    if other:
        raise ValueError(other)
    if raw.get("version") not in SUPPORTED_VERSIONS:
        raise ValueError(f"calibration file {str(path)!r}: version {raw.get('version')!r} is not supported "
                         f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))}); re-fit with `gemtwin calibrate`")
    try:
        return Calibration.model_validate(raw)
    except ValidationError as e:
        raise _one_line(e, f"calibration file {str(path)!r}") from None


def save_calibration(cal: Calibration, path: str | os.PathLike[str]) -> None:
    """Validate `cal` and write it to `path` atomically; on failure an existing file is untouched."""
    path = Path(path)
    try:
        data = Calibration.model_validate(cal.model_dump()).model_dump(mode="json")
        if data["version"] == 1:  # keep version 1 files free of the (empty) version 2 fields
            data = {k: v for k, v in data.items() if k not in _V2_FIELDS}
    except ValidationError as e:
        raise _one_line(e, f"calibration for {str(path)!r}") from None
    write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))
