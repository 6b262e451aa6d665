"""Depth folding: a deep GEM model's step and memory from two shallow copies of it (torch-free).

A GEM model's interaction stack is ``N`` identical sequence layers beside ``N`` identical
non-sequence layers, with a fixed number of cross layers spread evenly between them. The engine
runs each stream in program order, so a few layers into the stack its schedule repeats layer by
layer: every quantity of the step (its time, each part of the breakdown, each axis's traffic,
the host's issue time) and of the memory per rank (parameters, optimizer states, saved
activations; the peaks are one layer's) grows by the same amount per layer. So::

    x(N) = x(A) + (x(B) - x(A)) · (N - A) / (B - A)        (A, B = fold_depths(s))

gives the step of an ``N``-layer model from two simulations of ``A`` and ``B = 2A`` layers, ``A``
the fewest stages the model's cross layers need (at least 2): ``N / 3A`` times less work. This is a property of the engine, not of the hardware: ``python -m
twin.bench_fold`` checks it against the full simulation on random layouts of the bundled
scenarios at several depths and writes the error table (``twin/data/fold_error.json``); the
planner and the forecast use it for models at least ``FOLD_MIN_RATIO × B`` layers deep, and a CLI
plan re-simulates its top configurations in full.

Rules:
- foldable: a GEM model whose sequence and non-sequence stacks have the same number of layers
  (or one of them none), at least ``FOLD_MIN_RATIO × B``; everything else is simulated in full;
- times and bytes are extended along the line (never below zero); what follows from them is
  computed again for the deep model (samples/s, MFU from its analytic FLOPs, the straggler, the
  memory's fit and message, goodput);
- the shallow copies keep every other field of the scenario (layout, batch, precision, ...).
"""

from __future__ import annotations

from scenarios.memo import memo
from scenarios.schema import GEMModel, Scenario
from scenarios.loader import validate
from twin.goodput import goodput
from twin.memory import MemoryReport, _hint
from twin.simulate import SimResult, model_flops_per_step

# fold a model at least this many times as deep as the deeper shallow copy: below, the two copies
# (3A layers in all, each with the layers outside the stacks) cost about what the model does
FOLD_MIN_RATIO = 4


def depth(s: Scenario) -> int | None:
    """Layers per stack of a GEM model whose stacks fold (module rules), else None."""
    m = s.model
    if not isinstance(m, GEMModel):
        return None
    counts = {n for n in (m.sequence.num_layers, m.nonseq.num_layers) if n}
    return counts.pop() if len(counts) == 1 else None


def fold_depths(s: Scenario) -> tuple[int, int]:
    """(A, B): the shallow depths the line is drawn through, A the fewest stages that hold the
    model's cross layers (one stage each at most), at least 2; B = 2A."""
    a = max(2, s.model.cross.num_layers if isinstance(s.model, GEMModel) else 0)
    return a, 2 * a


def foldable(s: Scenario) -> bool:
    n = depth(s)
    return n is not None and n >= FOLD_MIN_RATIO * fold_depths(s)[1]


_SHALLOW: dict = {}  # scenarios.memo's table


def at_depth(s: Scenario, n: int) -> Scenario:
    """``s`` with ``n`` layers in each of its non-empty stacks (cross layers kept)."""

    def make() -> Scenario:
        data = s.model_dump(mode="json")
        m = data["model"]
        for stack in ("sequence", "nonseq"):
            if m[stack]["num_layers"]:
                m[stack] = {**m[stack], "num_layers": n}
        data["name"] = f"{s.name}@{n}layers"
        return validate(data)

    return memo(_SHALLOW, (s.model,), (n, s.hardware, s.parallelism, s.precision, s.training, s.execution), make)


def shallow(s: Scenario, depths: tuple[int, int] | None = None) -> tuple[Scenario, Scenario]:
    """The two shallow copies of ``s`` the line is drawn through (default: ``fold_depths``)."""
    depths = depths or fold_depths(s)
    return at_depth(s, depths[0]), at_depth(s, depths[1])


def along(xa: float, xb: float, n: int, depths: tuple[int, int]) -> float:
    """The value at depth ``n`` on the line through (A, xa) and (B, xb)."""
    a, b = depths
    return xa + (xb - xa) * (n - a) / (b - a)


def _dict(da: dict[str, float], db: dict[str, float], n: int, depths) -> dict[str, float]:
    return {k: max(0.0, along(da.get(k, 0.0), db.get(k, 0.0), n, depths)) for k in {**da, **db}}


def fold_memory(s: Scenario, ma: MemoryReport, mb: MemoryReport,
                depths: tuple[int, int] | None = None) -> MemoryReport:  # fmt: skip
    """The memory report of ``s`` from its two shallow copies' (activations by layer: the
    deeper copy's, whose layer names the deep model shares)."""
    n, depths = depth(s), depths or fold_depths(s)
    cats = _dict(ma.by_category_bytes, mb.by_category_bytes, n, depths)
    total = along(ma.total_bytes, mb.total_bytes, n, depths)
    return MemoryReport(s.name, mb.gpu, cats, dict(mb.by_layer_activation_bytes), total, mb.capacity_bytes,
                        total <= mb.capacity_bytes, _hint(s, max(cats, key=cats.get)))  # fmt: skip


def fold_result(s: Scenario, ra: SimResult, rb: SimResult, memory: MemoryReport | None = None,
                depths: tuple[int, int] | None = None) -> SimResult:  # fmt: skip
    """The SimResult of ``s`` from its two shallow copies' (same layout, calibration, rank
    model); ``memory``: ``s``'s folded memory report, if already known."""
    n, depths = depth(s), depths or fold_depths(s)
    step = max(along(ra.step_time_s, rb.step_time_s, n, depths), 1e-12)
    balanced = min(step, max(0.0, along(ra.balanced_step_time_s, rb.balanced_step_time_s, n, depths)))
    cats = _dict(ra.memory_bytes, rb.memory_bytes, n, depths)
    if memory is None:
        total = along(ra.memory_total_bytes, rb.memory_total_bytes, n, depths)
        memory = MemoryReport(s.name, rb.gpu, cats, {}, total, rb.memory_capacity_bytes,
                              total <= rb.memory_capacity_bytes, _hint(s, max(cats, key=cats.get)))  # fmt: skip
    flops = model_flops_per_step(s)
    dicts = ("breakdown_s", "compute_s_by_op_class", "isolated_compute_s_by_op_class", "compute_s_by_kernel",
             "comm_s_by_axis", "exposed_comm_s_by_axis", "exposed_comm_s_split_by_axis")  # fmt: skip
    classes = [_with_wait(ca, max(0.0, along(ca.wait_s, cb.wait_s, n, depths)))
               for ca, cb in zip(ra.rank_classes, rb.rank_classes)]  # fmt: skip
    return rb.model_copy(update={
        "scenario": s.name,
        "step_time_s": step,
        "samples_per_s": s.training.global_batch / step,
        "model_flops_per_step": flops,
        "mfu": flops / (step * s.hardware.num_gpus * rb.mfu_peak_flops),
        **{d: _dict(getattr(ra, d), getattr(rb, d), n, depths) for d in dicts},
        "balanced_step_time_s": balanced,
        "straggler_s": step - balanced,
        "rank_classes": classes,
        "memory_fits": memory.fits,
        "memory_total_bytes": memory.total_bytes,
        "memory_bytes": dict(memory.by_category_bytes),
        "memory_message": memory.message(),
        "host_s": max(0.0, along(ra.host_s, rb.host_s, n, depths)),
        "num_ops": round(along(ra.num_ops, rb.num_ops, n, depths)),
        "resolved_scenario": s,
        "goodput": goodput(s, step_time_s=step, memory=memory),
    })


def _with_wait(c, wait_s: float):
    return c.model_copy(update={"wait_s": wait_s})


def simulate_folded(s: Scenario, *, imbalance: bool = False, depths: tuple[int, int] | None = None) -> SimResult:
    """``simulate(s)`` by folding (module rules): ``s``'s stacks must be deeper than ``depths``."""
    from twin.simulate import simulate

    n = depth(s)
    depths = depths or fold_depths(s)
    if n is None or n <= depths[1]:
        raise ValueError(f"model of {s.name} does not fold: it needs a GEM model with equal stacks deeper "
                         f"than {depths[1]} layers (simulate it in full)")  # fmt: skip
    sa, sb = shallow(s, depths)
    return fold_result(s, simulate(sa, imbalance=imbalance), simulate(sb, imbalance=imbalance), depths=depths)


__all__ = ["FOLD_MIN_RATIO", "along", "at_depth", "depth", "fold_depths", "fold_memory", "fold_result",
           "foldable", "shallow", "simulate_folded"]
