"""Sweeps: every combination of ``--set`` values over one scenario, simulated in parallel.

    result = sweep("gem-h100-4k", {"training.micro_batch": ["32", "64", "128"],
                                   "parallelism.activation_checkpointing": ["full", "selective"]})
    result.write(Path("sweep-out"))   # sweep.csv (+ sweep.parquet with pyarrow) + plot-<key>.png

Each grid value is the right-hand side of a ``--set key=value`` (parsed as YAML). A combination
that does not load or simulate (``ScenarioError`` / ``ValueError``) becomes a row whose
``error`` is the one-line message; the sweep always finishes.

Speed: workers are separate processes: "fork" where the OS has it (they inherit the imported
twin; they start before the progress bar's thread exists), else "spawn" (the worker function is
top-level and imports what it needs). A task is a *chunk* of points, and a point travels as its
override list only: the base scenario's raw mapping goes once per chunk and each point is
validated in the worker, so no ``Scenario`` is pickled. The time is in ``simulate`` itself
(about 0.05 s for gem-h100-4k at its micro-batch 128, 0.2 s at 32: linear in
gradient-accumulation steps, i.e. in ops).

Ray (``ray_address``, ``gemtwin sweep --ray ADDRESS``; optional: the ``ray`` extra, ``uv pip install -p .venv -e '.[ray]'``):
the same chunks run as Ray tasks of the same ``_run_chunk``, the base mapping is put in the
object store once, and rows come back as tasks finish (same rows, same order, as the process
backend). ``"local"`` starts a Ray instance on this machine with ``processes`` CPUs; ``"auto"``
joins the cluster this machine belongs to; ``host:6379`` or ``ray://host:10001`` a running one.
The cluster's workers must import the same gemtwin (installed there, or a shared checkout: a
local instance's workers start in this process's working directory). A task whose worker dies
(killed, out of memory) makes its points error rows, like invalid ones; an exception in the
twin itself propagates, as in the process backend.
"""

from __future__ import annotations

import csv
import io
import itertools
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scenarios.files import write_bytes_atomic, write_text_atomic

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from scenarios.loader import Overrides, ScenarioRef

METRICS = (
    "step_time_s",
    "samples_per_s",
    "mfu",
    "exposed_comm_share",
    "straggler_s",
    "memory_total_bytes",
    "memory_fits",
)
ERROR_COLUMN = "error"
TASKS_PER_PROCESS = 4  # chunks per worker: small per-task overhead, still a moving progress bar
MAX_CHUNK = 64


class GridError(ValueError):
    """A ``--grid`` that does not parse; the message is one line and says how to fix it."""


class BackendError(ValueError):
    """The Ray backend is missing or unreachable; one line that says what to do."""


# ---- grid parsing -----------------------------------------------------------------------
def parse_grid(specs: Iterable[str]) -> dict[str, list[str]]:
    """``["a.b=1,2", "c=x;y"]`` → ``{"a.b": ["1", "2"], "c": ["x", "y"]}``.

    Values split on ``;`` when the spec has one (then commas stay inside values), else on commas
    outside ``{}``/``[]``/quotes, so ``key={a: 1, b: 2},{a: 3, b: 4}`` gives two values.
    """
    grid: dict[str, list[str]] = {}
    for spec in specs:
        if "=" not in spec:
            raise GridError(f"--grid '{spec}' needs key=v1,v2,... (e.g. training.micro_batch=64,128)")
        key, raw = spec.split("=", 1)
        key = key.strip()
        if not key or any(c.isspace() for c in key):
            raise GridError(f"--grid '{spec}': the key before '=' must be a dotted field path "
                            "such as training.micro_batch")  # fmt: skip
        if key in grid:
            raise GridError(f"--grid '{key}' is given twice; put all its values in one "
                            f"--grid {key}=v1,v2,...")  # fmt: skip
        values = _split_values(raw, spec)
        if not values or any(v == "" for v in values):
            raise GridError(f"--grid '{spec}' has an empty value; write {key}=v1,v2,... "
                            "with no empty items")  # fmt: skip
        if len(set(values)) != len(values):
            dup = next(v for v in values if values.count(v) > 1)
            raise GridError(f"--grid '{spec}' lists '{dup}' twice; give each value once")
        grid[key] = values
    return grid


def _split_values(raw: str, spec: str) -> list[str]:
    if ";" in raw:
        return [v.strip() for v in raw.split(";")]
    values, depth, quote, cur = [], 0, "", []
    for ch in raw:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth < 0:
                break
        elif ch == "," and depth == 0:
            values.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if depth != 0 or quote:
        raise GridError(f"--grid '{spec}': unbalanced brackets or quotes; separate values "
                        "with ';' instead (key=v1;v2) or close every {{ [ and quote")  # fmt: skip
    values.append("".join(cur).strip())
    return values


def combinations(grid: Mapping[str, Sequence[Any]]) -> list[list[str]]:
    """Every combination as a ``--set`` list, the last key varying fastest. A string value is
    YAML text, as after ``--set key=``; any other value is written as YAML (``value_text``)."""
    from scenarios.loader import value_text

    keys = list(grid)
    return [[f"{k}={value_text(v)}" for k, v in zip(keys, vs)] for vs in itertools.product(*grid.values())]


def check_grid(grid: Mapping[str, Sequence[Any]]) -> None:
    """``GridError`` unless ``grid`` maps dotted field paths to non-empty lists of values."""
    if not isinstance(grid, Mapping) or not grid:
        raise GridError("a sweep needs at least one --grid key=v1,v2,... (in Python: a mapping such as "
                        "{'training.micro_batch': [64, 128]})")  # fmt: skip
    for k, vs in grid.items():
        if not isinstance(k, str) or not k.strip():
            raise GridError(f"grid key {k!r} must be a dotted field path such as training.micro_batch")
        if isinstance(vs, (str, bytes)) or not isinstance(vs, Sequence):
            raise GridError(f"grid {k}: {vs!r} must be a list of values, e.g. {{{k!r}: [64, 128]}}")
        if not vs:
            raise GridError(f"--grid '{k}' has no values; write {k}=v1,v2,...")


# ---- workers ------------------------------------------------------------------------------
def _evaluate(base: dict, overrides: Sequence[str], imbalance: bool) -> dict[str, Any]:
    """One point: the metric columns plus ``error`` ('' when it simulated)."""
    from scenarios.loader import apply_set, validate
    from twin.simulate import simulate

    try:
        data = base
        for assignment in overrides:
            data = apply_set(data, assignment)
        r = simulate(validate(data), imbalance=imbalance)
    except ValueError as e:  # ScenarioError is one
        return {**dict.fromkeys(METRICS, None), ERROR_COLUMN: " ".join(str(e).split()) or
                type(e).__name__}  # fmt: skip
    return {
        "step_time_s": r.step_time_s,
        "samples_per_s": r.samples_per_s,
        "mfu": r.mfu,
        "exposed_comm_share": r.breakdown_s.get("exposed_comm", 0.0) / r.step_time_s,
        "straggler_s": r.straggler_s,
        "memory_total_bytes": r.memory_total_bytes,
        "memory_fits": r.memory_fits,
        ERROR_COLUMN: "",
    }


def _run_chunk(base: dict, points: list[tuple[int, list[str]]], imbalance: bool):
    """Top-level (picklable under spawn): evaluate a chunk of ``(index, overrides)``."""
    return [(i, _evaluate(base, overrides, imbalance)) for i, overrides in points]


def _start_method() -> str:
    import multiprocessing

    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def _warm_up() -> None:
    import twin.simulate  # noqa: F401  (spawn: import once per worker, before the first chunk)


# ---- the sweep --------------------------------------------------------------------------
@dataclass
class SweepResult:
    """A sweep's points: ``rows`` in grid order, each the swept values, the ``METRICS`` and ``error``
    ('' when it simulated; else why not, and the metrics None). ``twin.api.to_frame`` is the table."""

    scenario: str
    keys: list[str]
    rows: list[dict[str, Any]]  # swept values (strings) + METRICS + error, in grid order
    wall_s: float = 0.0
    processes: int = 1  # worker processes, or the Ray cluster's CPUs
    files: list[Path] = field(default_factory=list)
    backend: str = "processes"  # "processes", "in-process" or "ray"

    @property
    def columns(self) -> list[str]:
        return [*self.keys, *METRICS, ERROR_COLUMN]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r[ERROR_COLUMN]]

    @property
    def evaluations_per_min(self) -> float:
        return len(self.rows) / self.wall_s * 60 if self.wall_s > 0 else float("inf")

    def best(self, n: int = 5) -> list[dict[str, Any]]:
        """The ``n`` fastest valid points that fit in memory (samples/s, descending)."""
        ok = [r for r in self.rows if not r[ERROR_COLUMN] and r["memory_fits"]]
        return sorted(ok, key=lambda r: -r["samples_per_s"])[:n]

    def csv_text(self) -> str:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=self.columns, lineterminator="\n")
        w.writeheader()
        for r in self.rows:
            w.writerow({k: ("" if r[k] is None else r[k]) for k in self.columns})
        return buf.getvalue()

    def write_csv(self, path: str | os.PathLike[str]) -> Path:
        return write_text_atomic(path, self.csv_text())

    def write_parquet(self, path: str | os.PathLike[str]) -> Path | None:
        """Parquet via pyarrow when it imports (not a dependency); else None."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            return None
        table = pa.Table.from_pylist([{k: r[k] for k in self.columns} for r in self.rows])
        buf = pa.BufferOutputStream()
        pq.write_table(table, buf)
        return write_bytes_atomic(path, buf.getvalue().to_pybytes())

    def plot(self, folder: str | os.PathLike[str]) -> list[Path]:
        """One PNG per swept key: samples/s and MFU against its values."""
        return [plot_key(self, k, Path(folder) / f"plot-{_file_safe(k)}.png") for k in self.keys]

    def write(self, folder: str | os.PathLike[str]) -> list[Path]:
        """``sweep.csv``, ``sweep.parquet`` (with pyarrow) and the plots, into ``folder``."""
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"sweep output {folder} is a file; give a folder")
        files = [self.write_csv(folder / "sweep.csv")]
        parquet = self.write_parquet(folder / "sweep.parquet")
        files += [parquet] if parquet else []
        files += self.plot(folder)
        self.files = files
        return files


def sweep(
    scenario_ref: ScenarioRef,
    grid: Mapping[str, Sequence[Any]],
    *,
    sets: Overrides = (),
    processes: int | None = None,
    imbalance: bool = False,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = False,
    start_method: str | None = None,
    ray_address: str | None = None,
) -> SweepResult:
    """Simulate every combination of ``grid`` on ``scenario_ref`` (+ ``sets``) in parallel.

    ``scenario_ref``: anything ``scenarios.load`` takes. ``grid``: each field's values, strings as
    YAML text (the CLI's) or Python values (``{"training.micro_batch": [64, 128]}``); a row holds
    each value as given (a mapping or list value as its YAML text). ``sets``: overrides of every
    point, a mapping or ``--set`` strings (``scenarios.loader.apply_overrides``).

    ``processes``: worker processes (default ``os.cpu_count()``; 1 runs in this process).
    ``imbalance``: simulate rank classes and stragglers (about 4x slower). ``on_result``: called
    in this process with each finished row (in completion order). ``progress``: draw a bar.
    ``start_method``: multiprocessing start method (default: "fork" where the OS has it — the
    workers inherit the imported twin — else "spawn"; the worker is spawn-safe either way).
    ``ray_address``: run on Ray instead (module docstring); ``processes`` then only sizes a
    ``"local"`` instance. A bad scenario reference or base ``sets`` raise ``ScenarioError``,
    a missing or unreachable Ray ``BackendError``, before anything runs.
    """
    import twin.simulate  # noqa: F401  (before forking: workers inherit it)
    from scenarios.loader import apply_overrides, raw, value_text
    from twin.progress import progress as bar_of

    check_grid(grid)
    base = apply_overrides(raw(scenario_ref), sets)
    name = str(base.get("name", scenario_ref if isinstance(scenario_ref, str) else "scenario"))
    label = scenario_ref if isinstance(scenario_ref, str) else name
    keys = list(grid)
    points = combinations(grid)
    shown = [[v if v is None or isinstance(v, (str, int, float)) else value_text(v) for v in vs]
             for vs in itertools.product(*grid.values())]  # fmt: skip
    n = len(points)
    processes = max(1, min(processes or os.cpu_count() or 1, n))
    rows: list[dict[str, Any] | None] = [None] * n

    def done(i: int, metrics: dict[str, Any]) -> None:
        row = dict(zip(keys, shown[i])) | metrics
        rows[i] = row
        if on_result is not None:
            on_result(row)

    t0 = time.perf_counter()
    backend = "processes"
    if ray_address is not None:
        backend = "ray"
        with _ray_session(ray_address, processes) as ray:
            processes = max(1, int(ray.cluster_resources().get("CPU", 1)))
            chunks = _chunks(points, processes)
            with bar_of(n, enabled=progress, description=f"sweeping {label} on Ray") as bar:
                _ray_run(ray, base, chunks, imbalance, done, bar)
    elif processes == 1:
        backend = "in-process"
        with bar_of(n, enabled=progress, description=f"sweeping {label}") as bar:
            for i, overrides in enumerate(points):
                done(i, _evaluate(base, overrides, imbalance))
                bar.advance()
    else:
        chunks = _chunks(points, processes)
        ctx = get_context(start_method or _start_method())
        with ProcessPoolExecutor(processes, mp_context=ctx, initializer=_warm_up) as pool:
            # Workers start on the first submit: before the progress bar's thread exists, so
            # "fork" never copies a process with a second thread running.
            futures = [pool.submit(_run_chunk, base, chunks[0], imbalance)]
            with bar_of(n, enabled=progress, description=f"sweeping {label}") as bar:
                futures += [pool.submit(_run_chunk, base, c, imbalance) for c in chunks[1:]]
                for fut in as_completed(futures):
                    part = fut.result()
                    for i, metrics in part:
                        done(i, metrics)
                    bar.advance(len(part))
    wall = time.perf_counter() - t0
    return SweepResult(name, keys, rows, wall_s=wall, processes=processes,  # type: ignore[arg-type]
                       backend=backend)  # fmt: skip


def _chunks(points: list[list[str]], workers: int) -> list[list[tuple[int, list[str]]]]:
    """``(index, overrides)`` chunks: about ``TASKS_PER_PROCESS`` per worker, at most ``MAX_CHUNK``."""
    n = len(points)
    size = max(1, min(MAX_CHUNK, math.ceil(n / (workers * TASKS_PER_PROCESS))))
    indexed = list(enumerate(points))
    return [indexed[a : a + size] for a in range(0, n, size)]


# ---- the Ray backend ------------------------------------------------------------------------
@contextmanager
def _ray_session(address: str, processes: int):
    """Ray, connected to ``address`` (reused as is when this process is already connected);
    shut down on exit when this call connected it."""
    try:
        import ray
    except ImportError:
        from twin.console import install_hint

        raise BackendError(f"--ray needs Ray, which is not installed; install it with: "
                           f"{install_hint('ray')} (or drop --ray to use local processes)") from None  # fmt: skip
    if ray.is_initialized():
        yield ray
        return
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    if address == "local":
        kwargs.update(num_cpus=processes, include_dashboard=False)
    try:
        ray.init(address=address, **kwargs)
    except Exception as e:  # ConnectionError, ValueError, RuntimeError, grpc errors, ...
        first = " ".join(str(e).split())[:200] or type(e).__name__
        raise BackendError(f"--ray {address}: cannot start or reach Ray ({first}); give 'local', "
                           "'auto' or a running cluster's address such as ray://head:10001") from None  # fmt: skip
    try:
        yield ray
    finally:
        ray.shutdown()


RAY_TASK_RETRIES = 1  # a task whose worker died runs once more before its points become errors


def _ray_run(ray, base: dict, chunks, imbalance: bool, done, bar, fn=None) -> None:
    """Every chunk as a Ray task of ``fn`` (default ``_run_chunk``); rows handed to ``done`` as
    tasks finish."""
    from ray.exceptions import RayTaskError

    task = ray.remote(num_cpus=1, max_retries=RAY_TASK_RETRIES)(fn or _run_chunk)
    base_ref = ray.put(base)
    pending = {task.remote(base_ref, c, imbalance): c for c in chunks}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            chunk = pending.pop(ref)
            try:
                part = ray.get(ref)
            except RayTaskError as e:  # the twin itself raised: a bug, not an invalid point
                raise e.as_instanceof_cause() from None
            except ray.exceptions.RayError as e:  # the worker died: its points become error rows
                why = f"ray task failed: {type(e).__name__}: " + " ".join(str(e).split())[:160]
                part = [(i, {**dict.fromkeys(METRICS, None), ERROR_COLUMN: why}) for i, _ in chunk]
            for i, metrics in part:
                done(i, metrics)
            bar.advance(len(part))


# ---- plots ----------------------------------------------------------------------------------
MAX_LINES = 8  # more combinations of the other keys than this: plot best and median instead


def plot_key(result: SweepResult, key: str, path: Path) -> Path:
    """Write ``key_figure(result, key)`` as a PNG."""
    buf = io.BytesIO()
    key_figure(result, key).savefig(buf, format="png", metadata={"Software": None})
    return write_bytes_atomic(path, buf.getvalue())


def key_figure(result: SweepResult, key: str) -> Figure:
    """samples/s and MFU against ``key``'s values; one line per combination of the other keys
    (or, past ``MAX_LINES``, the best and the median over them). Hollow markers: does not fit in
    memory; invalid points are left out (the CSV has their errors)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if key not in result.keys:
        raise ValueError(f"key {key!r} was not swept; plot one of: {', '.join(result.keys)}")
    values = list(dict.fromkeys(r[key] for r in result.rows))
    numeric = _numeric(values)
    xs = {v: (float(v) if numeric else i) for i, v in enumerate(values)}
    others = [k for k in result.keys if k != key]
    lines: dict[str, list[dict]] = {}
    for r in result.rows:
        label = ", ".join(f"{k}={r[k]}" for k in others) or key
        lines.setdefault(label, []).append(r)

    fig = Figure(figsize=(11.0, 4.0), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    panels = [("samples_per_s", "samples/s", 1.0), ("mfu", "MFU (%)", 100.0)]
    axes = fig.subplots(1, 2)
    for ax, (metric, ylabel, scale) in zip(axes, panels):
        if len(lines) <= MAX_LINES:
            for i, (label, rows) in enumerate(lines.items()):
                _draw(ax, [(xs[r[key]], r[metric] * scale, r["memory_fits"])
                           for r in rows if not r[ERROR_COLUMN]], label, f"C{i}")  # fmt: skip
        else:
            for stat, color in (("best", "C0"), ("median", "C1")):
                pts = []
                for v in values:
                    ok = [r for r in result.rows if r[key] == v and not r[ERROR_COLUMN]]
                    if ok:
                        ys = sorted(r[metric] * scale for r in ok)
                        y = ys[-1] if stat == "best" else ys[len(ys) // 2]
                        pts.append((xs[v], y, True))
                _draw(ax, pts, f"{stat} over {len(lines)} combinations of the other keys", color)
        ax.set_xlabel(key)
        ax.set_ylabel(ylabel)
        ax.grid(linewidth=0.3, alpha=0.5)
        if not numeric:
            ax.set_xticks(range(len(values)), values, rotation=20, fontsize=8)
        elif _log_spaced([xs[v] for v in values]):
            ax.set_xscale("log", base=2)
            ax.set_xticks([xs[v] for v in values], values)
    invalid = sum(1 for r in result.rows if r[ERROR_COLUMN])
    note = f"; {invalid} invalid point(s) left out" if invalid else ""
    fig.suptitle(f"{result.scenario}: sweep over {key} (hollow: does not fit in memory{note})",
                 fontsize=10)  # fmt: skip
    handles, labels = axes[0].get_legend_handles_labels()
    if handles and (others or len(lines) > MAX_LINES):
        fig.legend(handles, labels, loc="outside lower center", fontsize=7, frameon=False,
                   ncols=min(len(labels), 3))  # fmt: skip
    return fig


def _draw(ax, pts: list[tuple[float, float, bool]], label: str, color: str) -> None:
    if not pts:
        return
    pts.sort()
    ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, linewidth=1.2, label=label)
    fit = [p for p in pts if p[2]]
    nofit = [p for p in pts if not p[2]]
    ax.scatter([p[0] for p in fit], [p[1] for p in fit], color=color, s=18, zorder=3)
    ax.scatter([p[0] for p in nofit], [p[1] for p in nofit], facecolors="white",
               edgecolors=color, s=22, zorder=3)  # fmt: skip


def _numeric(values: list[str]) -> bool:
    try:
        [float(v) for v in values]
    except ValueError:
        return False
    return True


def _log_spaced(xs: list[float]) -> bool:
    xs = sorted(xs)
    return len(xs) >= 3 and xs[0] > 0 and xs[-1] / xs[0] >= 8


def _file_safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in key)
