"""The ``gemtwin`` command line.

Bad input (a scenario that does not load, a missing file, a bad value) prints one line naming
the field, the value and the fix, and exits 2 — never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

import scenarios
from scenarios import ScenarioError
from twin.console import error, install_hint, out, warning

app = typer.Typer(
    help="gemtwin: a digital twin of GEM-class recommendation-model training, and a real "
    "executor that calibrates it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # plain help: typer's rich panels print a type for every flag (`--brief <bool>`)
    rich_markup_mode=None,
)
hw_app = typer.Typer(help="Hardware catalog: GPUs and network presets.", no_args_is_help=True,
                     rich_markup_mode=None)
app.add_typer(hw_app, name="hw")

ScenarioArg = Annotated[
    str, typer.Argument(help="A bundled scenario name (gemtwin scenarios) or a YAML path.")
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", metavar="FIELD=VALUE",
                 help="Override a field: --set training.micro_batch=512 (repeatable)."),
]


class UsageError(ValueError):
    """Bad input from the user: one line, exit 2."""


def friendly(fn):
    """Turn bad input into one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ScenarioError, UsageError, ValueError, FileNotFoundError) as e:
            error(str(e) or type(e).__name__)
            raise typer.Exit(2) from None

    return wrapper


def _load(scenario: str, sets: list[str] | None) -> scenarios.Scenario:
    return scenarios.load(scenario, sets or [])


def _out_path(path: Path | None) -> Path | None:
    if path is not None and path.exists() and path.is_dir():
        raise UsageError(f"--out {path} is a folder; give a file name")
    return path


# ---- scenarios --------------------------------------------------------------------------
@app.command("scenarios")
@friendly
def list_scenarios() -> None:
    """List the bundled scenarios."""
    table = Table("name", "GPUs", "GPU", "description")
    for name in scenarios.bundled():
        s = scenarios.load(name)
        table.add_row(name, str(s.hardware.num_gpus), s.hardware.gpu, s.description)
    out.print(table)


@app.command()
@friendly
def schema() -> None:
    """Print the Scenario JSON Schema."""
    print(json.dumps(scenarios.Scenario.model_json_schema(), indent=1))


@app.command()
@friendly
def show(scenario: ScenarioArg = scenarios.DEFAULT_SCENARIO, set_: SetOpt = None) -> None:
    """Print a scenario after extends and --set, as YAML."""
    import yaml

    s = _load(scenario, set_)
    print(yaml.safe_dump(s.model_dump(mode="json"), sort_keys=False), end="")


# ---- twin -------------------------------------------------------------------------------
@app.command()
@friendly
def flops(scenario: ScenarioArg = scenarios.DEFAULT_SCENARIO, set_: SetOpt = None) -> None:
    """Analytic FLOPs, bytes and parameters per layer of one micro-batch."""
    from twin.report import flops_table

    s = _load(scenario, set_)
    for renderable in flops_table(s):
        out.print(renderable)


@app.command()
@friendly
def simulate(
    scenario: ScenarioArg = scenarios.DEFAULT_SCENARIO,
    set_: SetOpt = None,
    out_: Annotated[Optional[Path], typer.Option("--out", help="Write the result JSON.")] = None,
    trace: Annotated[
        Optional[Path], typer.Option(help="Write a Chrome/Perfetto trace (ui.perfetto.dev).")
    ] = None,
    calibration: Annotated[
        Optional[Path], typer.Option(help="A calibration file from `gemtwin calibrate`.")
    ] = None,
    brief: Annotated[bool, typer.Option(help="One line: for loops and comparisons.")] = False,
    plots: Annotated[
        Optional[Path], typer.Option(help="Folder for the breakdown and timeline PNGs.")
    ] = None,
    per_rank: Annotated[
        bool, typer.Option(help="Simulate every GPU, not classes of equal ones (slow; a check).")
    ] = False,
) -> None:
    """Predict step time, samples/s, MFU and memory of a scenario, with a breakdown."""
    from twin import api
    from twin.report import result_tables

    s = _load(scenario, set_)
    if plots is not None and plots.exists() and not plots.is_dir():
        raise UsageError(f"--plots {plots} is a file; give a folder")
    t0 = time.perf_counter()
    result = api.simulate(s, calibration=calibration, trace=_out_path(trace), per_rank=per_rank,
                          progress=per_rank and not brief)  # fmt: skip
    wall = time.perf_counter() - t0
    if brief:
        print(
            f"{result.scenario} {result.num_gpus}x{result.gpu}: step {result.step_time_s * 1e3:.1f} ms,"
            f" {result.samples_per_s:,.0f} samples/s, MFU {result.mfu:.1%} ({result.mfu_peak}),"
            f" exposed comm {result.breakdown_s['exposed_comm'] / result.step_time_s:.0%},"
            f" memory {result.memory_total_bytes / 1e9:.1f}/{result.memory_capacity_bytes / 1e9:.0f} GB"
        )
        if result.goodput is not None:
            print(result.goodput.line())
    else:
        for renderable in result_tables(result):
            out.print(renderable)
        out.print(f"simulated {result.num_ops} ops in {wall:.3f} s")
    if not result.memory_fits:
        warning(result.memory_message)
    if brief and result.execution_not_priced:  # the summary table lists them otherwise
        warning("not priced (predicted as the curves' choice): " + "; ".join(result.execution_not_priced))
    if out_ is not None:
        result.save(_out_path(out_))
        out.print(f"wrote {out_}")
    if trace is not None:
        out.print(f"wrote {trace} (open in https://ui.perfetto.dev)")
    if plots is not None:
        _write_plots(result, plots)


def _write_plots(result, folder: Path) -> None:
    """The breakdown and the timeline (``twin.api``'s figures: the timeline simulates the result
    again, exactly as it was made), as PNGs."""
    from twin import api
    from twin.plots import save_png

    b = save_png(api.breakdown_figure(result), folder / f"{result.scenario}-breakdown.png")
    t = save_png(api.timeline_figure(result), folder / f"{result.scenario}-timeline.png")
    out.print(f"wrote {b} and {t}")


# ---- executor ---------------------------------------------------------------------------
@app.command()
@friendly
def train(
    scenario: ScenarioArg = "debug-cpu",
    set_: SetOpt = None,
    steps: Annotated[Optional[int], typer.Option(help="Steps (default: training.steps).")] = None,
    out_: Annotated[Path, typer.Option("--out", help="Where to write the RunRecord.")] = Path(
        "run.json"
    ),
    trace: Annotated[Optional[Path], typer.Option(
        help="Write the profiled steps' torch.profiler trace here (.json or .json.gz) and an op table next to it.")] = None,
    nproc: Annotated[Optional[int], typer.Option(
        help="Start this many local ranks (torch's elastic launcher); hardware.num_gpus must match. "
        "Leave it out under torchrun or srun: gemtwin train joins their group.")] = None,
    timeout_s: Annotated[float, typer.Option(
        help="With several ranks: a collective that waits longer than this ends the run (a rank hung or died).")] = 600.0,
    resume: Annotated[bool, typer.Option(
        help="Continue from the newest committed checkpoint under training.checkpoint.dir (a fresh start if none).")] = False,
    resume_from: Annotated[Optional[Path], typer.Option(
        help="Continue from this checkpoint (a step-NNNNNNNN directory), at this run's mesh.")] = None,
    max_restarts: Annotated[int, typer.Option(
        help="With --nproc: restart the ranks this many times after a failure, each time from the newest checkpoint.")] = 0,
) -> None:
    """Train the real model of a scenario and write a RunRecord: one process, --nproc N local
    ranks, or one rank of the group torchrun or srun started.

    How it runs (kernels, compile, CUDA graphs, batch layout, loader) is the scenario's
    ``execution`` section: pick with --set, e.g. --set execution.attention_kernel=reference
    --set execution.cuda_graphs=false (gemtwin schema lists the fields)."""
    if steps is not None and steps < 1:
        raise UsageError(f"--steps ({steps}) must be at least 1")
    if nproc is not None and nproc < 1:
        raise UsageError(f"--nproc ({nproc}) must be at least 1")
    if timeout_s <= 0:
        raise UsageError(f"--timeout-s ({timeout_s:g}) must be positive")
    if resume and resume_from is not None:
        raise UsageError("--resume and --resume-from both given; use one (--resume: the newest checkpoint)")
    if max_restarts < 0 or (max_restarts and not (nproc and nproc > 1)):
        raise UsageError(f"--max-restarts ({max_restarts}) must be >= 0 and needs --nproc N (N > 1): the launcher "
                         "that restarts is the one --nproc starts (under torchrun, pass torchrun --max-restarts)")
    s = _load(scenario, set_)
    try:
        from executor import launch
        from executor.train import train as run
    except ImportError as e:
        raise UsageError(
            f"gemtwin train needs the executor's dependencies ({e.name} is missing); "
            f"install them with: {install_hint('exec')}"
        ) from None
    kw = dict(steps=steps, out=_out_path(out_), log=lambda line: out.print(line, soft_wrap=True), trace=trace,
              resume=resume_from if resume_from is not None else (True if resume else None))
    joined = launch.find_launcher()
    if joined is not None and nproc is not None:
        raise UsageError(f"--nproc starts its own ranks, but this process is rank {joined.rank} of "
                         f"{joined.world_size} under {joined.launcher}; leave --nproc out")
    try:
        if nproc is not None and nproc > 1:
            record = launch.spawn(s, nproc, timeout_s=timeout_s, max_restarts=max_restarts, **kw)
        elif joined is not None:
            record = launch.run_rank(s, joined, timeout_s=timeout_s, **kw)
            if joined.rank != 0:
                return
        else:
            record = run(s, **kw)
    except launch.RankFailed as e:  # not bad input: that is refused before any rank starts (exit 2)
        error(str(e))
        raise typer.Exit(1) from None
    out.print(
        f"step_time_s={record.step_time_s:.4f} achieved={record.achieved_flops_per_s / 1e9:.2f} "
        + (f"GFLOP/s MFU {record.mfu:.1%} of {record.mfu_peak}; " if record.mfu is not None else "GFLOP/s; ")
        + f"attention {record.attention_kernel}, embeddings {record.embedding_kernel}, "
        f"compiled {'yes' if record.compiled else 'no'}, "
        f"cuda graphs {f'yes ({record.graph_replays} steps replayed)' if record.cuda_graphs else 'no'}, "
        f"sparse update {record.sparse_update}",
        soft_wrap=True,
    )
    if record.world_size > 1:
        out.print(_ranks_line(record), soft_wrap=True)
    first, last, m = record.steps[0], record.steps[-1], record.metrics
    held_out = ("no held-out evaluation (training.eval_batches 0)" if "eval_samples" not in m else
                f"held-out ({m['eval_samples']:,.0f} samples) loss {m['loss']:.4f}, "
                + ", ".join(f"{task} AUC {m[f'auc_{task}']:.3f} NE {m[f'ne_{task}']:.3f}" for task in s.model.tasks.names))
    out.print(
        f"training loss {first.loss:.4f} (step {first.step}) -> {last.loss:.4f} (step {last.step}); "
        f"{held_out}; wrote {out_}",
        soft_wrap=True,
    )
    if record.checkpoint_steps or record.resumed_from:
        stalls, saved = record.checkpoint_stall_s, record.checkpoint_steps
        blocked = (f"{stalls[0] * 1e3:.0f} ms" if len(stalls) == 1 else
                   f"{min(stalls) * 1e3:.0f}-{max(stalls) * 1e3:.0f} ms a save")  # fmt: skip
        out.print(
            (f"resumed from {record.resumed_from}; " if record.resumed_from else "")
            + (f"checkpoint{'s' if len(saved) > 1 else ''} after step{'s' if len(saved) > 1 else ''} "
               f"{', '.join(map(str, saved))} in {s.training.checkpoint.dir} "
               f"({'async' if record.checkpoint_async else 'sync'}, the loop blocked {blocked})" if saved
               else "no checkpoint saved"),
            soft_wrap=True,
        )


def _ranks_line(record) -> str:
    """A multi-rank run's mesh, and each rank's median step time (after warm-up) and peak memory."""
    import statistics

    mesh = " ".join(f"{a}={n}" for a, n in record.mesh.items() if a != "world")
    times = " ".join(f"{statistics.median(t[record.warmup_steps:] or t) * 1e3:.1f}" for t in record.rank_step_time_s)
    memory = " ".join(f"{b / 2**20:.0f}" for b in record.rank_peak_memory_bytes)
    return f"{record.world_size} ranks, mesh {mesh}; median step time by rank {times} ms; peak memory by rank {memory} MiB"


@app.command()
@friendly
def calibrate(
    runs: Annotated[list[Path], typer.Argument(help="RunRecord JSON files from gemtwin train.")],
    out_: Annotated[Path, typer.Option("-o", "--out", help="Calibration file to write.")] = Path(
        "calibration.yaml"
    ),
    notes: Annotated[str, typer.Option(help="What the runs were (kernels, versions, ...).")] = "",
) -> None:
    """Fit the twin to measured runs: per op class and kernel kind a scale and, where runs of
    different sizes tell it, an efficiency curve; the collectives' α/β per tier and kind; the
    slowdown of compute under overlapped collectives; the per-step overhead and the gaps between
    kernels. Robust to an outlier run; the file records the runs and their residuals."""
    from twin.calibrate import fit
    from twin.report import calibration_table
    from twin.runrecord import load_run

    records = [load_run(p) for p in runs]
    cal = fit(records, sources=[str(p) for p in runs])
    if notes:
        cal = cal.model_copy(update={"notes": f"{cal.notes}; {notes}"})
    from hwmodels.calibration import save_calibration

    save_calibration(cal, _out_path(out_))
    out.print(calibration_table(cal))
    out.print(f"wrote {out_}")


@app.command()
@friendly
def validate(
    runs: Annotated[list[Path], typer.Argument(help="RunRecord JSON files from gemtwin train.")],
    calibration: Annotated[
        Optional[Path], typer.Option(help="A calibration file from gemtwin calibrate.")
    ] = None,
    set_: SetOpt = None,
    fail_above: Annotated[Optional[float], typer.Option(
        help="Exit 1 when a held-out run's step time, or an op class or mesh axis holding 5% of its step, is "
        "off by more than this many percent, naming what moved (drift: a new driver, a changed kernel, a slower link).")] = None,
    png: Annotated[Optional[Path], typer.Option(help="Write a predicted-vs-measured plot (PNG) here.")] = None,
) -> None:
    """Twin vs measured for recorded runs: the step, the op classes, the collectives per axis and
    memory; with several runs a row each and the error over the runs the calibration was not
    fitted on (held out).

    The twin prices each run's scenario with the execution the run recorded (older records: their
    kernel, compile, graphs and sparse-update fields); --set overrides what a record cannot tell,
    e.g. --set execution.ffn_kernel=torch for a run that chose it through the environment."""
    from twin import api
    from twin.calibrate import compare, measured_hardware
    from twin.plots import save_png
    from twin.report import comm_validation_table, runs_validation_table, validation_table
    from twin.validate import drift

    if fail_above is not None and fail_above <= 0:
        raise UsageError(f"--fail-above ({fail_above:g}) must be a positive percentage, e.g. --fail-above 5")
    records = [api.load_run(p) for p in runs]
    cal = api.load_calibration(calibration) if calibration else None
    if len(records) == 1:
        record = records[0]
        if cal is not None:
            gpu = measured_hardware(record)
            cal.check_applies(gpu, where=f"calibration {calibration}", target=f"run {runs[0]} ran on {gpu}")
        cmp = compare(record, cal, set_ or [])
        out.print(validation_table(cmp))
        if (comm := comm_validation_table(cmp)) is not None:
            out.print(comm)
    if len(records) == 1 and png is None and fail_above is None:
        return  # one run's tables are all it asked for
    rows = api.validate(runs, calibration=cal, overrides=set_ or [])
    if len(records) > 1:
        out.print(runs_validation_table(rows), soft_wrap=True)
    if png is not None:
        save_png(api.validation_figure(rows), _out_path(png))
        out.print(f"wrote {png}")
    if fail_above is not None:
        moved = drift(rows, fail_above)
        if moved:
            error(f"drift above {fail_above:g}%: " + "; ".join(moved))
            raise typer.Exit(1)
        out.print(f"no drift above {fail_above:g}% on {sum(r.held_out for r in rows)} held-out run(s)")


# ---- hardware ---------------------------------------------------------------------------
@hw_app.command("list")
@friendly
def hw_list() -> None:
    """GPUs and network presets in the catalog."""
    from twin.report import hw_tables

    for renderable in hw_tables():
        out.print(renderable)


@hw_app.command("show")
@friendly
def hw_show(name: Annotated[str, typer.Argument(help="GPU name, e.g. h200.")]) -> None:
    """One GPU's peaks, memory, sources and kernel efficiency curves."""
    from twin.report import gpu_tables

    for renderable in gpu_tables(name):
        out.print(renderable)


@hw_app.command("probe")
@friendly
def hw_probe(
    out_path: Annotated[Optional[Path], typer.Option("-o", "--out", help="Write the profile (YAML) here; "
                                                     "use it as hardware.gpu / hardware.network = probe:PATH.")] = None,
    ranks: Annotated[int, typer.Option(help="Local processes the gloo collectives run between.")] = 2,
    budget_s: Annotated[float, typer.Option(help="Seconds to measure in (the ranks' start-up included).")] = 50.0,
) -> None:
    """Measure this machine (torch.mm rate, copy bandwidth, gloo all-reduce / all-to-all alpha/beta
    between local ranks) and write a profile the twin can use as its hardware."""
    import yaml

    from hwmodels.profile import build_profile, load_profile
    from hwmodels._data import load_yaml
    from scenarios.files import write_text_atomic
    from twin.report import probe_table

    path = _out_path(out_path)
    try:
        from hwmodels.bench.probe import measure
    except ImportError as e:  # torch: the exec extra
        raise UsageError(f"gemtwin hw probe needs torch ({e}); {install_hint('exec')}") from None
    t0 = time.perf_counter()
    doc = build_profile(measure(ranks=ranks, budget_s=budget_s), base=load_yaml("gpus.yaml")["gpus"]["cpu"])
    out.print(probe_table(doc))
    if path is not None:
        write_text_atomic(path, yaml.safe_dump(doc, sort_keys=False))
        load_profile(path, field="--out")  # what was written loads
        out.print(f"wrote {path} in {time.perf_counter() - t0:.1f} s; simulate on it with "
                  f"--set hardware.gpu=probe:{path} --set hardware.network=probe:{path}")


@hw_app.command("topo")
@friendly
def hw_topo(
    preset: Annotated[str, typer.Option(help="Network preset (gemtwin hw list).")],
    gpus: Annotated[int, typer.Option(help="GPUs in the job.")],
    png: Annotated[Optional[Path], typer.Option(help="Draw the (aggregated) topology here.")] = None,
) -> None:
    """Tier sizes of a network preset at a GPU count; optionally a PNG of the topology."""
    from hwmodels.network import get_network
    from twin.report import topo_table
    from twin.topo import draw_topology

    net = get_network(preset)
    out.print(topo_table(net, gpus))
    if png is not None:
        draw_topology(net, gpus, _out_path(png))
        out.print(f"wrote {png}")


def _register_extra() -> None:
    from twin.cli_extra import report_command, sweep_command
    from twin.forecast import forecast_command
    from twin.planner import plan_command
    from twin.published import published_command

    app.command("sweep")(friendly(sweep_command))
    app.command("report")(friendly(report_command))
    app.command("plan")(friendly(plan_command))
    app.command("forecast")(friendly(forecast_command))
    app.command("published")(friendly(published_command))


_register_extra()


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
