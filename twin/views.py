"""A SimResult as tables of text: what the terminal (``twin.report``) and the HTML page
(``twin.html_report``) both print, so the two cannot disagree.

Every number comes from a SimResult field; nothing is recomputed from a timeline. Where two
numbers measure different things (compute as run vs. without SM contention, exposed time per
axis vs. its split of the step), the column names and the caption say so, and totals are shown
where a column is meant to add up.
"""

from __future__ import annotations

from dataclasses import dataclass

from twin.simulate import SimResult

# The breakdown parts that add up to the step (overlapped_comm runs under compute).
STEP_PARTS = ("compute", "sm_contention", "exposed_comm", "idle")


@dataclass(frozen=True)
class View:
    """One table: ``rows`` then ``totals`` (set apart), each a tuple of cells matching ``head``
    (no header when ``head`` is empty); ``caption`` explains what does or does not add up."""

    id: str
    title: str
    head: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    totals: tuple[tuple[str, ...], ...] = ()
    caption: str = ""


def result_views(r: SimResult) -> list[View]:
    views = [summary_view(r), breakdown_view(r), compute_view(r)]
    if r.comm_s_by_axis:
        views.append(comm_view(r))
    views.append(memory_view(r))
    if r.goodput is not None:
        views.append(goodput_view(r))
    if len(r.rank_classes) > 1:
        views.append(ranks_view(r))
    return views


def ms(x: float) -> str:
    return f"{x * 1e3:,.3f}"


def si(x: float, unit: str) -> str:
    for div, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"


def memory_fit(r: SimResult) -> str:
    return (f"{r.memory_total_bytes / 1e9:.2f} of {r.memory_capacity_bytes / 1e9:.0f} GB per rank: "
            + ("fits" if r.memory_fits else "DOES NOT FIT"))  # fmt: skip


def summary_view(r: SimResult) -> View:
    rows = [
        ("step time", f"{ms(r.step_time_s)} ms"),
        ("samples/s", f"{r.samples_per_s:,.0f}"),
        ("model FLOPs / step", si(r.model_flops_per_step, "FLOP")),
        ("MFU", f"{r.mfu:.1%} of {r.mfu_peak} ({si(r.mfu_peak_flops, 'FLOP/s')})"),
    ]
    if len(r.rank_classes) > 1:
        rows.append(("straggler cost", f"{ms(r.straggler_s)} ms over a balanced step "
                     f"({ms(r.balanced_step_time_s)} ms)"))  # fmt: skip
    rows.append(("memory", memory_fit(r)))
    rows += execution_rows(r)
    if r.calibration:
        rows.append(("calibration", r.calibration))
    title = f"{r.scenario}: {r.num_gpus:,} × {r.gpu} on {r.network}"
    return View("summary", title, (), tuple(rows))


def execution_rows(r: SimResult) -> list[tuple[str, str]]:
    """The host's bound and the execution choices that differ from the curves': priced, or not
    (none for a scenario at its defaults on a GPU whose curves are the default executor's)."""
    rows = []
    if r.host_s > 0:
        bound = "bounds the step" if r.host_s >= r.step_time_s * (1 - 1e-9) else "below the device's step"
        rows.append(("host time", f"{ms(r.host_s)} ms to issue the step without CUDA graphs: {bound}"))
    for label, items in (("execution priced", r.execution_priced), ("NOT priced", r.execution_not_priced)):
        rows += [(label if i == 0 else "", c) for i, c in enumerate(items)]
    return rows


def breakdown_view(r: SimResult) -> View:
    b, step = r.breakdown_s, r.step_time_s

    def row(name: str, v: float) -> tuple[str, str, str]:
        return name, ms(v), f"{v / step:.1%}" if step else ""

    totals = [row("step time", sum(b.get(k, 0.0) for k in STEP_PARTS))]
    if "overlapped_comm" in b:
        totals.append(row("overlapped_comm (not in the sum)", b["overlapped_comm"]))
    return View(
        "breakdown", "breakdown (slowest rank class)", ("where the step goes", "ms", "share"),
        tuple(row(k, b.get(k, 0.0)) for k in STEP_PARTS), tuple(totals),
        caption="compute + sm_contention + exposed_comm + idle = step time; overlapped_comm "
        "is communication hidden under compute, so it is not added.",
    )  # fmt: skip


def compute_view(r: SimResult) -> View:
    as_run, alone = r.compute_s_by_op_class, r.isolated_compute_s_by_op_class
    order = sorted(as_run, key=lambda k: -as_run[k])
    slowed = {k: max(0.0, as_run[k] - alone.get(k, 0.0)) for k in order}
    rows = tuple((k, ms(alone.get(k, 0.0)), ms(slowed[k]), ms(as_run[k])) for k in order)
    total = ("all op classes", ms(sum(alone.values())), ms(sum(slowed.values())),
             ms(sum(as_run.values())))  # fmt: skip
    return View(
        "compute", "compute by op class", ("op class", "isolated ms", "SM contention ms",
                                           "as run ms"), rows, (total,),
        caption="isolated: the kernels alone; as run: slowed where SM-based collectives ran "
        "beside them (what a profiler measures). The breakdown's compute is the isolated total, "
        "its sm_contention the difference.",
    )  # fmt: skip


def comm_view(r: SimResult) -> View:
    busy, exposed, split = r.comm_s_by_axis, r.exposed_comm_s_by_axis, r.exposed_comm_s_split_by_axis
    order = sorted(busy, key=lambda k: -busy[k])
    rows = tuple((k, ms(busy[k]), ms(exposed.get(k, 0.0)), ms(split.get(k, 0.0))) for k in order)
    total = ("all axes", ms(sum(busy.values())), "", ms(sum(split.values())))
    return View(
        "comm", "communication", ("mesh axis", "busy ms", "exposed ms", "split exposed ms"),
        rows, (total,),
        caption=f"exposed: busy while compute waits, counted for every axis exposed at that "
        f"time, so the column adds up to {ms(sum(exposed.values()))} ms, more than exposed_comm "
        f"({ms(r.breakdown_s.get('exposed_comm', 0.0))} ms). split exposed: time that several axes "
        "are exposed together shared evenly between them, so it adds up to exposed_comm (the "
        "breakdown plot draws it). busy: hidden or not; axes run at once.",
    )  # fmt: skip


def memory_view(r: SimResult) -> View:
    rows = tuple((k, f"{v / 1e9:.2f}") for k, v in sorted(r.memory_bytes.items(), key=lambda kv: -kv[1])
                 if v > 0)  # fmt: skip
    return View("memory", "memory (peak, one rank)", ("memory per rank", "GB"), rows,
                (("total", memory_fit(r)),))  # fmt: skip


def _dur(x: float | None) -> str:
    if x is None:
        return "none"
    return f"{x / 3600:.2f} h" if x >= 3600 else f"{x:,.1f} s"


def goodput_view(r: SimResult) -> View:
    """Checkpoint cost and failures (``twin.goodput``): what is left of the step's throughput."""
    g = r.goodput
    every = "" if g.interval_steps is None else f"{g.interval_steps:,} steps = {_dur(g.interval_s)}"
    optimal = "" if g.optimal_interval_steps is None else f"{g.optimal_interval_steps:,} steps = {_dur(g.optimal_interval_s)}"
    rows = (
        ("failures", f"{g.failures}: {g.failures_per_gpu_hour:.3g} per GPU-hour"),
        ("MTBF (job)", _dur(g.mtbf_s)),
        ("checkpoint", f"{g.checkpoint_bytes_total / 1e12:.3f} TB in all, {g.checkpoint_bytes_per_rank / 1e9:.2f} GB per rank"),
        ("storage", g.storage),
        ("save stall", f"{g.save_blocking_s:.3f} s ({'async: copy' if g.async_save else 'sync: copy + write'}; "
                       f"copy {g.stage_s:.3f} s, write {g.write_s:.3f} s)"),
        ("restart", f"{_dur(g.restart_s)} (checkpoint read {g.restore_s:.1f} s)"),
        ("interval used", f"{every} ({g.interval_from})" if every else "none (no failures)"),
        ("optimal interval (Young/Daly)", optimal or "none (no failures)"),
        ("goodput", f"{g.goodput:.2%}"),
        ("effective samples/s", f"{g.effective_samples_per_s:,.0f}"),
    )
    return View("goodput", "goodput (checkpoints and failures)", (), rows,
                caption="goodput = interval/(interval + stall) × (1 − (restart + (interval + stall)/2) / MTBF)")


def ranks_view(r: SimResult) -> View:
    rows = tuple((c.name, f"{c.weight:.0%}", f"{c.load:.3f}", ms(c.wait_s)) for c in r.rank_classes)
    return View("ranks", "rank classes", ("ranks (by sequence load)", "share", "load vs mean",
                                          "waiting ms"), rows)  # fmt: skip
