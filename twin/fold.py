"""Folding: a step of many identical layers or micro-batches from a few small copies (torch-free).

A GEM model's interaction stack is ``N`` identical sequence layers beside ``N`` identical
non-sequence layers, with a fixed number of cross layers spread evenly between them; a step of
gradient accumulation is ``K`` identical micro-batches. The engine runs each stream in program
order, so a few layers (micro-batches) in, its schedule repeats layer by layer (micro-batch by
micro-batch): every quantity of the step (its time, each part of the breakdown, each axis's
traffic, the host's issue time, the no-contention lower bound) and of the memory per rank grows
by the same amount per layer (per micro-batch). So, along each folded axis::

    x(N) = x(A) + (x(B) - x(A)) · (N - A) / (B - A)

- **depth**: A = the fewest stages the model's cross layers need (at least 2), B = 2A;
- **micro-batches**: A = 2, B = 3 (the first micro-batch is not yet in the steady state: it has
  no earlier one to overlap with). The no-contention lower bound folds exactly; the step mostly
  does, but where collectives contend with compute that contention can drift from one
  micro-batch to the next: on the 512-GPU layouts of ``gem-h100-4k`` the step was up to 0.75% off,
  and on the 5D debug scenario 3e-5 (with one axis's busy time 15% off). The planner therefore
  folds micro-batches for its lower bounds only;
- both: the four copies (A, B) × (A, B), micro-batches folded first, then depth.

The step of an ``N``-layer, ``K``-micro-batch model thus costs two or four simulations of a few
layers and micro-batches. This is a property of the engine, not of the hardware: ``python -m
twin.bench_fold`` checks it against the full simulation on random layouts of the bundled scenarios
and writes the error table (``twin/data/fold_error.json``, 64 layers per stack): folded along
depth alone the step was exact to rounding on 97 of 98 layouts and 3e-4 off on one, the lower
bound exact on all 128; where the step is the host's issue time at 4,096 GPUs the breakdown's
parts can be a few percent off (the slowest rank class can change between copies), the step not.
The planner and the forecast fold an axis only when it is at least ``FOLD_MIN_RATIO`` times B; a
CLI plan re-simulates its top configurations in full.

Rules:
- depth folds for a GEM model whose sequence and non-sequence stacks have the same number of
  layers (or one of them none); micro-batches fold for any model;
- times and bytes are extended along the line (never below zero); what follows from them is
  computed again for the real scenario (samples/s, MFU from its analytic FLOPs, the straggler, the
  memory's fit and message, goodput);
- the host's time to issue the step (``SimResult.host_s``, CUDA without graphs) is a floor under
  the step: a maximum of two lines, not a line. So the devices' step (``SimResult.device_s``) and
  the host's time are extended each on its own line and the step is the larger; the idle time is
  what the step leaves after compute, SM contention and exposed communication;
- the copies keep every other field of the scenario (layout, micro-batch, precision, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scenarios.memo import memo
from scenarios.schema import GEMModel, Scenario
from twin.goodput import goodput
from twin.memory import MemoryReport, _hint
from twin.simulate import SimResult, model_flops_per_step

# fold an axis at least this many times as long as the longer copy: below, the copies (A + B
# layers or micro-batches, each with what lies outside the stack) cost about what the real one does
FOLD_MIN_RATIO = 4
ACCUMS = (2, 3)  # the micro-batch counts the line is drawn through


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


def along(xa: float, xb: float, n: int, ab: tuple[int, int]) -> float:
    """The value at ``n`` on the line through (A, xa) and (B, xb)."""
    a, b = ab
    return xa + (xb - xa) * (n - a) / (b - a)


@dataclass(frozen=True)
class Fold:
    """Which axes of a scenario's step fold, and where the lines are drawn (module docstring)."""

    layers: int | None = None  # layers per stack (None: depth not folded)
    depths: tuple[int, int] = (2, 4)
    accum: int | None = None  # micro-batches per step (None: not folded)
    accums: tuple[int, int] = ACCUMS

    def __bool__(self) -> bool:
        return self.layers is not None or self.accum is not None

    def grid(self) -> list[tuple[int | None, int | None]]:
        """The copies, as (layers per stack, micro-batches), None where the axis is not folded."""
        return [(d, k) for d in (self.depths if self.layers else (None,))
                for k in (self.accums if self.accum else (None,))]  # fmt: skip

    def copies(self, s: Scenario) -> list[Scenario]:
        """``s`` at each point of the grid."""
        out = []
        for d, k in self.grid():
            x = at_depth(s, d) if d else s
            out.append(with_accum(x, k) if k else x)
        return out

    def combine(self, xs: Sequence[float]) -> float:
        """The value at the real scenario from its values at the copies (grid order)."""
        xs = list(xs)
        if self.accum:
            xs = [along(xs[i], xs[i + 1], self.accum, self.accums) for i in range(0, len(xs), 2)]
        if self.layers:
            xs = [along(xs[0], xs[1], self.layers, self.depths)]
        return xs[0]

    def without_accum(self) -> Fold:
        """The depth fold alone (memory per rank does not depend on the micro-batch count)."""
        return Fold(self.layers, self.depths)


def depth_fold(s: Scenario) -> Fold:
    """The depth fold of ``s`` when its stacks are at least ``FOLD_MIN_RATIO`` times B deep (else
    an empty fold)."""
    n, dd = depth(s), fold_depths(s)
    return Fold(n if n is not None and n >= FOLD_MIN_RATIO * dd[1] else None, dd)


def with_accum_fold(f: Fold, k: int) -> Fold:
    """``f`` also folding ``k`` micro-batches per step, when that is worth it (at least
    ``FOLD_MIN_RATIO`` times their longer copy's, over the two copies' count: 6)."""
    return Fold(f.layers, f.depths, k if k >= FOLD_MIN_RATIO * ACCUMS[1] / 2 else None)


def fold_of(s: Scenario) -> Fold:
    """The axes of ``s`` worth folding."""
    return with_accum_fold(depth_fold(s), s.grad_accum)


_COPIES: dict = {}  # scenarios.memo's table


def at_depth(s: Scenario, n: int) -> Scenario:
    """``s`` with ``n`` layers in each of its non-empty stacks (cross layers kept)."""

    def make() -> Scenario:  # the model checked again; the rest as it is (a planner's batch included)
        m = s.model.model_dump(mode="json")
        for stack in ("sequence", "nonseq"):
            if m[stack]["num_layers"]:
                m[stack] = {**m[stack], "num_layers": n}
        return s.model_copy(update={"model": type(s.model).model_validate(m), "name": f"{s.name}@{n}layers"})

    return memo(_COPIES, (s.model,), (n, s.hardware, s.parallelism, s.precision, s.training, s.execution), make)


def with_accum(s: Scenario, k: int) -> Scenario:
    """``s`` with ``k`` micro-batches per step (its global batch changed to match)."""
    t = s.training
    return s.model_copy(update={"training": t.model_copy(
        update={"global_batch": t.micro_batch * s.hardware.num_gpus * k})})  # fmt: skip


def _dict(fold: Fold, ds: Sequence[dict[str, float]]) -> dict[str, float]:
    keys = {k: None for d in ds for k in d}
    return {k: max(0.0, fold.combine([d.get(k, 0.0) for d in ds])) for k in keys}


def fold_memory(s: Scenario, mems: Sequence[MemoryReport], fold: Fold) -> MemoryReport:
    """The memory report of ``s`` from its copies' (``fold.copies`` order; activations by
    layer: the last copy's, whose layer names ``s`` shares)."""
    cats = _dict(fold, [m.by_category_bytes for m in mems])
    total = fold.combine([m.total_bytes for m in mems])
    last = mems[-1]
    return MemoryReport(s.name, last.gpu, cats, dict(last.by_layer_activation_bytes), total, last.capacity_bytes,
                        total <= last.capacity_bytes, _hint(s, max(cats, key=cats.get)))  # fmt: skip


def fold_result(s: Scenario, results: Sequence[SimResult], fold: Fold,
                memory: MemoryReport | None = None) -> SimResult | None:  # fmt: skip
    """The SimResult of ``s`` from its copies' (``fold.copies`` order; same layout, calibration
    and rank model); ``memory``: ``s``'s folded memory report, if already known."""
    if any(r.device_s <= 0 for r in results):
        raise ValueError("fold_result needs results with device_s (made by this version of the twin)")
    last = results[-1]

    def f(field: str) -> float:
        return fold.combine([getattr(r, field) for r in results])

    device, host = f("device_s"), max(0.0, f("host_s"))
    step = max(device, host, 1e-12)  # the host's floor, as the engine applies it
    balanced = min(step, max(0.0, f("balanced_step_time_s")))
    if memory is None:
        cats = _dict(fold, [r.memory_bytes for r in results])
        total = f("memory_total_bytes")
        memory = MemoryReport(s.name, last.gpu, cats, {}, total, last.memory_capacity_bytes,
                              total <= last.memory_capacity_bytes, _hint(s, max(cats, key=cats.get)))  # fmt: skip
    flops = model_flops_per_step(s)
    dicts = ("breakdown_s", "compute_s_by_op_class", "isolated_compute_s_by_op_class", "compute_s_by_kernel",
             "comm_s_by_axis", "exposed_comm_s_by_axis", "exposed_comm_s_split_by_axis")  # fmt: skip
    classes = [c.model_copy(update={"wait_s": max(0.0, fold.combine([r.rank_classes[i].wait_s for r in results]))})
               for i, c in enumerate(last.rank_classes)]  # fmt: skip
    return last.model_copy(update={
        "scenario": s.name,
        "step_time_s": step,
        "samples_per_s": s.training.global_batch / step,
        "model_flops_per_step": flops,
        "mfu": flops / (step * s.hardware.num_gpus * last.mfu_peak_flops),
        **{d: _dict(fold, [getattr(r, d) for r in results]) for d in dicts},
        "breakdown_s": {**(b := _dict(fold, [r.breakdown_s for r in results])),
                        "idle": max(0.0, step - b["compute"] - b["sm_contention"] - b["exposed_comm"])},
        "balanced_step_time_s": balanced,
        "straggler_s": step - balanced,
        "rank_classes": classes,
        "memory_fits": memory.fits,
        "memory_total_bytes": memory.total_bytes,
        "memory_bytes": dict(memory.by_category_bytes),
        "memory_message": memory.message(),
        "host_s": host,
        "num_ops": round(f("num_ops")),
        "device_s": device,
        "resolved_scenario": s,
        "goodput": goodput(s, step_time_s=step, memory=memory),
    })


def simulate_folded(s: Scenario, *, imbalance: bool = False, fold: Fold | None = None) -> SimResult:
    """``simulate(s)`` by folding (module rules); ``fold``: default ``fold_of(s)``."""
    from twin.simulate import simulate

    fold = fold_of(s) if fold is None else fold
    if not fold:
        raise ValueError(f"{s.name} does not fold: it needs a GEM model with equal stacks of at least "
                         f"{FOLD_MIN_RATIO * fold_depths(s)[1]} layers or at least "
                         f"{FOLD_MIN_RATIO * ACCUMS[1] // 2} micro-batches per step (simulate it in full)")  # fmt: skip
    return fold_result(s, [simulate(c, imbalance=imbalance) for c in fold.copies(s)], fold)


__all__ = ["ACCUMS", "FOLD_MIN_RATIO", "Fold", "along", "at_depth", "depth", "depth_fold", "fold_depths",
           "fold_memory", "fold_of", "fold_result", "simulate_folded", "with_accum", "with_accum_fold"]
