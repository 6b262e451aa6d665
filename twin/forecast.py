"""Forecast: GPUs, MFU, energy and cost to keep up with a model whose FLOPs grow every year.

``forecast(s, growth=4, years=3, rule="layers")``: in year ``y`` (0..years) the model's FLOPs are
``growth**y`` times year 0's, grown by one rule (default: ``layers`` for a GEM model, ``batch``
for a DLRM, which has no sequence or interaction layers to deepen):

- ``layers``: ``model.sequence.num_layers`` and ``model.nonseq.num_layers`` are both multiplied
  by one ratio ``r`` (rounded, at least 1; cross layers kept). ``r`` is solved from the FLOPs
  of the model at ``r = 1`` and ``r = 2`` (FLOPs are affine in the layer count) so that the
  realised growth is the closest the integer layer counts allow. Embeddings, bottom MLP and
  heads do not grow.
- ``width``: ``model.d_model`` (and ``bottom_mlp[-1]``, which must equal it) times
  ``sqrt(growth**y)``, rounded to a multiple of 64. Matmuls over d_model grow ~quadratically;
  attention width (heads × head_dim), Wukong hidden widths and embeddings do not, so the
  realised growth is below the request.
- ``seq_len``: every sequence group's length law: ``max`` and ``mean`` times ``growth**y``
  (``min`` kept). Attention grows faster than linearly, the non-sequence parts not at all.
- ``batch``: ``training.global_batch`` times ``growth**y`` (the model per sample is unchanged;
  FLOPs per *step* grow). The target samples/s grows with it (the step time is what is held).

The realised FLOP growth, ``twin.flops`` FLOPs per step (per-sample FLOPs × global batch) over
year 0's, is reported next to the requested factor.

Each year the planner re-plans on each GPU generation of the roadmap for that year (a YAML of
``years: {offset: [{gpu, network, usd_per_gpu_hour, tdp_w?}]}``, ``pue``, ``hours_per_year``;
default ``twin/data/roadmap.yaml``, with cited sources and assumptions) and finds the fewest
GPUs, on a coarse grid (powers of two below the NVLink domain, then the domain × 2^k), whose
best plan reaches the target samples/s (default: the year-0 scenario's own ``simulate``
samples/s). A row is two jobs: its search (plans that ask only whether a count reaches the target)
and its full plan (the best layout at the count found). They run side by side in one process per
CPU (``workers``): the next year's searches are queued as soon as the search of the row they start
from has told its count, ahead of the full plans still to run (a year's last row goes first); the
rows are the same whatever the order. The
search gallops on the grid from an estimate (the GPU count of the previous year's last row that
reached its target × FLOP growth since × target ratio × that GPU's bf16 peak / this GPU's; at
first the scenario's own count and GPU), assuming more GPUs never plan slower, then bisects
between the last grid count that misses and the first that reaches the target, over the valid
meshes between them (multiples of the NVLink domain; any count below it), until the fewest GPUs
that reach it are known to within ``REFINE_TOL`` (5%): the grid alone can be 2× coarse. Energy per year =
GPUs × TDP × PUE × hours; cost per year = GPUs × price × hours.

**The global batch grows with the cluster** (``max_global_batch``): at ``n`` GPUs a plan keeps
year 0's samples per GPU (``training.global_batch / hardware.num_gpus``), so the global batch is
``max(the year's, per-GPU × n)``, capped at ``max_global_batch``. Without it a fixed global batch
leaves each GPU a few samples as the cluster grows (``gem-h200-1gpu``'s 256 over 64 GPUs: 4),
and MFU falls to a few percent. Default cap: ``DEFAULT_MAX_GLOBAL_BATCH`` (524,288 =
``gem-h100-4k``'s global batch, the Meta-scale GEM scenario's: the largest this project takes as
trainable for a GEM-class model; an assumption, not a convergence result), or the scenario's own
when larger. Each row records its global batch (``ForecastRow.global_batch``) and the notes say
which rule grew it; ``max_global_batch`` equal to the scenario's global batch keeps it fixed.

A row that cannot reach the target says why (``ForecastRow.reason``): the network preset's
largest size, or the global batch cap (data parallelism ends at one sample per GPU), caps the GPU
count; its samples/s and MFU are then those of the largest count tried, and it has no energy or
cost.
"""

from __future__ import annotations

import io
import math
import multiprocessing as mp
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
import yaml

from hwmodels.gpus import get_gpu
from hwmodels.network import get_network
from scenarios.files import write_bytes_atomic
from scenarios.loader import validate
from scenarios.messages import count
from scenarios.schema import GEMModel, Scenario
from twin.flops import model_costs
from twin.planner import plan
from twin.simulate import simulate

RULES = ("layers", "width", "seq_len", "batch")
Rule = Literal["layers", "width", "seq_len", "batch"]
DEFAULT_ROADMAP = files("twin") / "data" / "roadmap.yaml"
# a cheap planner space for the many plans of a forecast
QUICK_SPACE = {"activation_checkpointing": ["selective", "full"], "precision": ["bf16", "mxfp8"]}
MAX_GRID_GPUS = 65536
DEFAULT_PLAN_BUDGET = 200  # simulations each plan of a forecast may run (--plan-budget)
DEFAULT_MAX_GLOBAL_BATCH = 524_288  # gem-h100-4k's global batch (module docstring: an assumption)
REFINE_TOL = 0.05  # a row's GPU count is the fewest that holds the target to within this (bisection)


@dataclass(frozen=True)
class Generation:
    gpu: str
    network: str
    usd_per_gpu_hour: float
    tdp_w: float
    source: str = ""


@dataclass(frozen=True)
class Roadmap:
    years: dict[int, list[Generation]]
    pue: float
    hours_per_year: float

    def at(self, year: int) -> list[Generation]:
        known = sorted(self.years)
        return self.years[max([y for y in known if y <= year], default=known[0])]


@dataclass
class ForecastRow:
    year: int
    gpu: str
    network: str
    growth_requested: float
    growth_realised: float
    target_samples_per_s: float
    gpus: int | None  # None: the grid's largest count does not reach the target
    samples_per_s: float  # at ``gpus``, or at the largest count tried when the target is missed
    mfu: float
    step_time_s: float
    energy_mwh_per_year: float | None  # None when the target is out of reach
    cost_usd_per_year: float | None
    config: str
    plans: int
    cheapest: bool = False
    largest_gpus: int = 0  # the largest GPU count tried
    reason: str = ""  # why the target is out of reach ("" when it is reached)
    global_batch: int = 0  # of the row's plan (grown with the cluster: module docstring)


@dataclass
class ForecastResult:
    scenario: str
    rule: str
    growth: float
    years: int
    rows: list[ForecastRow]
    roadmap: str
    pue: float
    hours_per_year: float
    wall_s: float
    notes: list[str] = field(default_factory=list)

    def table(self):
        """The forecast as a rich Table (compact numbers; ``lines()`` has each row's layout)."""
        from rich.table import Table

        target = {r.year: r.target_samples_per_s for r in self.rows}
        same = len(set(target.values())) == 1
        title = (f"forecast: {self.scenario}, FLOPs x{self.growth:g}/year by {self.rule}"
                 + (f", holding {_si(next(iter(target.values())))} samples/s" if same else ""))  # fmt: skip
        t = Table(title=title, caption=f"PUE {self.pue:g}, {self.hours_per_year:,.0f} h/year; "
                  "* = cheapest of the year")  # fmt: skip
        cols = ["year", "GPU", "FLOPs x", *([] if same else ["target/s"]), "GPUs", "samples/s",
                "MFU", "step ms", "MWh/year", "USD/year"]  # fmt: skip
        for col in cols:
            t.add_column(col, justify="left" if col == "GPU" else "right")
        for r in self.rows:
            ok = r.gpus is not None
            t.add_row(str(r.year), r.gpu + (" *" if r.cheapest else ""), f"{r.growth_realised:.2f}",
                      *([] if same else [_si(r.target_samples_per_s)]),
                      f"{r.gpus:,}" if ok else f"> {r.largest_gpus:,}",
                      _si(r.samples_per_s) if r.samples_per_s else "-", _pct(r.mfu) if r.mfu else "-",
                      f"{r.step_time_s * 1e3:,.1f}" if math.isfinite(r.step_time_s) else "-",
                      f"{r.energy_mwh_per_year:,.0f}" if ok else "-",
                      _si(r.cost_usd_per_year) if ok else "-")  # fmt: skip
        return t

    def lines(self) -> list[str]:
        """One line per row: the planned layout, or why the target is out of reach."""
        out = []
        for r in self.rows:
            where = f"year {r.year} {r.gpu}: "
            if r.gpus is not None:
                out.append(where + f"{count(r.gpus, 'GPU')}, {r.config}, global batch {r.global_batch:,}")
            else:
                out.append(where + r.reason)
        return out

    def plot(self, folder: str | Path) -> list[Path]:
        """Four PNGs (``PANELS``): GPUs needed, MFU, energy and cost per year per generation."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        out = []
        for what, (_, fname, _) in PANELS.items():
            path = folder / f"{self.scenario}-forecast-{fname}.png"
            buf = io.BytesIO()
            self.figure(what).savefig(buf, format="png", dpi=110, bbox_inches="tight")
            out.append(write_bytes_atomic(path, buf.getvalue()))
        return out

    def figure(self, what: str = "gpus"):
        """One panel as a ``matplotlib.figure.Figure``: ``what`` (a ``PANELS`` key) per year, a line
        per GPU generation; rows whose target is out of reach are left out."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        if what not in PANELS:
            raise ValueError(f"forecast figure {what!r} is unknown; use one of: {', '.join(PANELS)}")
        ylabel, _, log = PANELS[what]
        fig = Figure(figsize=(7, 4))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for gpu in dict.fromkeys(r.gpu for r in self.rows):
            pts = [(r.year, getattr(r, what) * (100 if what == "mfu" else 1))
                   for r in self.rows if r.gpu == gpu and r.gpus]  # fmt: skip
            if pts:
                ax.plot(*zip(*pts), marker="o", label=gpu)
        ax.set_xlabel("year")
        ax.set_ylabel(ylabel)
        ax.set_xticks(range(self.years + 1))
        if log:
            ax.set_yscale("log")
        ax.set_title(f"{self.scenario}: FLOPs x{self.growth:g}/year by {self.rule}"
                     " (missing: target out of reach)", fontsize=9)  # fmt: skip
        ax.grid(linewidth=0.3, alpha=0.5)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        return fig


# a forecast's figures: row field -> (y label, file name part, log scale)
PANELS = {"gpus": ("GPUs needed", "gpus", True), "mfu": ("MFU (%)", "mfu", False),
          "energy_mwh_per_year": ("MWh per year", "energy", True),
          "cost_usd_per_year": ("USD per year", "cost", True)}  # fmt: skip


def _si(x: float) -> str:
    """3 significant figures with k/M/B: 2,629,436 -> 2.63M."""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _pct(x: float) -> str:
    """A share as a percentage: 1 decimal from 1%, else 2 significant figures (0.041%)."""
    return f"{x:.1%}" if x >= 0.01 else f"{x * 100:.2g}%"


# ---- inputs ----------------------------------------------------------------------------------
def load_roadmap(path: str | Path | None = None) -> Roadmap:
    """Read a roadmap YAML (the bundled default when ``path`` is None)."""
    where = "twin/data/roadmap.yaml" if path is None else str(path)
    try:
        text = DEFAULT_ROADMAP.read_text() if path is None else Path(path).read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"roadmap {where} not found; pass an existing YAML file") from None
    try:
        data = yaml.safe_load(text) or {}
        years = {}
        for y, gens in data["years"].items():
            years[int(y)] = [_generation(g, where, y) for g in gens]
        if not years:
            raise KeyError("years")
        return Roadmap(years, float(data.get("pue", 1.2)), float(data.get("hours_per_year", 8760)))
    except (KeyError, TypeError, AttributeError, yaml.YAMLError) as e:
        raise ValueError(f"roadmap {where}: needs years: {{offset: [{{gpu, network, "
                         f"usd_per_gpu_hour}}]}} ({type(e).__name__}: {e})") from None  # fmt: skip


def _generation(g: dict, where: str, year) -> Generation:
    try:
        spec = get_gpu(str(g["gpu"]))
        get_network(str(g["network"]))
    except ValueError as e:
        raise ValueError(f"roadmap {where} year {year}: {e}") from None
    price = float(g["usd_per_gpu_hour"])
    if price < 0:
        raise ValueError(f"roadmap {where} year {year}: usd_per_gpu_hour ({price}) must be >= 0")
    return Generation(spec.name, str(g["network"]).lower(), price, float(g.get("tdp_w", spec.tdp_w)),
                      str(g.get("source", "")))  # fmt: skip


# ---- growing the model -----------------------------------------------------------------------
def step_flops_of(s: Scenario) -> float:
    """Model FLOPs of one optimizer step (forward + backward): per-sample FLOPs × global batch."""
    mb = s.training.micro_batch
    return sum(c.flops for c in model_costs(s.model, batch=mb)) / mb * s.training.global_batch


def grow(s: Scenario, factor: float, rule: Rule) -> Scenario:
    """``s`` with its FLOPs grown by ``factor`` through ``rule`` (module docstring)."""
    if rule not in RULES:
        raise ValueError(f"rule '{rule}' is unknown; use one of: {', '.join(RULES)}")
    if factor == 1.0:
        return s
    data = s.model_dump(mode="json")
    m = data["model"]
    if rule in ("layers", "width", "seq_len") and not isinstance(s.model, GEMModel):
        raise ValueError(f"rule '{rule}' needs a GEM model (kind: gem); use rule 'batch' for a DLRM")
    if rule == "layers":
        base = step_flops_of(s)
        f2 = step_flops_of(_layers(s, data, 2.0))
        r = 1.0 + (factor - 1.0) * base / max(f2 - base, 1e-30)
        return _layers(s, data, r)
    if rule == "width":
        d = max(64, int(round(s.model.d_model * math.sqrt(factor) / 64)) * 64)
        m["d_model"] = d
        m["bottom_mlp"] = [*m["bottom_mlp"][:-1], d]
    elif rule == "seq_len":
        for g in m["embeddings"]["sequences"]:
            ln = g["length"]
            ln["max"] = max(1, int(round(ln["max"] * factor)))
            if ln.get("mean") is not None:
                ln["mean"] = ln["mean"] * factor
    else:
        t = data["training"]
        t["global_batch"] = int(round(t["global_batch"] * factor))
        unit = t["micro_batch"] * s.hardware.num_gpus
        t["global_batch"] = max(unit, round(t["global_batch"] / unit) * unit)
    data["name"] = f"{s.name}-x{factor:g}-{rule}"
    return validate(data)


def _layers(s: Scenario, data: dict, r: float) -> Scenario:
    d = {**data, "model": {**data["model"]}}
    m = d["model"]
    m["sequence"] = {**m["sequence"], "num_layers": max(1, round(s.model.sequence.num_layers * r))
                     if s.model.sequence.num_layers else 0}  # fmt: skip
    m["nonseq"] = {**m["nonseq"], "num_layers": max(1, round(s.model.nonseq.num_layers * r))
                   if s.model.nonseq.num_layers else 0}  # fmt: skip
    d["name"] = f"{s.name}-layers-x{r:.2f}"
    return validate(d)


# ---- search ----------------------------------------------------------------------------------
def gpu_grid(network: str, *, limit: int = MAX_GRID_GPUS) -> list[int]:
    """Powers of two below the NVLink domain, then the domain × 2^k, up to the preset's size, and
    last the largest multiple of the domain that the preset (or ``limit``) holds, so that a row
    out of reach has tried the largest cluster it names (24,576 H100s, not 16,384)."""
    net = get_network(network)
    dom, cap = net.tiers[0].domain_gpus, min(net.max_gpus, limit)
    grid = [1 << k for k in range(40) if (1 << k) < dom and (1 << k) <= cap]
    grid += [dom << k for k in range(40) if (dom << k) <= cap]
    top = cap // dom * dom if cap >= dom else cap
    return grid + [top] if grid and top > grid[-1] else grid


def batch_at(s: Scenario, gpus: int, per_gpu: float, cap: int) -> Scenario:
    """``s`` with its global batch grown to ``per_gpu × gpus`` (never shrunk), capped at ``cap``.
    Not checked against ``s``'s own GPU count and micro-batch (3 GPUs × 256 is no multiple of
    ``gem-h200-2gpu``'s 2 × 256): the planner lays it out for ``gpus``, which is what it is for."""
    gb = min(cap, max(s.training.global_batch, int(round(per_gpu * gpus))))
    if gb == s.training.global_batch:
        return s
    return s.model_copy(update={"training": s.training.model_copy(update={"global_batch": gb})})


@dataclass
class _Searched:
    """What a row's search found (``_search``), and all its full plan needs (``_finish``): a
    worker process may run the full plan, beside the next year's searches that start from ``gpus``."""
    gen: Generation
    budget: int | None
    space: dict
    gpus: int | None  # the fewest GPUs that reach the target; None: out of reach
    at: list[int]  # the counts to plan in full, in turn (out of reach: the largest, then the one below)
    probes: int  # goal plans run
    largest: int  # the largest count tried
    scen: dict[int, Scenario]  # the scenario planned at each of ``at``
    evals: dict[int, dict]  # what the probes at each of ``at`` learned (``plan``'s ``evals``)


def _plan_kw(g: Generation, budget, space, bound_cache: dict) -> dict:
    return dict(gpu=g.gpu, network=g.network, budget=budget, imbalance_final=False, exhaustive_comm=0,
                space=space, compare_given=False, bound_cache=bound_cache)  # fmt: skip


def _search(s: Scenario, g: Generation, target: float, *, budget, space, max_gpus, start: int = 1,
            per_gpu: float = 0.0, max_global_batch: int = 0, bound_cache: dict | None = None) -> _Searched:  # fmt: skip
    """Gallop on the grid from the point nearest ``start``: up until the target is reached,
    else down while it still is; then bisect (``refined``). Only goal plans (does some layout
    reach the target?) run here; the row's best layout is ``_finish``'s.
    ``per_gpu``: samples per GPU the global batch grows by (``batch_at``; 0: kept)."""
    grid = gpu_grid(g.network, limit=max_gpus)
    probes: dict[int, object] = {}  # GPU count -> the plan that asked only whether it reaches the target
    scen: dict[int, Scenario] = {}
    kw = _plan_kw(g, budget, space, {} if bound_cache is None else bound_cache)

    def at(n: int) -> Scenario:
        if n not in scen:
            scen[n] = batch_at(s, n, per_gpu, max_global_batch) if per_gpu else s
        return scen[n]

    evals: dict[int, dict] = {}  # GPU count -> what its plans learned about each candidate (plan's evals)

    def ok(n: int) -> bool:
        if n not in probes:
            probes[n] = plan(at(n), gpus=n, top=1, goal_samples_per_s=target, evals=evals.setdefault(n, {}), **kw)
        return bool(probes[n].reached)

    def found(n: int | None, counts: list[int]) -> _Searched:
        for c in counts:
            at(c)
        return _Searched(g, budget, space, n, counts, len(probes), max(probes),
                         {c: scen[c] for c in counts}, {c: evals.get(c, {}) for c in counts})  # fmt: skip

    dom = get_network(g.network).tiers[0].domain_gpus

    def refined(i: int) -> _Searched:
        """``grid[i]`` reaches the target and ``grid[i - 1]`` does not: bisect the valid counts
        between them (multiples of the NVLink domain above it, any count below) until the fewest
        that reaches it is known to within ``REFINE_TOL``."""
        lo, hi = (grid[i - 1], grid[i]) if i > 0 else (grid[i], grid[i])
        step = dom if lo >= dom else 1
        while (hi - lo) / hi > REFINE_TOL and hi - lo > step:
            mid = lo + max(1, (hi - lo) // (2 * step)) * step
            if ok(mid):
                hi = mid
            else:
                lo = mid
        return found(hi, [hi])

    i = min(range(len(grid)), key=lambda j: abs(math.log(grid[j] / max(start, 1))))
    if ok(grid[i]):
        while i > 0 and ok(grid[i - 1]):
            i -= 1
        return refined(i)
    while i + 1 < len(grid):
        i += 1
        if ok(grid[i]):
            return refined(i)
    # the largest count can be the least divisible (65,520 GB200s): then the one below it
    return found(None, [grid[i], grid[i - 1]] if i > 0 else [grid[i]])


def _finish(sr: _Searched, bound_cache: dict | None = None):
    """The row's best layout, a full plan that reuses what the probes at its count evaluated.
    Returns (gpus, plan entry, plans run, largest count tried, the scenario planned there); gpus
    None when the grid's largest count does not reach the target (the entry is then the best at
    the largest count that has a layout)."""
    kw = _plan_kw(sr.gen, sr.budget, sr.space, {} if bound_cache is None else bound_cache)
    bests = []
    for n in sr.at:
        bests.append(plan(sr.scen[n], gpus=n, top=1, evals=sr.evals[n], **kw).best)
        if bests[-1] is not None:
            break
    j = len(bests) - 1 if bests[-1] is not None else 0
    n = sr.at[j]
    return sr.gpus, bests[j], sr.probes + len(bests), sr.largest if sr.gpus is not None else n, sr.scen[n]


def _row_search(job, bound_cache: dict | None = None) -> _Searched:
    """One row's search (``_search``) from its job, as a worker process (or this one) runs it."""
    sy, g, target, kw = job
    return _search(sy, g, target, bound_cache=bound_cache, **kw)


def forecast(
    s: Scenario, *, growth: float = 4.0, years: int = 3, rule: Rule | None = None,
    target_samples_per_s: float | None = None, roadmap: str | Path | None = None,
    plan_budget: int | None = DEFAULT_PLAN_BUDGET, space: dict | None = None, max_gpus: int = MAX_GRID_GPUS,
    progress: bool = False, max_global_batch: int | None = None, workers: int | None = None,
) -> ForecastResult:  # fmt: skip
    """GPUs needed per year and generation to hold the target samples/s (module docstring).
    ``progress``: a bar over the rows (year × generation) on stderr. ``max_global_batch``: the
    cap of the global batch as it grows with the cluster (default: ``DEFAULT_MAX_GLOBAL_BATCH``,
    or the scenario's own when larger). ``workers``: processes that run the rows' searches and
    full plans side by side (default: one per CPU, at most twice the roadmap's generations in a
    year: a year's searches and the year before's full plans; 1: in this process). The rows do
    not depend on it."""
    from twin.progress import progress as bar_of

    t0 = time.perf_counter()
    auto_rule = rule is None
    if rule is None:
        rule = "layers" if isinstance(s.model, GEMModel) else "batch"
    if rule not in RULES:
        raise ValueError(f"rule '{rule}' is unknown; use one of: {', '.join(RULES)}")
    if not (isinstance(growth, (int, float)) and growth >= 1.0):
        raise ValueError(f"growth ({growth}) must be a number >= 1; pass e.g. --growth 4")
    if not isinstance(years, int) or years < 0:
        raise ValueError(f"years ({years}) must be an integer >= 0; pass e.g. --years 3")
    if target_samples_per_s is not None and target_samples_per_s <= 0:
        raise ValueError(f"target_samples_per_s ({target_samples_per_s}) must be positive")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers ({workers}) must be a positive integer; pass e.g. workers=2")
    if max_global_batch is not None and (not isinstance(max_global_batch, int)
                                         or max_global_batch < s.training.global_batch):
        raise ValueError(f"max_global_batch ({max_global_batch}) must be an integer >= the scenario's global batch "
                         f"({s.training.global_batch}); pass e.g. --max-global-batch {DEFAULT_MAX_GLOBAL_BATCH}")
    gb_cap = max_global_batch or max(DEFAULT_MAX_GLOBAL_BATCH, s.training.global_batch)
    per_gpu0 = s.training.global_batch / s.hardware.num_gpus
    rm = load_roadmap(roadmap)
    target0 = target_samples_per_s or simulate(s, imbalance=False).samples_per_s
    base_flops = step_flops_of(s)
    space = QUICK_SPACE if space is None else space
    rows: list[ForecastRow] = []
    grow_gb: dict[int, int] = {}  # each year's global batch before the cluster grows it
    # the search starts from the last row that reached its target (GPUs, GPU, FLOPs, target),
    # scaled by FLOPs, target and bf16 peak: usually one or two plans per row
    anchor = (s.hardware.num_gpus, s.hardware.gpu, 1.0, target0)
    most = max(len(rm.at(y)) for y in range(years + 1))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n_workers = min(2 * most, cpus) if workers is None else min(workers, 2 * most)
    # forked before the progress bar starts its thread; the rows of a year are planned side by side
    pool = (ProcessPoolExecutor(n_workers, mp_context=mp.get_context("fork"))
            if n_workers > 1 and "fork" in mp.get_all_start_methods() else None)  # fmt: skip
    if pool is not None:
        list(pool.map(abs, range(n_workers)))  # start every worker now
    try:
        with bar_of(sum(len(rm.at(y)) for y in range(years + 1)), enabled=progress,
                    description=f"forecasting {s.name}") as bar:  # fmt: skip
            years_of: dict[int, tuple] = {}  # year -> (growth, realised growth, target, batch cap, rows' jobs)

            def jobs_of(y: int) -> None:
                """Year ``y``'s row searches, each starting from ``anchor`` scaled (module docstring)."""
                factor = float(growth) ** y
                sy = grow(s, factor, rule)
                realised = step_flops_of(sy) / base_flops
                grow_gb[y] = sy.training.global_batch
                target = target0 * (sy.training.global_batch / s.training.global_batch
                                    if rule == "batch" else 1.0)  # fmt: skip
                # data parallelism ends at one sample per GPU: past the largest global batch, more
                # GPUs cannot help, and the row says the target is out of reach ("-")
                top_gb = max(gb_cap, sy.training.global_batch)
                cap = min(max_gpus, top_gb)
                a_gpus, a_gpu, a_real, a_target = anchor
                jobs = []
                for g in rm.at(y):
                    est = (a_gpus * realised / a_real * target / a_target
                           * get_gpu(a_gpu).peak("bf16") / get_gpu(g.gpu).peak("bf16"))  # fmt: skip
                    jobs.append((sy, g, target, dict(
                        budget=plan_budget, space=space, max_gpus=cap, start=max(1, min(cap, round(est))),
                        per_gpu=per_gpu0, max_global_batch=top_gb)))  # fmt: skip
                years_of[y] = (factor, realised, target, top_gb, jobs)

            searched: dict[tuple[int, int], _Searched] = {}  # (year, row) -> its search
            finished: dict[tuple[int, int], tuple] = {}  # (year, row) -> its search and full plan

            def anchored(y: int) -> bool:
                """Whether year ``y``'s searches tell where the next year starts: its last row that
                reaches the target is known (``anchor`` is set to it), or none does (kept)."""
                nonlocal anchor
                _, realised, target, _, jobs = years_of[y]
                for i in reversed(range(len(jobs))):
                    if (y, i) not in searched:
                        return False
                    if searched[y, i].gpus is not None:
                        anchor = (searched[y, i].gpus, jobs[i][1].gpu, realised, target)
                        return True
                return True

            if pool is None:
                for y in range(years + 1):
                    jobs_of(y)
                    for i, job in enumerate(years_of[y][4]):
                        cache: dict = {}  # the planner's op-graph templates, shared by the row's plans
                        searched[y, i] = _row_search(job, cache)
                        finished[y, i] = _finish(searched[y, i], cache)
                        bar.advance()
                    anchored(y)
            else:
                # a row's search (goal plans) and its full plan are separate jobs: the next year's
                # searches start from the last row of this year that reaches its target
                # (``anchor``), queued as soon as its search tells the count, ahead of the full
                # plans; a year's last row goes first (the rows are the same either way)
                pending: dict = {}

                def submit_year(y: int) -> None:
                    jobs_of(y)
                    for i in reversed(range(len(years_of[y][4]))):
                        pending[pool.submit(_row_search, years_of[y][4][i])] = ("search", y, i)

                submit_year(0)
                nxt = 1
                while pending:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    new = []
                    for f in done:
                        kind, y, i = pending.pop(f)
                        if kind == "search":
                            searched[y, i] = f.result()
                            new.append((y, i))
                        else:
                            finished[y, i] = f.result()
                            bar.advance()
                    while nxt <= years and anchored(nxt - 1):
                        submit_year(nxt)
                        nxt += 1
                    for y, i in sorted(new):
                        pending[pool.submit(_finish, searched[y, i])] = ("full", y, i)
            for y in range(years + 1):
                factor, realised, target, top_gb, jobs = years_of[y]
                found = [finished[y, i] for i in range(len(jobs))]
                year_rows = []
                for g, (n, entry, plans, largest, planned) in zip(rm.at(y), found):
                    res = entry.result if entry is not None else None
                    reason = ""
                    if n is None:
                        net_max, gb = get_network(g.network).max_gpus, top_gb
                        why = (f"{g.network}'s largest size, {net_max:,}" if net_max <= min(max_gpus, gb)
                               else f"the global batch cap of {gb:,} samples (one per GPU; --max-global-batch)"
                               if gb <= max_gpus else f"the forecast's limit of {max_gpus:,}")  # fmt: skip
                        got = (f"{res.samples_per_s:,.0f} samples/s ({entry.candidate.label()})" if res
                               else "no layout fits in memory")  # fmt: skip
                        reason = (f"target {target:,.0f} samples/s out of reach: at {largest:,} GPUs "
                                  f"(capped by {why}) {got}")  # fmt: skip
                    year_rows.append(ForecastRow(
                        year=y, gpu=g.gpu, network=g.network, growth_requested=factor,
                        growth_realised=realised, target_samples_per_s=target, gpus=n,
                        samples_per_s=res.samples_per_s if res else 0.0, mfu=res.mfu if res else 0.0,
                        step_time_s=res.step_time_s if res else math.inf,
                        energy_mwh_per_year=(n * g.tdp_w * rm.pue * rm.hours_per_year / 1e6
                                             if n else None),
                        cost_usd_per_year=n * g.usd_per_gpu_hour * rm.hours_per_year if n else None,
                        config=entry.candidate.label() if entry else "no layout fits in memory",
                        plans=plans, largest_gpus=largest, reason=reason,
                        global_batch=planned.training.global_batch,
                    ))  # fmt: skip
                reach = [r for r in year_rows if r.gpus]
                if reach:
                    min(reach, key=lambda r: r.cost_usd_per_year).cheapest = True
                rows += year_rows
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    notes = [f"target {target0:,.0f} samples/s = "
             + ("given" if target_samples_per_s else f"{s.name} as simulated")]  # fmt: skip
    if auto_rule:
        notes.append(f"rule {rule}: the default for a {'GEM' if rule == 'layers' else 'DLRM'} "
                     "model (--rule picks another)")  # fmt: skip
    grown = sorted({(r.year, r.gpu, r.global_batch) for r in rows
                    if r.global_batch > grow_gb.get(r.year, s.training.global_batch)})
    notes.append(f"global batch: {per_gpu0:g} samples per GPU (year 0's) x the GPUs, capped at {gb_cap:,} "
                 f"(--max-global-batch)" + (f"; grown in {len(grown)} of {len(rows)} rows, to "
                                            f"{', '.join(f'{gb:,} (year {y} {g})' for y, g, gb in grown)}"
                                            if grown else "; no row needed more than the year's own"))
    return ForecastResult(s.name, rule, float(growth), years, rows,
                          str(roadmap or "twin/data/roadmap.yaml"), rm.pue, rm.hours_per_year,
                          time.perf_counter() - t0, notes)  # fmt: skip


# ---- command (registered by twin/cli.py: app.command("forecast")(friendly(forecast_command))) --
def forecast_command(
    scenario: Annotated[str, typer.Argument(help="A bundled scenario name or a YAML path.")],
    growth: Annotated[float, typer.Option("--growth", help="Model FLOPs growth per year.")] = 4.0,
    years: Annotated[int, typer.Option("--years", help="Years after year 0.")] = 3,
    rule: Annotated[Optional[str], typer.Option("--rule", help="How FLOPs grow: layers, width, seq_len, batch (default: layers for a GEM model, batch for a DLRM).")] = None,
    roadmap: Annotated[Optional[Path], typer.Option("--roadmap", help="Roadmap YAML (default: twin/data/roadmap.yaml).")] = None,
    target: Annotated[Optional[float], typer.Option("--target", help="Samples/s to hold (default: the scenario's).")] = None,
    out: Annotated[Optional[Path], typer.Option("-o", "--out", help="Folder for the PNG plots and forecast.json.")] = None,
    plan_budget: Annotated[int, typer.Option(
        "--plan-budget", help="Simulations (evaluations) each plan may run: a count, so the forecast is the "
        "same on any machine.")] = DEFAULT_PLAN_BUDGET,
    max_global_batch: Annotated[Optional[int], typer.Option(
        "--max-global-batch", help="The global batch grows with the cluster (year 0's samples per GPU x GPUs) up "
        f"to this (default {DEFAULT_MAX_GLOBAL_BATCH:,}, gem-h100-4k's, or the scenario's own when larger; the "
        "scenario's own keeps it fixed).")] = None,
) -> None:  # fmt: skip
    """GPUs, MFU, energy and cost per year per GPU generation as the model's FLOPs grow."""
    from twin import api
    from twin.console import out as con

    if out is not None and out.exists() and not out.is_dir():
        raise ValueError(f"-o {out} is a file; give a folder for the plots")
    r = api.forecast(scenario, growth=growth, years=years, rule=rule, target_samples_per_s=target,
                     roadmap=roadmap, plan_budget=plan_budget, progress=True,
                     max_global_batch=max_global_batch)  # fmt: skip
    con.print(r.table())
    for line in [*r.lines(), *r.notes]:
        con.print(line, highlight=False, soft_wrap=True)
    con.print(f"forecast in {r.wall_s:.1f} s ({count(sum(x.plans for x in r.rows), 'plan')})")
    if out is not None:
        paths = r.plot(out)
        api.to_json(r, out / "forecast.json")  # JSON has no infinity: an unreached row's step time is null
        con.print(f"wrote {', '.join(str(p) for p in paths)} and {out / 'forecast.json'}")
