"""Fit the twin to measured runs, and compare a run with the twin's prediction.

The fit is the simplest that is honest: for each op class the twin models, the measured time
per step (from the executor's profiler) divided by the modelled time gives a scale on that
class's kernel times; what the run spent outside every modelled class (host and framework
time, ops the twin does not model, such as the profiler's ``other``) becomes a per-step
overhead. On one rank with no communication this reproduces the fitted run's step time by
construction: the test of a calibration is a run it was not fitted on. Both are averaged over the runs
given, weighted by time.

A calibration is for the hardware its runs were measured on, not for the hardware their scenario
names: the executor runs where it runs, and its RunRecord says where (``environment``). So fit
and compare simulate each run's scenario on its measured device's catalog entry
(``hwmodels.gpus.catalog_name``: a CPU run is the ``cpu`` profile, an H200 run ``h200``), and the
calibration records that entry and the devices; the twin refuses it for any other hardware.

Both also simulate each run with the execution it ran (``recorded_execution``: the RunRecord's
resolved ``execution`` section, or the flat fields of a record written before it), so the twin
prices the kernels, compile, CUDA graphs and sparse update the run used (``twin.execution_cost``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

from hwmodels.calibration import Calibration, CalibrationRun, utc_now
from hwmodels.gpus import catalog_name
from scenarios.schema import Scenario
from scenarios.vocab import Direction, OpClass, attention_of, is_attention_label, kernel_kind
from twin.runrecord import RunRecord
from twin.simulate import SimResult, simulate


def _scenario(record: RunRecord) -> Scenario:
    try:
        return Scenario.model_validate(record.scenario)
    except ValueError as e:
        raise ValueError(f"run {record.run_id}: its scenario no longer validates ({e})") from None


def measured_hardware(record: RunRecord) -> str:
    """The catalog entry of the device ``record`` ran on ("cpu", "h200", ...)."""
    env = record.environment
    try:
        return catalog_name(env.device, env.device_name)
    except ValueError as e:
        raise ValueError(f"run {record.run_id}: {e}") from None


def as_measured(record: RunRecord, overrides: Iterable[str] = ()) -> Scenario:
    """The run's scenario as it ran: on the hardware it was measured on (its own ``hardware.gpu``
    when they agree), with the execution it ran (``recorded_execution``), then ``overrides``
    (``--set a.b=c``: what a record cannot tell, e.g. ``execution.ffn_kernel=torch`` for a run that
    chose it through the environment)."""
    from scenarios.loader import apply_set, validate

    s = _scenario(record)
    data = s.model_dump(mode="json")
    data["hardware"]["gpu"] = measured_hardware(record)
    execution, kept_activations = recorded_execution(record)
    data["execution"] = execution
    if kept_activations:
        data["parallelism"]["activation_checkpointing"] = "none"
    for o in overrides:
        data = apply_set(data, o)
    try:
        return validate(data)
    except ValueError as e:
        raise ValueError(f"run {record.run_id}: {e}") from None


# Records written before the RunRecord stored its execution section: what the executor of that day
# ran where the record has no field for it (the commit that changed it, and when).
BIAS_GELU_SINCE = datetime(2026, 11, 30, 19, 2, 37, tzinfo=timezone.utc)  # df5588f: the FFN's bias + GELU op
CHECKPOINTING_SINCE = datetime(2026, 11, 30, 11, 36, 11, tzinfo=timezone.utc)  # 2632c30: checkpointing honoured


def recorded_execution(record: RunRecord) -> tuple[dict, bool]:
    """(the ``execution`` section the run ran, whether it kept every activation whatever its scenario said).

    A record with ``execution`` (the resolved section) says it all. An older one has top-level fields:
    ``attention_kernel`` ('' = before the Triton kernels: the reference), ``embedding_kernel`` ('' =
    before the TBE: torch), ``compiled``, ``cuda_graphs``, ``token_bucket``, ``sparse_update``
    ('fused_backward' or else the optimizer step), ``data_processes``; no FFN field: the bias + GELU op
    ran on CUDA from df5588f on (before it, and on CPU, torch's GELU); before 2632c30 the executor kept
    every activation (no checkpointing)."""
    created = datetime.fromisoformat(record.created_utc.replace("Z", "+00:00"))
    if created.tzinfo is None:
        created = created.replace(tzinfo=timezone.utc)
    if record.execution:
        return dict(record.execution), False
    cuda = record.environment.device == "cuda"
    return {
        "device": record.environment.device,
        "attention_kernel": record.attention_kernel or "reference",
        "embedding_kernel": record.embedding_kernel or "torch",
        "ffn_kernel": "triton" if cuda and created >= BIAS_GELU_SINCE else "torch",
        "compile": record.compiled,
        "cuda_graphs": record.cuda_graphs,
        "token_bucket": record.token_bucket,
        "fused_sparse_update": record.sparse_update == "fused_backward",
        "data_processes": record.data_processes,
    }, created < CHECKPOINTING_SINCE


def fit(records: list[RunRecord], *, sources: list[str]) -> Calibration:
    """Per-op-class scales and a per-step overhead that make the twin match ``records``."""
    if not records:
        raise ValueError("calibrate needs at least one run record")
    scens = [as_measured(r) for r in records]
    gpus = {s.hardware.gpu for s in scens}
    if len(gpus) > 1:
        ran = ", ".join(sorted(f"{r.run_id} on {measured_hardware(r)}" for r in records))
        raise ValueError(f"runs were measured on several kinds of hardware ({ran}); fit one kind at a time")
    measured: dict[str, float] = {}
    modelled: dict[str, float] = {}
    overhead = 0.0
    for r, s in zip(records, scens):
        result = simulate(s)
        model = {**result.compute_s_by_op_class, **_attention_kinds(result.compute_s_by_kernel)}
        run_measured = {**profiled_times(r), **_profiled_kinds(r)}
        for key, t in model.items():
            if t > 0 and run_measured.get(key, 0.0) > 0:
                modelled[key] = modelled.get(key, 0.0) + t
                measured[key] = measured.get(key, 0.0) + run_measured[key]
        covered = sum(t for cls, t in profiled_times(r).items() if model.get(cls, 0.0) > 0)
        overhead += max(0.0, r.step_time_s - covered)
    devices = sorted({f"{r.environment.device}:{r.environment.device_name}" for r in records})
    cal = Calibration(
        version=2,
        gpu=gpus.pop(),
        created_utc=utc_now(),
        runs=[_run_entry(r, src) for r, src in zip(records, sources)],
        scale=_scales(measured, modelled),
        overhead_s=overhead / len(records),
        measured_on=", ".join(devices),
        notes=f"fitted on {len(records)} run(s) measured on {', '.join(devices)}",
    )
    errors = {r.run_id: round(compare(r, cal).error, 6) for r in records}
    return cal.model_copy(update={"fit_error": errors})


def _attention_kinds(by_kernel: dict[str, float]) -> dict[str, float]:
    return {k: t for k, t in by_kernel.items() if is_attention_label(k)}


def _profiled_kinds(r: RunRecord) -> dict[str, float]:
    """Measured per-step time of each attention kind, shrunk like the classes."""
    total = sum(r.op_class_time_s.values())
    k = min(1.0, r.step_time_s / total) if total > 0 else 1.0
    return {kind: k * t for kind, t in r.kernel_time_s.items()}


def _scales(measured: dict[str, float], modelled: dict[str, float]) -> dict[str, float]:
    """measured / modelled per op class, and per attention kind (forward and backward alike:
    the profiler attributes both to the kind) where the runs recorded kinds."""
    out: dict[str, float] = {}
    for key in sorted(measured):
        ratio = measured[key] / modelled[key]
        kind = attention_of(key)
        if kind is None:
            out[key] = ratio
            continue
        for d in Direction:
            out[kernel_kind(OpClass.ATTENTION, attention=kind, direction=d)] = ratio
    return out


def profiled_times(r: RunRecord) -> dict[str, float]:
    """Per-class times per step, shrunk by the profiler's own inflation.

    Profiled steps run slower than the others; where the classes add up to more than the
    (median, mostly unprofiled) step time, they are scaled down together to fit it.
    """
    if not r.op_class_time_s:
        raise ValueError(f"run {r.run_id} has no op_class_time_s; train with profiling on")
    total = sum(r.op_class_time_s.values())
    k = min(1.0, r.step_time_s / total) if total > 0 else 1.0
    return {cls: k * t for cls, t in r.op_class_time_s.items()}


def _run_entry(r: RunRecord, source: str) -> CalibrationRun:
    return CalibrationRun(
        run_id=r.run_id, scenario=r.scenario_name, source_path=source,
        n_steps=len(r.steps), step_time_s=r.step_time_s,
    )  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    run: RunRecord
    result: SimResult
    calibrated: bool

    @property
    def error(self) -> float:
        """(twin - measured) / measured step time."""
        return (self.result.step_time_s - self.run.step_time_s) / self.run.step_time_s


def compare(record: RunRecord, calibration: Calibration | None, overrides: Iterable[str] = ()) -> Comparison:
    """The twin's prediction for the run's scenario on the hardware it ran on, with the execution it
    ran (``as_measured``), beside what it measured."""
    result = simulate(as_measured(record, overrides), calibration=calibration)
    return Comparison(record, result, calibration is not None)
