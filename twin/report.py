"""Terminal tables (rich) for the CLI: results, FLOP counts, calibrations, hardware."""

from __future__ import annotations

from collections import defaultdict

from rich.markup import escape
from rich.table import Table

from hwmodels.calibration import Calibration
from hwmodels.gpus import get_gpu, list_gpus
from hwmodels.network import get_network, list_networks
from scenarios.cost import Cost
from scenarios.schema import Scenario
from scenarios.vocab import KernelKind, OpClass
from twin.calibrate import profiled_times
from twin.flops import model_costs
from twin.simulate import SimResult
from twin.views import View, result_views
from twin.views import si as _si


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f}"


def result_tables(r: SimResult) -> list[Table]:
    """The result's views (``twin.views``, shared with the HTML report) as rich tables."""
    return [rich_table(v) for v in result_views(r)]


def rich_table(v: View) -> Table:
    t = Table(*(escape(h) for h in v.head), title=escape(v.title), show_header=bool(v.head),
              caption=escape(v.caption) or None, caption_justify="left")  # fmt: skip
    if not v.head:
        for _ in (v.rows or v.totals)[0]:
            t.add_column()
    for i, row in enumerate(v.rows):
        t.add_row(*map(escape, row), end_section=i == len(v.rows) - 1 and bool(v.totals))
    for row in v.totals:
        t.add_row(*map(escape, row))
    return t


def flops_table(s: Scenario) -> list:
    B = s.training.micro_batch
    costs = model_costs(s.model, batch=B, precision=s.precision)
    work: dict[str, Cost] = defaultdict(Cost)
    params: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # dense, sparse
    for c in costs:
        work[c.layer] += c.cost
        params[c.layer][0] += c.params
        params[c.layer][1] += c.sparse_params
    t = Table("layer", "fwd FLOPs", "bwd FLOPs", "HBM bytes", "dense params", "sparse params",
              title=f"{s.name}: one micro-batch of {B} samples")  # fmt: skip
    for layer, w in work.items():
        p, sp = params[layer]
        t.add_row(layer, _si(w.fwd_flops, ""), _si(w.bwd_flops, ""), _si(w.bytes, "B"), _si(p, ""), _si(sp, ""))
    total_flops = sum(c.flops for c in costs)
    emb_bytes = sum(c.cost.bytes for c in costs if c.op_class == OpClass.EMBEDDING)
    tot = Table(show_header=False, title="totals")
    tot.add_row("model FLOPs per micro-batch (fwd+bwd)", _si(total_flops, "FLOP"))
    tot.add_row("dense FLOPs per sample (fwd+bwd)", _si(total_flops / B, "FLOP"))
    tot.add_row("embedding bytes per sample (fwd+bwd)", _si(emb_bytes / B, "B"))
    tot.add_row("dense parameters", _si(sum(c.params for c in costs), ""))
    tot.add_row("sparse (embedding) parameters", _si(sum(c.sparse_params for c in costs), ""))
    tot.add_row("left out of FLOPs", "element-wise, norms, softmax, lookups (see MODEL.md)")
    return [t, tot]


def calibration_table(cal: Calibration) -> Table:
    t = Table("op class or kernel kind", "scale (measured / modelled)", title=f"calibration for {cal.gpu}")
    for k, v in cal.scale.items():
        t.add_row(k, f"{v:.4g}")
    for kind, fields in cal.efficiency.items():
        parts = ([f"fixed cost {fields['launch_s'] * 1e6:.1f} µs a call"] if "launch_s" in fields else []) + (
            [f"x_half × {fields['x_half_scale']:.3g}"] if "x_half_scale" in fields else [])
        parts += [f"{k} {v:.4g}" for k, v in fields.items() if k not in ("launch_s", "x_half_scale")]
        t.add_row(f"curve {kind}", ", ".join(parts))
    t.add_row("overhead per step", f"{_ms(cal.overhead_s)} ms")
    if cal.gap_fraction:
        t.add_row("gaps between kernels", f"{cal.gap_fraction:.2%} of the compute stream's kernel time")
    if cal.sm_contention != 1.0:
        t.add_row("slowdown of overlapped compute", f"{cal.sm_contention:.3g} × the collectives' SM shares")
    for key, ab in sorted(cal.collective_alpha_beta.items()):
        t.add_row(f"collective {key}", f"α {ab['alpha_s'] * 1e6:.1f} µs, β {_si(ab['beta_Bps'], 'B/s')}")
    for key, v in sorted(cal.collective_scale.items()):
        t.add_row(f"collective {key}", f"{v:.4g} × the model")
    t.caption = cal.notes
    if cal.residuals:
        worst = {}
        for res in cal.residuals.values():
            for k, v in res.items():
                worst[k] = max(worst.get(k, 0.0), abs(v))
        step = worst.pop("step", 0.0)
        axes = {k[5:]: v for k, v in worst.items() if k.startswith("axis:")}
        t.caption += f"; residuals after the fit: step max {step:.1%}" + (
            f", axes max {max(axes.values()):.1%} ({max(axes, key=axes.get)})" if axes else "")
    return t


def validation_table(cmp) -> Table:
    """Step time and per-op-class kernel time, measured (profiler) beside the twin's."""
    r, res = cmp.run, cmp.result
    label = "twin (calibrated)" if cmp.calibrated else "twin (uncalibrated)"
    t = Table("ms per step", "measured", label, "error", title=f"{r.scenario_name}: twin vs measured")
    t.add_row("step time", _ms(r.step_time_s), _ms(res.step_time_s), f"{cmp.error:+.1%}")
    measured = profiled_times(r)  # the profiled steps' classes, shrunk to the median step as the fit does
    classes = sorted((set(measured) | set(res.compute_s_by_op_class)) - {"other"})
    rows = [(c, measured.get(c, 0.0), res.compute_s_by_op_class.get(c, 0.0)) for c in classes]
    rows.append(("rest: other ops, host gaps, exposed comm",
                 r.step_time_s - sum(m for _, m, _ in rows), res.step_time_s - sum(p for *_, p in rows)))
    for cls, m, p in rows:
        if m == 0 and p == 0:
            continue
        t.add_row(f"  {cls}", _ms(m), _ms(p), f"{(p - m) / m:+.1%}" if m > 0 else "")
    t.caption = f"run {r.run_id} on {r.environment.device}:{r.environment.device_name}"
    if res.execution_priced:
        t.caption += f"; priced as it ran: {_choice_names(res.execution_priced)}"
    if res.execution_not_priced:
        t.caption += f"; NOT priced: {_choice_names(res.execution_not_priced)}"
    profiled = sum(r.op_class_time_s.values())
    if profiled > r.step_time_s:
        t.caption += (f"; measured classes scaled by {r.step_time_s / profiled:.3f}: the profiled steps "
                      f"ran slower ({_ms(profiled)} ms of kernels) than the median step")
    return t


def runs_validation_table(rows) -> Table:
    """One row per run (``twin.validate.RunRow``): step time measured and predicted, the worst op
    class and mesh axis (of those holding ``MIN_SHARE`` of the step), and peak memory."""
    from twin.validate import MIN_SHARE, summary

    from pathlib import Path

    folders = {str(Path(r.source).parent) for r in rows}
    shared = len(rows) > 1 and len(folders) == 1 and folders != {"."}
    label = {r.run_id: Path(r.source).name if shared else r.source for r in rows}
    t = Table("run", "scenario", "", "measured ms", "twin ms", "error", "worst op class", "worst axis (busy)",
              "memory", title="twin vs measured, per run" + (f" (in {folders.pop()}/)" if shared else ""))  # fmt: skip
    for r in rows:
        cls = max(r.class_errors(MIN_SHARE).items(), key=lambda kv: abs(kv[1]), default=None)
        axis = max(r.axis_errors(MIN_SHARE).items(), key=lambda kv: abs(kv[1]), default=None)
        mem = r.memory_error
        t.add_row(label[r.run_id], r.scenario, "held out" if r.held_out else "fit", _ms(r.measured_step_s),
                  _ms(r.twin_step_s), f"{r.error:+.1%}", f"{cls[0]} {cls[1]:+.1%}" if cls else "-",
                  f"{axis[0]} {axis[1]:+.1%}" if axis else "-", f"{mem:+.1%}" if mem is not None else "-")  # fmt: skip
    s = summary(rows)
    if s.step_mape is not None:
        t.caption = (f"{s.held_out} held-out run(s): step MAPE {s.step_mape:.1%}, max {s.step_max:.1%} "
                     f"({label.get(s.worst_run, s.worst_run)})" + (f", memory MAPE {s.memory_mape:.1%}" if s.memory_mape is not None else "")
                     + (f"; op classes' max error {', '.join(f'{c} {e:.1%}' for c, e in s.class_max.items())}"
                        if s.class_max else "") + (f"; {s.fitted} fitted on" if s.fitted else ""))  # fmt: skip
    else:
        t.caption = f"no held-out run: all {s.fitted} were fitted on (their error is the fit's, not a check)"
    return t


def comm_validation_table(cmp) -> Table | None:
    """Collective time per mesh axis, busy and exposed, measured (the profiled steps of a multi-rank
    run, ``executor.comm_profile``) beside the twin's; None for a run that measured none."""
    r, res = cmp.run, cmp.result
    if not r.comm_s_by_axis:
        return None
    t = Table("ms per step", "measured", "twin", "error", title=f"{r.scenario_name}: collectives per mesh axis")
    axes = sorted(set(r.comm_s_by_axis) | set(res.comm_s_by_axis), key=lambda a: (a == "world", a))
    for what, measured, twin in (("busy", r.comm_s_by_axis, res.comm_s_by_axis),
                                 ("exposed", r.exposed_comm_s_by_axis, res.exposed_comm_s_by_axis)):
        for axis in axes:
            m, p = measured.get(axis, 0.0), twin.get(axis, 0.0)
            if m == 0 and p == 0:
                continue
            t.add_row(f"{axis} {what}", _ms(m), _ms(p) if axis in twin or axis != "world" else "-",
                      f"{(p - m) / m:+.1%}" if m > 0 and axis != "world" else "")  # fmt: skip
    t.caption = (f"rank 0's profiled steps ({r.collective_path}); 'world': the loop's own collectives (loss, "
                 "measurements), which the twin does not model")
    return t


def _choice_names(choices: list[str]) -> str:
    """The ``execution.field=value`` part of each of a SimResult's execution choices."""
    return ", ".join(c.split(": ", 1)[0] for c in choices)


def hw_tables() -> list:
    g = Table("gpu", "bf16 dense", "fp8 dense", "HBM", "HBM bw", "SMs", title="GPUs")
    for name in list_gpus():
        s = get_gpu(name)
        fp8 = _si(s.peak_flops["fp8"], "FLOP/s") if "fp8" in s.peak_flops else "-"
        g.add_row(name, _si(s.peak("bf16"), "FLOP/s"), fp8, _si(s.hbm_bytes, "B"),
                  _si(s.hbm_bw_Bps, "B/s"), str(s.sms))  # fmt: skip
    n = Table("network", "tiers (domain GPUs, per-GPU bw)", title="network presets")
    for name in list_networks():
        p = get_network(name)
        n.add_row(name, ", ".join(f"{t.name} ({t.domain_gpus}, {_si(t.bw_per_gpu_Bps, 'B/s')})"
                                  for t in p.tiers))  # fmt: skip
    return [g, n]


def gpu_tables(name: str) -> list:
    """The GPU's catalog entry and its kernel efficiency curves."""
    from hwmodels.kernels import efficiency_table

    eff = Table("kernel kind", "dtype", "side", "eff max", "half at", "source",
                title=f"{name}: kernel efficiency curves, eff(x) = max · x / (x + half)")  # fmt: skip
    for r in efficiency_table(name):
        if r.side == "compute" and r.x_half == 0 and not KernelKind(r.kind).tensor_core:
            continue  # memory-bound kinds: the compute side is never binding
        unit = r.x_half_unit  # FLOP, B, or per sequence (FLOP/seq, B/seq) for the jagged kernels
        short = r.source.split(" (")[0].rsplit("/", 1)[-1]  # full text: hwmodels/data/efficiency.yaml
        eff.add_row(r.kind, r.dtype, r.side, f"{r.eff_max:.3f}", _si(r.x_half, unit), short)
    return [gpu_table(name), eff]


def gpu_table(name: str) -> Table:
    s = get_gpu(name)
    t = Table("field", "value", "source", title=f"{s.name}: {s.description}")
    for dtype, v in s.peak_flops.items():
        t.add_row(f"peak {dtype}", _si(v, "FLOP/s"), s.sources.get(f"peak_flops.{dtype}", ""))
    for field in ("hbm_bytes", "hbm_bw_Bps", "sms", "nvlink_bw_Bps", "tdp_w"):
        t.add_row(field, f"{getattr(s, field):,.4g}", s.sources.get(field, ""))
    return t


def topo_table(preset, n_gpus: int) -> Table:
    from twin.topo import tier_counts

    t = Table("tier", "fabric", "GPUs per domain", "domains used", "per-GPU bw", "effective bw",
              "latency/step", "oversub.", title=f"{preset.name} at {n_gpus:,} GPUs")  # fmt: skip
    for c in tier_counts(preset, n_gpus):
        t.add_row(c.name, c.fabric, f"{c.domain_gpus:,}", f"{c.domains:,}",
                  _si(c.bw_per_gpu_Bps, "B/s"), _si(c.effective_bw_Bps, "B/s"),
                  f"{c.latency_s * 1e6:.1f} µs", f"{c.oversubscription:g}")  # fmt: skip
    t.caption = preset.description
    return t


def probe_table(doc: dict, *, bundled_gpu: str = "cpu", bundled_network: str = "cpu-host") -> Table:
    """A probe profile (hwmodels/profile.py ``build_profile``) beside the bundled entries it stands in for:
    peaks and copy bandwidth against gpus.yaml's, each collective's alpha/beta against the bundled
    preset's curve at the same sizes (fitted the same way)."""
    from hwmodels.collectives import collective_cost
    from hwmodels.profile import ENTRY, fit_alpha_beta

    gpu, base, ranks = doc["gpus"][ENTRY], get_gpu(bundled_gpu), doc["measurements"]["ranks"]
    net = get_network(bundled_network)
    t = Table("quantity", "probe", f"bundled ({bundled_gpu} / {bundled_network})", "probe / bundled",
              title=f"gemtwin hw probe: {doc['measured']}")
    pairs = [(f"peak {dt} (torch.mm)", v["value"], base.peak_flops.get(dt), "FLOP/s")
             for dt, v in gpu["peak_flops"].items()]
    pairs.append(("copy bandwidth", gpu["hbm_bw_Bps"]["value"], base.hbm_bw_Bps, "B/s"))
    for kind, f in doc["fits"].items():
        sizes = [r["msg_bytes"] for r in doc["measurements"]["collectives"][kind]]
        ref = None
        if ranks <= net.max_gpus:
            ref = fit_alpha_beta([(m, collective_cost(kind=kind, msg_bytes=m, group_size=ranks, network=net).time_s)
                                  for m in sizes])
        pairs.append((f"{kind} alpha", f["alpha_s"], ref.alpha_s if ref else None, "s"))
        pairs.append((f"{kind} beta (bytes/s; fit err {f['max_rel_err']:.0%})", f["beta_Bps"],
                      ref.beta_Bps if ref else None, "B/s"))
    fmt = lambda x, unit: f"{x * 1e6:.1f} us" if unit == "s" else _si(x, unit)  # noqa: E731
    for name, v, b, unit in pairs:
        t.add_row(name, fmt(v, unit), fmt(b, unit) if b else "-", f"{v / b:.2f}" if b else "-")
    t.caption = (f"{ranks} ranks; medians; the bundled preset's alpha/beta: its curve at the probe's sizes, "
                 f"least squares as for the probe; wall {doc['measurements']['wall_s']:.1f} s")
    return t
