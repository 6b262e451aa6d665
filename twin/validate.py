"""The twin against many recorded runs: a row per run, the error over the runs a calibration was
not fitted on, a predicted-vs-measured plot, and drift detection.

``validate_runs(records, calibration)`` compares each run with the twin's prediction for it
(``twin.calibrate.compare``: the run's scenario on the hardware it ran on, with the execution it
ran): the step time, every op class the profiler measured, the collectives per mesh axis (busy)
and the peak memory. A run whose id is among the calibration's fitted runs is marked ``fit``;
the others are **held out**, and ``summary`` gives the mean absolute and the largest step-time
error over them (over every run when there is no calibration: nothing was fitted).

``drift(rows, pct)`` is the check a CI job or an engineer runs after a change (a new driver, a
changed kernel, a slower link): the held-out runs whose step time, or whose op classes or axes
(those holding at least ``MIN_SHARE`` of the step: a class of a few microseconds moves by tens of
percent with noise), are off by more than ``pct`` percent, named one by one.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hwmodels.calibration import Calibration
from twin.calibrate import compare, measured_hardware, profiled_times
from twin.runrecord import RunRecord
from twin.simulate import SimResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from scenarios.loader import Overrides

MIN_SHARE = 0.05  # op classes and axes below this share of the measured step are not checked for drift


@dataclass(frozen=True)
class RunRow:
    """One run beside the twin. Errors are (twin - measured) / measured."""

    run_id: str
    scenario: str
    source: str
    held_out: bool
    measured_step_s: float
    twin_step_s: float
    op_classes: dict[str, tuple[float, float]] = field(default_factory=dict)  # class -> (measured, twin) s/step
    axes: dict[str, tuple[float, float]] = field(default_factory=dict)  # axis -> (measured, twin) busy s/step
    memory: tuple[float, float] | None = None  # (measured, twin) peak bytes of one rank

    @property
    def error(self) -> float:
        return (self.twin_step_s - self.measured_step_s) / self.measured_step_s

    @property
    def memory_error(self) -> float | None:
        if self.memory is None:
            return None
        m, p = self.memory
        return (p - m) / m

    def class_errors(self, min_share: float = 0.0) -> dict[str, float]:
        """Each op class's error, for the classes holding at least ``min_share`` of the measured step."""
        return {c: (p - m) / m for c, (m, p) in self.op_classes.items()
                if m > 0 and m >= min_share * self.measured_step_s}  # fmt: skip

    def axis_errors(self, min_share: float = 0.0) -> dict[str, float]:
        return {a: (p - m) / m for a, (m, p) in self.axes.items()
                if m > 0 and m >= min_share * self.measured_step_s}  # fmt: skip


def validate_runs(records: list[RunRecord], calibration: Calibration | None = None, *,
                  sources: list[str] | None = None, overrides: Overrides = ()) -> list[RunRow]:
    """A ``RunRow`` per record (its source path from ``sources``)."""
    fitted = {r.run_id for r in calibration.runs} if calibration is not None else set()
    rows = []
    for i, r in enumerate(records):
        if calibration is not None:
            gpu = measured_hardware(r)
            src = sources[i] if sources else r.run_id
            calibration.check_applies(gpu, where="the calibration", target=f"run {src} ran on {gpu}")
        res = compare(r, calibration, overrides).result
        measured = profiled_times(r) if r.op_class_time_s else {}
        classes = {c: (m, res.compute_s_by_op_class.get(c, 0.0)) for c, m in measured.items() if c != "other"}
        axes = {a: (m, res.comm_s_by_axis.get(a, 0.0)) for a, m in r.comm_s_by_axis.items() if a != "world"}
        memory = (float(r.peak_memory_bytes), twin_peak_bytes(r, res)) if r.peak_memory_bytes > 0 else None
        rows.append(RunRow(r.run_id, r.scenario_name, sources[i] if sources else r.run_id, r.run_id not in fitted,
                           r.step_time_s, res.step_time_s, classes, axes, memory))  # fmt: skip
    return rows


def twin_peak_bytes(r: RunRecord, res: SimResult) -> float:
    """The twin's counterpart of the run's ``peak_memory_bytes``: on CUDA that is
    ``torch.cuda.max_memory_allocated``, which does not see the CUDA context and library handles
    (the ``workspace`` category); on CPU the process's peak RSS, which holds the runtime too."""
    outside = res.memory_bytes.get("workspace", 0.0) if r.environment.device == "cuda" else 0.0
    return res.memory_total_bytes - outside


@dataclass(frozen=True)
class Summary:
    held_out: int
    fitted: int
    step_mape: float | None  # mean |error| over the held-out runs
    step_max: float | None  # the largest |error| among them
    worst_run: str | None
    class_max: dict[str, float]  # per op class, the largest |error| over the held-out runs
    memory_mape: float | None


def summary(rows: list[RunRow]) -> Summary:
    held = [r for r in rows if r.held_out]
    errs = [abs(r.error) for r in held]
    classes: dict[str, float] = {}
    for r in held:
        for c, e in r.class_errors(MIN_SHARE).items():
            classes[c] = max(classes.get(c, 0.0), abs(e))
    mem = [abs(r.memory_error) for r in held if r.memory_error is not None]
    worst = max(held, key=lambda r: abs(r.error)).run_id if held else None
    return Summary(len(held), len(rows) - len(held), statistics.fmean(errs) if errs else None,
                   max(errs) if errs else None, worst, dict(sorted(classes.items())),
                   statistics.fmean(mem) if mem else None)  # fmt: skip


def drift(rows: list[RunRow], pct: float) -> list[str]:
    """What moved past ``pct`` percent on the held-out runs, one phrase per run (empty: nothing)."""
    limit = pct / 100.0
    out = []
    for r in rows:
        if not r.held_out:
            continue
        moved = []
        if abs(r.error) > limit:
            moved.append(f"step time {r.error:+.1%}")
        moved += [f"{c} {e:+.1%}" for c, e in sorted(r.class_errors(MIN_SHARE).items()) if abs(e) > limit]
        moved += [f"{a} comm {e:+.1%}" for a, e in sorted(r.axis_errors(MIN_SHARE).items()) if abs(e) > limit]
        if moved:
            out.append(f"{r.source} ({r.scenario}): " + ", ".join(moved))
    return out


def plot_validation(rows: list[RunRow], path: str | os.PathLike[str]) -> Path:
    """Write ``validation_figure(rows)`` as a PNG, atomically (``twin.plots``)."""
    from twin.plots import save_png

    return save_png(validation_figure(rows), path)


def validation_figure(rows: list[RunRow]) -> Figure:
    """Predicted against measured step time, one point per run (held-out and fitted apart), the
    diagonal and ±5% around it."""
    from twin.plots import _figure

    if not rows:
        raise ValueError("no runs to plot; pass at least one RunRecord")
    fig = _figure(width_in=6.0, height_in=5.2)
    ax = fig.add_subplot(1, 1, 1)
    ms = [r.measured_step_s * 1e3 for r in rows] + [r.twin_step_s * 1e3 for r in rows]
    lo, hi = min(ms) / 1.3, max(ms) * 1.3
    ax.plot([lo, hi], [lo, hi], color="#444444", lw=1, label="twin = measured")
    ax.fill_between([lo, hi], [lo * 0.95, hi * 0.95], [lo * 1.05, hi * 1.05], color="#cccccc", alpha=0.5,
                    label="±5%")  # fmt: skip
    for held, marker, color, label in ((True, "o", "#1f77b4", "held out"), (False, "s", "#ff7f0e", "fitted on")):
        pts = [r for r in rows if r.held_out is held]
        if pts:
            ax.scatter([r.measured_step_s * 1e3 for r in pts], [r.twin_step_s * 1e3 for r in pts], marker=marker,
                       color=color, label=f"{label} ({len(pts)})", zorder=3)  # fmt: skip
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # plain milliseconds, not powers of ten
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("twin's step time (ms)")
    s = summary(rows)
    title = "twin vs measured"
    if s.step_mape is not None:
        title += f": held-out MAPE {s.step_mape:.1%}, max {s.step_max:.1%}"
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return fig


__all__ = ["MIN_SHARE", "RunRow", "Summary", "drift", "plot_validation", "summary", "validate_runs",
           "validation_figure"]
