"""``gemtwin sweep`` and ``gemtwin report``: command functions for twin/cli.py to register.

    from twin.cli_extra import report_command, sweep_command
    app.command("sweep")(friendly(sweep_command))
    app.command("report")(friendly(report_command))

Bad input raises ``ValueError`` subclasses (``GridError``, ``ScenarioError``) or
``FileNotFoundError`` with a one-line message; ``friendly`` prints it and exits 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from scenarios.messages import count
from twin.console import out, warning


def sweep_command(
    scenario: Annotated[str, typer.Argument(help="A bundled scenario name or a YAML path.")],
    grid: Annotated[
        list[str],
        typer.Option("--grid", metavar="FIELD=V1,V2", help="A swept field: --grid training.micro_batch=64,128 (repeatable; "
                     "values split on commas outside {} [] and quotes, or on ';' when there is one: "
                     "--grid 'parallelism.table_sharding={a: row, b: table};auto')."),
    ],
    set_: Annotated[
        Optional[list[str]],
        typer.Option("--set", metavar="FIELD=VALUE", help="Override a field in every point: --set training.seed=1."),
    ] = None,
    out_dir: Annotated[
        Path, typer.Option("-o", "--out", help="Folder for sweep.csv, the plots, and sweep.parquet where pyarrow is installed.")
    ] = Path("sweep"),
    processes: Annotated[
        Optional[int], typer.Option(help="Worker processes (default: all CPUs; 1: no workers).")
    ] = None,
    imbalance: Annotated[
        bool, typer.Option(help="Simulate rank classes and stragglers (about 4x slower).")
    ] = False,
    top: Annotated[int, typer.Option(help="Rows of the best points to print.")] = 5,
    ray: Annotated[
        Optional[str],
        typer.Option("--ray", metavar="ADDRESS", help="Run on Ray instead of local processes: "
                     "'local' (a Ray instance here, --processes CPUs), 'auto' (this machine's "
                     "cluster) or a cluster address (ray://head:10001). Needs gemtwin[ray]."),
    ] = None,
) -> None:
    """Simulate every combination of --grid values; CSV, plots, the best points."""
    from twin.api import sweep
    from twin.sweep import GridError, parse_grid

    if processes is not None and processes < 1:
        raise GridError(f"--processes ({processes}) must be at least 1")
    if out_dir.exists() and not out_dir.is_dir():
        raise GridError(f"--out {out_dir} is a file; give a folder")
    if not grid:
        raise GridError("a sweep needs at least one --grid key=v1,v2,...")
    if ray is not None and not ray.strip():
        raise GridError("--ray needs an address: local, auto or ray://head:10001")
    result = sweep(scenario, parse_grid(grid), set_ or [], processes=processes, imbalance=imbalance,
                   progress=True, ray_address=ray)  # fmt: skip
    files = result.write(out_dir)
    n, bad = len(result.rows), len(result.errors)
    where = (f"Ray ({result.processes} CPUs)" if result.backend == "ray"
             else count(result.processes, "process", "processes"))  # fmt: skip
    out.print(f"{count(n, 'point')} in {result.wall_s:.1f} s on {where} "
              f"({result.evaluations_per_min:,.0f} evaluations/min); {bad} invalid")
    best = result.best(top)
    if best:
        short = [k.rsplit(".", 1)[-1] for k in result.keys]
        heads = short if len(set(short)) == len(short) else result.keys
        t = Table(*heads, "step ms", "samples/s", "MFU", "exposed comm", "memory GB",
                  title=f"{result.scenario}: best {len(best)} that fit in memory")  # fmt: skip
        for r in best:
            t.add_row(*(r[k] for k in result.keys), f"{r['step_time_s'] * 1e3:,.1f}",
                      f"{r['samples_per_s']:,.0f}", f"{r['mfu']:.1%}",
                      f"{r['exposed_comm_share']:.0%}", f"{r['memory_total_bytes'] / 1e9:.1f}")  # fmt: skip
        out.print(t)
    elif bad < n:
        warning("no point both simulated and fits in memory")
    out.print("wrote " + ", ".join(str(f) for f in files), soft_wrap=True)
    if bad:
        first = result.errors[0]
        where = ", ".join(f"{k}={first[k]}" for k in result.keys)
        why = f"first, {where}: {first['error']}"
        if bad == n:  # nothing was simulated: the grid itself is wrong
            raise GridError(f"all {n} points are invalid (see the error column of sweep.csv); {why}")
        warning(f"{bad} of {n} points invalid (see the error column); {why}")


def report_command(
    result: Annotated[Path, typer.Argument(help="A result JSON from gemtwin simulate --out.")],
    out_: Annotated[Path, typer.Option("-o", "--out", help="The HTML page to write.")] = Path(
        "report.html"
    ),
    plots: Annotated[Optional[Path], typer.Option(help="Also keep the PNGs in this folder.")] = None,
) -> None:
    """One static HTML page: summary, breakdown, memory, timeline, and a Perfetto trace.

    The timeline and trace come from simulating again what the result records (its scenario
    after extends and --set, its calibration), so they show exactly the result's step.
    """
    from twin.html_report import write_report

    if plots is not None and plots.exists() and not plots.is_dir():
        raise ValueError(f"--plots {plots} is a file; give a folder")
    page = write_report(result, out_, plots_dir=plots)
    trace = page.with_name(page.stem + ".trace.json")
    extra = f" and {trace} (open in https://ui.perfetto.dev)" if trace.exists() else ""
    out.print(f"wrote {page}{extra}", highlight=False, soft_wrap=True)
