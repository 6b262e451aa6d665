"""gemtwin's Python API: what an architect or a planner scripts in a notebook.

    from twin.api import load, simulate, sweep, to_frame, sweep_figure

    s = load("gem-h200-1gpu", {"training.micro_batch": 128})
    r = simulate(s)                                   # a SimResult: r.step_time_s, r.mfu, ...
    df = to_frame(sweep(s, {"training.micro_batch": [64, 128, 256]}))
    sweep_figure(...)                                 # a matplotlib Figure: renders inline

The names in ``__all__`` are the public surface; every other name in ``twin`` is internal and may
change. The CLI (``gemtwin``) is a thin layer over these functions: each command loads, calls one
of them and prints. Bad input raises one-line errors naming the field, the value and the fix, as
the CLI prints them: ``ScenarioError`` (a ``ValueError``) for a scenario, ``ValueError`` otherwise.

Importing this module is cheap (the twin is imported on the first call) and never imports torch.
The types (``SimResult``, ``PlanResult``, ...) are imported when first named.
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hwmodels.calibration import load_calibration
from scenarios import ScenarioError, load
from twin.results import from_dict, to_dict, to_frame, to_json
from twin.runrecord import load_run

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from hwmodels.calibration import Calibration
    from scenarios.loader import Overrides, ScenarioRef
    from scenarios.schema import Scenario
    from twin.engine import Timeline
    from twin.forecast import ForecastResult
    from twin.planner import PlanResult
    from twin.runrecord import RunRecord
    from twin.simulate import SimResult
    from twin.sweep import SweepResult
    from twin.validate import RunRow

    CalibrationRef = Calibration | str | os.PathLike[str] | None

__all__ = [
    # scenarios
    "Scenario", "ScenarioError", "load",
    # the twin
    "Calibration", "SimResult", "load_calibration", "simulate",
    "SweepResult", "sweep",
    "PlanResult", "plan", "write_best_yaml",
    "ForecastResult", "forecast",
    # measured runs
    "RunRecord", "RunRow", "load_run", "validate",
    # results as tables
    "from_dict", "to_dict", "to_frame", "to_json",
    # figures
    "breakdown_figure", "forecast_figure", "sweep_figure", "timeline_figure", "validation_figure",
]  # fmt: skip

# the public types, imported from where they live when first named (PEP 562)
_TYPES = {
    "Scenario": "scenarios.schema", "Calibration": "hwmodels.calibration", "SimResult": "twin.simulate",
    "SweepResult": "twin.sweep", "PlanResult": "twin.planner", "ForecastResult": "twin.forecast",
    "RunRecord": "twin.runrecord", "RunRow": "twin.validate",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _TYPES:
        import importlib

        return getattr(importlib.import_module(_TYPES[name]), name)
    raise AttributeError(f"module 'twin.api' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# ---- the twin ---------------------------------------------------------------------------------
def simulate(
    scenario: ScenarioRef, *, calibration: CalibrationRef = None, trace: str | os.PathLike[str] | None = None,
    per_rank: bool = False, imbalance: bool = True, progress: bool = False,
) -> SimResult:  # fmt: skip
    """Predict one optimizer step of ``scenario``: step time, samples/s, MFU, breakdown, memory, goodput.

    ``scenario``: a ``Scenario`` or anything ``load`` takes (a bundled name, a YAML path, a mapping).
    ``calibration``: a ``Calibration`` or the path of a file from ``gemtwin calibrate``; it must be
    for the scenario's GPU. ``trace``: also write a Chrome/Perfetto trace there. ``per_rank``:
    simulate every GPU instead of classes of equivalent ones (slow; a check). ``imbalance=False``:
    one rank at the mean load (no stragglers; about 4x faster). ``progress``: a bar over the rank
    graphs on stderr (worth it with ``per_rank``).
    """
    from twin.progress import progress as bar_of
    from twin.simulate import simulate as run

    s = _scenario(scenario)
    cal = _calibration(calibration, s.hardware.gpu)
    ranks = s.hardware.num_gpus if per_rank else 3
    with bar_of(ranks, enabled=progress, description="building rank graphs") as bar:
        return run(s, calibration=cal, trace=trace, per_rank=per_rank, imbalance=imbalance,
                   on_graph=bar.advance)  # fmt: skip


def sweep(
    scenario: ScenarioRef, grid: dict[str, Sequence[Any]], overrides: Overrides = (), *,
    processes: int | None = None, imbalance: bool = False, progress: bool = False,
    ray_address: str | None = None,
) -> SweepResult:  # fmt: skip
    """Simulate every combination of ``grid`` (``{"training.micro_batch": [64, 128], ...}``, the
    last field varying fastest) on ``scenario`` with ``overrides``: one row per point, in grid
    order; a point that does not load or simulate is a row whose ``error`` says why (the sweep
    always finishes).

    ``processes``: worker processes (default: one per CPU; 1 runs here). ``imbalance``: simulate
    stragglers (about 4x slower). ``ray_address``: run the points on Ray (the ``ray`` extra).
    ``to_frame(result)`` is the table; ``result.write(folder)`` writes sweep.csv and the plots.
    """
    from twin.sweep import sweep as run

    return run(scenario, grid, sets=overrides,
               processes=processes, imbalance=imbalance, progress=progress, ray_address=ray_address)  # fmt: skip


def plan(
    scenario: ScenarioRef, *, gpus: int, gpu: str | None = None, network: str | None = None, top: int = 5,
    budget: int | None = 1000,
) -> PlanResult:  # fmt: skip
    """The ``top`` layouts (5D parallelism, checkpointing, micro-batch, precision) of ``scenario``
    on ``gpus`` GPUs with the most effective samples/s that fit in memory, best first
    (``result.best``; ``result.given`` is the scenario as given). ``gpu`` / ``network``: plan on
    another GPU type or network preset. ``budget``: stop the search after this many simulations
    (a count, so the same call gives the same plan on any machine). ``gemtwin plan`` runs this.
    """
    from twin.planner import plan as run

    return run(_scenario(scenario), gpus=gpus, gpu=gpu, network=network, top=top, budget=budget)


def write_best_yaml(result: PlanResult, path: str | os.PathLike[str], *, base: ScenarioRef,
                    extends: str | None = None) -> Path:  # fmt: skip
    """Write a plan's best layout as a scenario YAML (atomic) and return its path: the full
    scenario, or with ``extends`` (a scenario name or path) only the fields that differ from
    ``base`` (the scenario that was planned). ``gemtwin plan -o`` runs this."""
    from twin.planner import write_best_yaml as write

    return write(result, _scenario(base), path, extends=extends)


def forecast(
    scenario: ScenarioRef, *, growth: float = 4.0, years: int = 3, rule: str | None = None,
    target_samples_per_s: float | None = None, roadmap: str | os.PathLike[str] | None = None,
    plan_budget: int | None = 200, max_global_batch: int | None = None, workers: int | None = None,
    progress: bool = False,
) -> ForecastResult:  # fmt: skip
    """GPUs, MFU, energy and cost per year and GPU generation to hold ``scenario``'s samples/s (or
    ``target_samples_per_s``) while its FLOPs grow ``growth``x a year for ``years`` years.

    ``rule``: how the model grows (layers, width, seq_len, batch; default layers for a GEM model,
    batch for a DLRM). ``roadmap``: a roadmap YAML (default ``twin/data/roadmap.yaml``).
    ``plan_budget``: simulations each plan may run. ``max_global_batch``: the cap of the global
    batch, which grows with the cluster. ``workers``: processes planning the rows side by
    side (default one per CPU). ``gemtwin forecast`` runs this; ``twin.forecast`` says how.
    """
    from twin.forecast import forecast as run

    return run(_scenario(scenario), growth=growth, years=years, rule=rule,
               target_samples_per_s=target_samples_per_s, roadmap=roadmap, plan_budget=plan_budget,
               max_global_batch=max_global_batch, workers=workers, progress=progress)  # fmt: skip


# ---- measured runs ----------------------------------------------------------------------------
def validate(
    runs: RunRecord | str | os.PathLike[str] | Sequence[RunRecord | str | os.PathLike[str]], *,
    calibration: CalibrationRef = None, overrides: Overrides = (),
) -> list[RunRow]:  # fmt: skip
    """The twin beside recorded runs (RunRecords from ``gemtwin train``, or their paths): a
    ``RunRow`` per run with the measured and predicted step (``row.error``), each op class, each
    mesh axis and the peak memory. Each run is priced on the hardware it ran on, with the execution
    it ran; ``overrides`` set what a record cannot tell (``{"execution.ffn_kernel": "torch"}``).
    With a ``calibration``, a run it was fitted on is marked (``row.held_out`` False).
    """
    from twin.validate import validate_runs

    items = [runs] if isinstance(runs, (str, os.PathLike)) or not isinstance(runs, Sequence) else list(runs)
    if not items:
        raise ValueError("validate needs at least one RunRecord or RunRecord path")
    records = [load_run(r) if isinstance(r, (str, os.PathLike)) else r for r in items]
    sources = [os.fspath(r) if isinstance(r, (str, os.PathLike)) else r.run_id for r in items]
    cal = _calibration(calibration, None)
    return validate_runs(records, cal, sources=sources, overrides=overrides)


# ---- figures ----------------------------------------------------------------------------------
def breakdown_figure(result: SimResult) -> Figure:
    """Where the step goes: a stacked bar by op class, SM contention, exposed communication per
    axis and idle, and a bar of each axis's busy time; MFU in the title."""
    from twin.plots import breakdown_figure as draw

    return draw(result)


def timeline_figure(result: SimResult | Timeline, *, title: str = "") -> Figure:
    """What ran when on the slowest rank class: a row per stream, spans coloured by op class or
    collective. Given a ``SimResult``, simulates again what made it (``SimResult.resimulate``)."""
    from twin.plots import timeline_figure as draw
    from twin.simulate import SimResult

    if isinstance(result, SimResult):
        return draw(result.resimulate()[1], title=title or f"{result.scenario}: slowest rank class")
    return draw(result, title=title)


def sweep_figure(result: SweepResult, key: str | None = None) -> Figure:
    """samples/s and MFU against one swept field (default: the first), a line per combination of
    the others; hollow markers do not fit in memory, invalid points are left out."""
    from twin.sweep import key_figure

    return key_figure(result, key if key is not None else result.keys[0])


def forecast_figure(result: ForecastResult, what: str = "gpus") -> Figure:
    """One forecast panel per year, a line per GPU generation: ``what`` is ``gpus``, ``mfu``,
    ``energy_mwh_per_year`` or ``cost_usd_per_year``."""
    return result.figure(what)


def validation_figure(rows: list[RunRow]) -> Figure:
    """The twin's step time against the measured one, a point per run (held out and fitted on
    apart), with the diagonal and ±5%."""
    from twin.validate import validation_figure as draw

    return draw(rows)


# ---- helpers ----------------------------------------------------------------------------------
def _is_scenario(x: object) -> bool:
    from scenarios.schema import Scenario

    return isinstance(x, Scenario)


def _scenario(ref: ScenarioRef) -> Scenario:
    return ref if _is_scenario(ref) else load(ref)


def _calibration(cal: CalibrationRef, gpu: str | None) -> Calibration | None:
    """``cal`` loaded when it is a path, and checked against ``gpu`` (None: not checked here)."""
    if cal is None:
        return None
    where = "calibration"
    if isinstance(cal, (str, os.PathLike)):
        where = f"calibration {os.fspath(cal)}"
        cal = load_calibration(cal)
    if gpu is not None:
        cal.check_applies(gpu, where=where)
    return cal
