"""Fit the twin to measured runs, and compare a run with the twin's prediction.

The fit is the simplest that is honest: for each op class the twin models, the measured time
per step (from the executor's profiler) divided by the modelled time gives a scale on that
class's kernel times; for multi-rank runs each collective's α (seconds a call) and β (bytes/s)
per network tier and kind are fitted on the busy time measured per mesh axis
(``fit_collectives``; a multiplier per tier and kind on the model where the runs do not
determine α and β); what the twin with those still leaves unexplained of a run's step (host
and framework time, ops the twin does not model, such as the profiler's ``other``) becomes a
per-step overhead. On one rank with no communication this reproduces the fitted run's step time
by construction: the test of a calibration is a run it was not fitted on. Over several runs the
scales are time-weighted ratios (two runs) or medians of the runs' ratios (three and more), the
overhead likewise, and the α/β fit down-weights runs far off the rest: one bad run cannot pull
the fit. The calibration records every run's residuals (step, op classes, axes).

From three runs of different sizes on, each key also gets an efficiency curve where it predicts
left-out runs better than a scale (``fit_curves``: a fixed cost a call, an x_half multiplier),
and the overhead a share of kernel time for the gaps between kernels (``fit_overhead``). Runs
whose compute collectives overlap feed the scales, not the curves; where clean runs fix the
scales they measure the collectives' slowdown of compute (``fit_contention``, ``sm_contention``),
refitted with the collectives until both converge.

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

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timezone

from hwmodels.calibration import Calibration, CalibrationRun, utc_now
from hwmodels.gpus import catalog_name
from scenarios.loader import Overrides
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


def _shared(record: RunRecord) -> str:
    """``/k`` for a CPU run whose processes each hold 1/k of the machine (``hwmodels.gpus.shared_entry``):
    n ranks time-sharing its cores, or fewer threads than cores (the ``cpu`` entry was measured with
    all of them): k = max(n, cores / threads)."""
    from hwmodels.gpus import SHARED_SEP, get_gpu

    env = record.environment
    if env.device != "cpu":
        return ""
    cores = get_gpu(measured_hardware(record)).sms
    k = max(env.num_devices, -(-cores // env.cpu_threads) if env.cpu_threads > 0 else 1)
    return f"{SHARED_SEP}{k}" if k > 1 else ""


def as_measured(record: RunRecord, overrides: Overrides = ()) -> Scenario:
    """The run's scenario as it ran: on the hardware it was measured on (its own ``hardware.gpu``
    when they agree), with the execution it ran (``recorded_execution``), then ``overrides``
    (``--set a.b=c`` strings or a mapping: what a record cannot tell, e.g. ``execution.ffn_kernel=torch`` for a run that
    chose it through the environment)."""
    from scenarios.loader import apply_overrides, validate

    s = _scenario(record)
    data = s.model_dump(mode="json")
    data["hardware"]["gpu"] = measured_hardware(record) + _shared(record)
    execution, kept_activations = recorded_execution(record)
    data["execution"] = execution
    if kept_activations:
        data["parallelism"]["activation_checkpointing"] = "none"
    data = apply_overrides(data, overrides)
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
    """Per-op-class scales, a per-step overhead and (multi-rank runs) each collective's α/β per
    network tier and kind that make the twin match ``records``; the residuals of every run."""
    if not records:
        raise ValueError("calibrate needs at least one run record")
    scens = [as_measured(r) for r in records]
    gpus = {measured_hardware(r) for r in records}
    if len(gpus) > 1:
        ran = ", ".join(sorted(f"{r.run_id} on {measured_hardware(r)}" for r in records))
        raise ValueError(f"runs were measured on several kinds of hardware ({ran}); fit one kind at a time")
    gpu = next(iter(gpus))
    ratios: dict[str, list[tuple[float, float]]] = {}  # key -> per run (measured, modelled)
    clean_ratios: dict[str, list[tuple[float, float]]] = {}  # the same from the clean runs only
    rows: dict[str, list[CurveRow]] = {}  # key -> per clean run, the modelled time's terms and the measured time
    overlapped = []  # the runs whose compute the collectives slow (they measure the contention)
    for r, s in zip(records, scens):
        terms, clean = curve_terms(s, gpu)
        run_measured = {**profiled_times(r), **_profiled_kinds(r)}
        overlapped += [] if clean else [(r, s)]
        for key, row in terms.items():
            if row.modelled_s > 0 and run_measured.get(key, 0.0) > 0:
                ratios.setdefault(key, []).append((run_measured[key], row.modelled_s))
                if clean:  # kernel sizes read cleanly: no collective shares the compute's cores
                    clean_ratios.setdefault(key, []).append((run_measured[key], row.modelled_s))
                    rows.setdefault(key, []).append(dataclasses.replace(row, measured_s=run_measured[key]))
    devices = sorted({f"{r.environment.device}:{r.environment.device_name}" for r in records})
    scale = _scales(ratios) | _scales(clean_ratios)  # a key's clean runs, where it has some
    efficiency: dict[str, dict[str, float]] = {}
    for key, fitted_curve in fit_curves(rows).items():  # keys with runs enough to fit a curve on
        scale.update(_spread(key, fitted_curve.scale))
        for kind in _kinds_of_key(key, rows) if fitted_curve.overrides() else ():
            efficiency[kind] = fitted_curve.overrides()
    draft = dict(version=2, gpu=gpu, created_utc=utc_now(),
                 runs=[_run_entry(r, src) for r, src in zip(records, sources)], scale=scale, efficiency=efficiency)  # fmt: skip
    ab, cs = fit_collectives(records, scens)
    fixed = {k for key in clean_ratios for k in _spread(key, 0.0)}  # scales the clean runs fixed
    draft["sm_contention"], contention_ok = 1.0, True
    for _ in range(ALPHA_BETA_ROUNDS if ab or cs else 0):  # each axis's target over the DES's stretch
        current = Calibration(**draft, collective_alpha_beta=ab, collective_scale=cs)
        before = (ab, cs | {"sm_contention": draft["sm_contention"]})
        ab, cs = fit_collectives(records, scens, current)
        # the collectives' slowdown of the compute they overlap, from the runs they overlap
        if contention_ok:
            kappa = fit_contention(overlapped, current, clean_ratios)
            contention_ok = kappa <= CONTENTION_MAX  # beyond: not contention (waiting, time-sharing)
            draft["sm_contention"] = kappa if contention_ok else 1.0
        if _converged(before, (ab, cs | {"sm_contention": draft["sm_contention"]})):
            break
        # the classes' slowdown by the collectives overlapping them follows the fitted collectives:
        # the scales fitted against the uncalibrated ones are corrected by what they leave over
        draft["scale"] = _rescaled(draft["scale"], records, scens, current, fixed)
    scale, contention = draft["scale"], draft["sm_contention"]
    # what the twin still leaves unexplained of each run's step (host, framework, unmodelled ops)
    fitted = Calibration(**draft, collective_alpha_beta=ab, collective_scale=cs)
    sims = [simulate(s, calibration=fitted) for s in scens]
    overhead_s, gap_fraction = fit_overhead([r.step_time_s - sim.step_time_s for r, sim in zip(records, sims)],
                                            [sum(sim.compute_s_by_op_class.values()) for sim in sims])
    cal = Calibration(
        version=2,
        gpu=gpu,
        created_utc=utc_now(),
        runs=[_run_entry(r, src) for r, src in zip(records, sources)],
        scale=scale,
        efficiency=efficiency,
        sm_contention=contention,
        overhead_s=overhead_s,
        gap_fraction=gap_fraction,
        collective_alpha_beta=ab,
        collective_scale=cs,
        measured_on=", ".join(devices),
        notes=f"fitted on {len(records)} run(s) measured on {', '.join(devices)}" + (
            "" if contention_ok else f"; sm_contention left at 1: the overlapped runs' compute exceeds the kernels' by "
            f"more than {CONTENTION_MAX:g}x the collectives' SM shares can slow it (waiting, time-sharing: not contention)"),
    )
    residuals = {r.run_id: _residuals(r, compare(r, cal).result) for r in records}
    return cal.model_copy(update={"fit_error": {k: v["step"] for k, v in residuals.items()}, "residuals": residuals})


# ---- efficiency curves against size ------------------------------------------------------------------
# A kernel kind's modelled time per step is, summed over its calls, R + X + n·L: the roofline at
# eff_max (R), what the curve's x_half adds (X: small calls run below eff_max) and the fixed cost
# of each call (n calls at launch_s = L). A scale alone multiplies all three; runs of different
# sizes (batch, lengths, width) tell them apart: measured = a·R + b·X + c·n, fitted robustly per
# key over the runs, gives the scale (a, eff_max over a), x_half_scale = b/a and launch_s = c/a,
# the curve's new shape. Of the three models (scale; scale and launch_s; all three) the fit keeps
# the one whose leave-one-run-out error is lowest, a richer one only where it predicts the left-out
# runs better by a margin (and a scale alone misses them by more than CURVE_FLOOR): the curve is
# what the runs show, not what they could be bent to. Runs whose compute the collectives slow
# (multi-rank runs that overlap SM- or core-based communication) feed the scales, not the curves.
PROBE_LAUNCH_S = 20e-6  # added to every kind's launch_s to count its calls (n = Δt / Δlaunch)
PROBE_X_HALF = 2.0  # every kind's x_half times this to measure X (= Δt)
CURVE_MIN_RUNS = 3
CURVE_MARGIN = 0.8  # a richer model is kept when its leave-one-out error is below this times the simpler's
CURVE_FLOOR = 0.01  # a scale alone that predicts left-out runs within this (mean) needs no curve
OVERHEAD_FLOOR = 0.002  # a constant overhead that predicts left-out runs within this share of their kernel time stays
CLEAN_CONTENTION = 0.01  # runs whose compute collectives slow by more than this share fit no curve
CURVE_MODELS = (("scale",), ("scale", "launch_s"), ("scale", "x_half_scale", "launch_s"))


@dataclass(frozen=True)
class CurveRow:
    """One run's terms of a key's modelled time (seconds per step) and what the run measured."""

    roofline_s: float  # R
    x_half_s: float  # X
    calls: float  # n
    launch_s: float  # the modelled launch_s (L) of the key's kinds
    measured_s: float = 0.0

    @property
    def modelled_s(self) -> float:
        return self.roofline_s + self.x_half_s + self.calls * self.launch_s


@dataclass(frozen=True)
class FittedCurve:
    scale: float
    x_half_scale: float | None  # None: the model did not fit it (the curve's own)
    launch_s: float | None
    model: tuple[str, ...]
    loo_error: float  # mean |relative error| of the left-out runs under the kept model

    def overrides(self) -> dict[str, float]:
        out = {}
        if self.x_half_scale is not None:
            out["x_half_scale"] = self.x_half_scale
        if self.launch_s is not None:
            out["launch_s"] = self.launch_s
        return out


def _probe(gpu: str, efficiency: dict[str, dict[str, float]]) -> Calibration:
    return Calibration(version=2, gpu=gpu, created_utc=utc_now(), scale={}, efficiency=efficiency,
                       runs=[CalibrationRun(run_id="probe", scenario="probe", source_path="-", n_steps=1,
                                            step_time_s=1.0)])  # fmt: skip


def curve_terms(s: Scenario, gpu: str) -> tuple[dict[str, CurveRow], bool]:
    """Per op class and per attention kind of ``s``'s step (uncalibrated): the roofline, x_half
    and per-call terms of its modelled time, from two probe simulations (every kind's launch_s
    raised by ``PROBE_LAUNCH_S``; every x_half times ``PROBE_X_HALF``); and whether the step is
    clean for a curve fit: collectives slow its compute by less than ``CLEAN_CONTENTION``
    (elsewhere a class's measured time holds the slowdown too, which varies with the layout)."""
    from hwmodels.kernels import DEFAULT_MODEL, KERNEL_KINDS, KernelKind
    from hwmodels.gpus import get_gpu

    spec = get_gpu(s.hardware.gpu)
    kinds = [k for k in KERNEL_KINDS if k is not KernelKind.OTHER]
    launch = {k: DEFAULT_MODEL.cost(kind=k, flops=1.0, bytes=1.0, gpu=spec, dtype="bf16").launch_s for k in kinds}
    plain = simulate(s)
    base = _by_key(plain)
    compute = sum(plain.compute_s_by_op_class.values())
    clean = compute > 0 and plain.breakdown_s.get("sm_contention", 0.0) < CLEAN_CONTENTION * compute
    more_launch = _by_key(simulate(s, calibration=_probe(gpu, {k.value: {"launch_s": launch[k] + PROBE_LAUNCH_S}
                                                             for k in kinds})))  # fmt: skip
    more_x_half = _by_key(simulate(s, calibration=_probe(gpu, {k.value: {"x_half_scale": PROBE_X_HALF} for k in kinds})))
    out = {}
    for key, t in base.items():
        calls = max(0.0, (more_launch.get(key, t) - t) / PROBE_LAUNCH_S)
        x_half = max(0.0, (more_x_half.get(key, t) - t) / (PROBE_X_HALF - 1.0))
        lk = [launch[k] for k in kinds if _key_of_kind(k.value, key)]
        L = lk[0] if lk else 0.0
        out[key] = CurveRow(max(0.0, t - x_half - calls * L), x_half, calls, L)
    return out, clean


def _by_key(result: SimResult) -> dict[str, float]:
    return {**result.compute_s_by_op_class, **_attention_kinds(result.compute_s_by_kernel)}


def _key_of_kind(kind: str, key: str) -> bool:
    """Whether kernel kind ``kind`` is priced under ``key`` (an op class or an attention kind)."""
    from hwmodels.kernels import KERNEL_KINDS

    return kind.startswith(key + ".") or KERNEL_KINDS[kind].value == key


def _kinds_of_key(key: str, rows: dict[str, list[CurveRow]]) -> list[str]:
    """The kernel kinds a key's curve applies to: an attention kind's two directions; an op
    class's kinds, except the attention class where the runs gave kinds of their own."""
    from hwmodels.kernels import KERNEL_KINDS

    if key == OpClass.ATTENTION.value and any(is_attention_label(k) for k in rows):
        return []
    return [k.value for k in KERNEL_KINDS if _key_of_kind(k.value, key)]


def _spread(key: str, value: float) -> dict[str, float]:
    """``{key: value}``, or for an attention kind (``attention.gdpa``) its two directions' keys."""
    kind = attention_of(key)
    if kind is None:
        return {key: value}
    return {kernel_kind(OpClass.ATTENTION, attention=kind, direction=d): value for d in Direction}


def fit_curves(rows: dict[str, list[CurveRow]]) -> dict[str, FittedCurve]:
    """Per key with ``CURVE_MIN_RUNS`` runs or more: the curve model of ``CURVE_MODELS`` that
    predicts left-out runs best (a richer one only by ``CURVE_MARGIN``), fitted on all the runs."""
    out = {}
    for key, rs in rows.items():
        if len(rs) < CURVE_MIN_RUNS:
            continue
        best = None
        for model in CURVE_MODELS:
            err = _loo_error(rs, model)
            if best is None or (best[1] > CURVE_FLOOR and err < CURVE_MARGIN * best[1]):
                best = (model, err)
        model, err = best
        a, b, c = _fit_curve(rs, model)
        out[key] = FittedCurve(a, b / a if "x_half_scale" in model else None,
                               c / a if "launch_s" in model else None, model, err)  # fmt: skip
    return out


def _fit_curve(rs: list[CurveRow], model: tuple[str, ...]) -> tuple[float, float, float]:
    """(a, b, c) of measured = a·R + b·X + c·n (``robust_solve``); terms outside ``model`` tied
    to a (b = a: the curve's own x_half; c = a·L: its own launch_s)."""
    import numpy as np

    y = np.array([r.measured_s for r in rs])
    cols = [[r.roofline_s + ("x_half_scale" not in model) * r.x_half_s + ("launch_s" not in model) * r.calls * r.launch_s
             for r in rs]]
    if "x_half_scale" in model:
        cols.append([r.x_half_s for r in rs])
    if "launch_s" in model:
        cols.append([r.calls for r in rs])
    A = np.array(cols).T
    s0 = float(np.median(y / np.array([r.modelled_s for r in rs])))
    x0 = np.array([s0] + [s0] * ("x_half_scale" in model) + [s0 * rs[0].launch_s] * ("launch_s" in model))
    x = robust_solve(A, y, x0, ridge=1e-3, robust=0.1, rounds=30)
    a = max(float(x[0]), 1e-6)
    b = float(x[1]) if "x_half_scale" in model else a
    c = float(x[-1]) if "launch_s" in model else a * rs[0].launch_s
    return a, b, c


def _loo_error(rs: list[CurveRow], model: tuple[str, ...]) -> float:
    """Mean |relative error| of each run predicted by ``model`` fitted on the others."""
    errs = []
    for i, left in enumerate(rs):
        a, b, c = _fit_curve(rs[:i] + rs[i + 1:], model)
        pred = a * left.roofline_s + b * left.x_half_s + c * left.calls
        errs.append(abs(pred - left.measured_s) / left.measured_s)
    return sum(errs) / len(errs)


CONTENTION_MAX = 4.0  # an sm_contention above this is not contention: the fit leaves it at 1 and says so


def fit_contention(overlapped: list[tuple[RunRecord, Scenario]], cal: Calibration,
                   clean: dict[str, list[tuple[float, float]]]) -> float:
    """``sm_contention``: how much more (or less) the collectives overlapping compute slow it than
    the twin's SM shares say, from the runs whose compute they overlap: per run, what the
    measured classes exceed the fitted kernels' isolated time by, over the slowdown the twin gives
    (a robust mean over the runs). Determined only where clean runs (no overlap) fixed the scales
    of every class those runs measured; else 1 (the model's shares)."""
    ratios = []
    for r, s in overlapped:
        measured = {k: v for k, v in profiled_times(r).items() if k != "other" and v > 0}
        if not measured or any(k not in clean for k in measured):
            return 1.0
        sim = simulate(s, calibration=cal)
        slowdown = sim.breakdown_s.get("sm_contention", 0.0)
        if slowdown > 0:
            extra = sum(measured.values()) - sum(sim.isolated_compute_s_by_op_class.get(k, 0.0) for k in measured)
            ratios.append(max(0.0, extra) / slowdown * cal.sm_contention)
    return max(_robust_mean(ratios), 1e-3) if ratios else 1.0


def fit_overhead(unexplained: list[float], kernel_s: list[float]) -> tuple[float, float]:
    """(overhead_s, gap_fraction): what the fitted twin leaves unexplained of each run's step, as
    a constant per step, or a constant plus a fraction of the step's modelled kernel time where
    that predicts left-out runs better (``CURVE_MARGIN``; three runs or more) and the constant
    misses them by more than ``OVERHEAD_FLOOR`` of their kernel time. The constant alone is the
    robust mean (``_robust_mean``)."""
    import numpy as np

    u = [max(0.0, x) for x in unexplained]
    const = (_robust_mean(u), 0.0)
    if len(u) < CURVE_MIN_RUNS or min(kernel_s) <= 0 or max(u) <= 0:
        return const

    def solve(idx: list[int]) -> tuple[float, float]:
        A = np.array([[1.0, kernel_s[i]] for i in idx])
        y = np.array([max(u[i], 1e-9) for i in idx])
        c0, c1 = robust_solve(A, y, np.array([np.median(y), 0.0]), ridge=1e-3, robust=0.1, rounds=30)
        return float(c0), float(c1)

    def loo(fit_one, relative: bool = False) -> float:  # mean error (s, or over kernel time) of each run left out
        errs = []
        for i in range(len(u)):
            c0, c1 = fit_one([j for j in range(len(u)) if j != i])
            errs.append(abs(c0 + c1 * kernel_s[i] - u[i]) / (kernel_s[i] if relative else 1.0))
        return float(np.mean(errs))

    def mean(idx: list[int]) -> tuple[float, float]:
        return _robust_mean([u[i] for i in idx]), 0.0

    if loo(mean, relative=True) <= OVERHEAD_FLOOR:
        return const
    return solve(list(range(len(u)))) if loo(solve) < CURVE_MARGIN * loo(mean) else const


def _rescaled(scale: dict[str, float], records: list[RunRecord], scens: list[Scenario], cal: Calibration,
              fixed: set[str]) -> dict[str, float]:
    """``scale`` times, per key (not in ``fixed``: fitted on clean runs), the robust ratio of the
    runs' measured time to the time the twin gives under ``cal``."""
    ratios: dict[str, list[tuple[float, float]]] = {}
    for r, s in zip(records, scens):
        model = _by_key(simulate(s, calibration=cal))
        measured = {**profiled_times(r), **_profiled_kinds(r)}
        for key, t in model.items():
            if t > 0 and measured.get(key, 0.0) > 0:
                ratios.setdefault(key, []).append((measured[key], t))
    out = dict(scale)
    for key, factor in _scales(ratios).items():
        if key not in fixed and key in out:
            out[key] = out[key] * factor
    return out


ALPHA_BETA_ROUNDS = 16  # at most this many refits of the collectives (and the scales) against the DES
ALPHA_BETA_TOL = 1e-3  # ... until no α, β or multiplier moves by more than this (relative)


def _converged(a, b) -> bool:
    (ab0, cs0), (ab1, cs1) = a, b
    pairs = [(ab0[k][f], ab1[k][f]) for k in ab1 if k in ab0 for f in ab1[k]] + [(cs0[k], cs1[k]) for k in cs1 if k in cs0]
    return len(pairs) == sum(len(v) for v in ab1.values()) + len(cs1) and all(
        abs(y - x) <= ALPHA_BETA_TOL * abs(x) for x, y in pairs)


def _robust_mean(xs: list[float]) -> float:
    """The mean of ``xs`` for up to two values, their median from three on (one bad run cannot pull it)."""
    import statistics

    return statistics.median(xs) if len(xs) >= 3 else statistics.fmean(xs)


def _residuals(r: RunRecord, result: SimResult) -> dict[str, float]:
    """The run's relative errors after the fit: the step, each op class it profiled, each mesh axis."""
    out = {"step": round((result.step_time_s - r.step_time_s) / r.step_time_s, 6)}
    for cls, m in (profiled_times(r) if r.op_class_time_s else {}).items():
        if m > 0 and cls != "other":
            out[f"class:{cls}"] = round((result.compute_s_by_op_class.get(cls, 0.0) - m) / m, 6)
    for axis, m in r.comm_s_by_axis.items():
        if m > 0 and axis != "world":
            out[f"axis:{axis}"] = round((result.comm_s_by_axis.get(axis, 0.0) - m) / m, 6)
    return out


# ---- collectives: alpha/beta per tier and kind --------------------------------------------------------
def comm_terms(s: Scenario) -> dict[str, dict[str, tuple[int, float, float]]]:
    """One step's collectives in the twin's graph (uncalibrated) of ``s``: per mesh axis, per
    ``tier/kind``, (calls, message bytes, modelled seconds)."""
    from twin.workload import Hardware, build_graph

    out: dict[str, dict[str, tuple[int, float, float]]] = {}
    for op in build_graph(s, Hardware.of(s)).ops:
        if op.stream.startswith("comm.") and op.link:
            n, b, t = out.setdefault(op.axis, {}).get(f"{op.link}/{op.op_class}", (0, 0.0, 0.0))
            out[op.axis][f"{op.link}/{op.op_class}"] = (n + 1, b + op.bytes, t + op.duration_s)
    return out


def fit_collectives(records: list[RunRecord], scens: list[Scenario], first: Calibration | None = None
                    ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The collectives' cost per ``tier/kind`` from the busy time the multi-rank runs measured per
    mesh axis (``comm_s_by_axis``, rank 0's profiled steps): one equation per (run, axis), Σ over
    the axis's collectives of calls·α + bytes/β = measured (``solve_alpha_beta``) when the runs
    determine every α and β (``alpha_beta_determined``: enough runs of different layouts and
    sizes), else one multiplier per key on the model's time (``solve_scales``). Returns
    ``(alpha_beta, scales)``, one of them empty; both empty without multi-rank runs. With ``first``
    (a fit of these), each target is divided by how far the twin's simulated busy time of that
    axis exceeds the plain sum under ``first`` (collectives sharing a link stretch each other in
    the DES)."""
    rows = []  # (terms {key: (calls, bytes, modelled s)}, measured s)
    for r, s in zip(records, scens):
        if not r.comm_s_by_axis:
            continue
        terms = comm_terms(s)
        stretched = simulate(s, calibration=first).comm_s_by_axis if first is not None else {}
        for axis, measured in r.comm_s_by_axis.items():
            if axis == "world" or measured <= 0 or axis not in terms:
                continue
            if first is not None:
                plain = sum(_cost(first, k, n, b, t) for k, (n, b, t) in terms[axis].items())
                if plain > 0 and stretched.get(axis, 0.0) > 0:
                    measured = measured * plain / stretched[axis]
            rows.append((terms[axis], measured))
    if not rows:
        return {}, {}
    equations = [({k: (n, b) for k, (n, b, _) in terms.items()}, m) for terms, m in rows]
    if alpha_beta_determined(equations):
        prior = [({k: (n, b) for k, (n, b, _) in terms.items()}, sum(t for *_, t in terms.values())) for terms, _ in rows]
        return solve_alpha_beta(equations, prior), {}
    return {}, solve_scales([({k: t for k, (_, _, t) in terms.items()}, m) for terms, m in rows])


def _cost(cal: Calibration, key: str, calls: int, nbytes: float, modelled: float) -> float:
    """A key's collectives' seconds under ``cal`` without the DES (its α/β, or its scale on the model)."""
    ab = cal.collective_alpha_beta.get(key)
    return calls * ab["alpha_s"] + nbytes / ab["beta_Bps"] if ab else modelled * cal.collective_scale.get(key, 1.0)


def solve_alpha_beta(equations: list[tuple[dict[str, tuple[int, float]], float]],
                     prior: list[tuple[dict[str, tuple[int, float]], float]] | None = None, *,
                     ridge: float = 1e-6, robust: float = 0.1, rounds: int = 30) -> dict[str, dict[str, float]]:
    """α (seconds a call) and β (bytes/s) per key from equations Σ_k calls_k·α_k + bytes_k/β_k =
    seconds (``robust_solve``). Directions the equations do not determine stay near ``prior``
    (the same equations against the uncalibrated model's seconds, solved alike)."""
    import numpy as np

    keys = sorted({k for terms, _ in equations for k in terms})
    A, y = _alpha_beta_system(equations, keys)
    x0 = np.zeros(2 * len(keys))
    if prior:
        Ap, yp = _alpha_beta_system(prior, keys)
        x0 = np.clip(np.linalg.lstsq(Ap / yp[:, None], np.ones(len(yp)), rcond=None)[0], 0, None)
    x = robust_solve(A, y, x0, ridge=ridge, robust=robust, rounds=rounds)
    return {k: {"alpha_s": max(float(x[2 * i]), 1e-9), "beta_Bps": 1.0 / max(float(x[2 * i + 1]), 1e-15)}
            for i, k in enumerate(keys)}  # fmt: skip


def _alpha_beta_system(eqs, keys):
    import numpy as np

    col = {k: i for i, k in enumerate(keys)}
    A = np.zeros((len(eqs), 2 * len(keys)))
    y = np.array([t for _, t in eqs], dtype=float)
    for i, (terms, _) in enumerate(eqs):
        for k, (n, b) in terms.items():
            A[i, 2 * col[k]], A[i, 2 * col[k] + 1] = n, b
    return A, y


def alpha_beta_determined(equations: list[tuple[dict[str, tuple[int, float]], float]]) -> bool:
    """Whether the equations determine every α and β: more equations than unknowns, full rank."""
    import numpy as np

    keys = sorted({k for terms, _ in equations for k in terms})
    A, y = _alpha_beta_system(equations, keys)
    if len(y) <= A.shape[1]:
        return False
    Aw = A / y[:, None]
    return int(np.linalg.matrix_rank(Aw / np.maximum(np.abs(Aw).max(axis=0), 1e-300))) == A.shape[1]


def solve_scales(equations: list[tuple[dict[str, float], float]], *, ridge: float = 1e-3,
                 robust: float = 0.1, rounds: int = 30) -> dict[str, float]:
    """One multiplier per key on the model's seconds from equations Σ_k s_k·modelled_k = seconds
    (``robust_solve``; what the equations do not determine stays near 1)."""
    import numpy as np

    keys = sorted({k for terms, _ in equations for k in terms})
    A = np.array([[terms.get(k, 0.0) for k in keys] for terms, _ in equations], dtype=float)
    y = np.array([t for _, t in equations], dtype=float)
    x = robust_solve(A, y, np.ones(len(keys)), ridge=ridge, robust=robust, rounds=rounds)
    return {k: max(float(v), 1e-6) for k, v in zip(keys, x)}


def robust_solve(A, y, x0, *, ridge: float, robust: float, rounds: int):
    """``x >= 0`` minimising Σ_i w_i (A_i·x - y_i)² + ridge·|(x - x0)/scale|²: each equation in
    relative terms (weighted by 1/y_i), iteratively reweighted with Cauchy weights of scale
    ``robust`` (an equation off by several times that counts for little: one bad run cannot pull
    the fit); each unknown in units of what would explain a typical equation alone, so that the
    small ridge only holds what the equations do not determine."""
    import numpy as np

    typical = np.array([np.median(c[c > 0]) if (c > 0).any() else 1.0 for c in A.T])
    scale = np.median(y) / typical
    w, x = 1.0 / y, np.asarray(x0, dtype=float).copy()
    reg = np.sqrt(ridge) * np.eye(len(x))
    for _ in range(rounds):
        Aw, yw = (A * w[:, None]) * scale, y * w
        sol = np.linalg.lstsq(np.vstack([Aw, reg]), np.concatenate([yw, reg @ (x0 / scale)]), rcond=None)[0]
        x = np.clip(sol * scale, 0, None)
        rel = np.abs(A @ x - y) / y
        w = (1.0 / y) / np.sqrt(1.0 + (rel / robust) ** 2)
    return x


def _attention_kinds(by_kernel: dict[str, float]) -> dict[str, float]:
    return {k: t for k, t in by_kernel.items() if is_attention_label(k)}


def _profiled_kinds(r: RunRecord) -> dict[str, float]:
    """Measured per-step time of each attention kind, shrunk like the classes."""
    total = sum(r.op_class_time_s.values())
    k = min(1.0, r.step_time_s / total) if total > 0 else 1.0
    return {kind: k * t for kind, t in r.kernel_time_s.items()}


def _scales(ratios: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """measured / modelled per op class, and per attention kind (forward and backward alike:
    the profiler attributes both to the kind) where the runs recorded kinds: the time-weighted
    ratio over up to two runs, the median of the runs' ratios from three on (robust to an
    outlier run)."""
    out: dict[str, float] = {}
    for key in sorted(ratios):
        pairs = ratios[key]
        ratio = (_robust_mean([m / t for m, t in pairs]) if len(pairs) >= 3
                 else sum(m for m, _ in pairs) / sum(t for _, t in pairs))  # fmt: skip
        out.update(_spread(key, ratio))
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


def compare(record: RunRecord, calibration: Calibration | None, overrides: Overrides = ()) -> Comparison:
    """The twin's prediction for the run's scenario on the hardware it ran on, with the execution it
    ran (``as_measured``), beside what it measured."""
    result = simulate(as_measured(record, overrides), calibration=calibration)
    return Comparison(record, result, calibration is not None)
