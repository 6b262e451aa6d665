"""PNG plots of a simulated step: where the time goes (breakdown bar) and what ran when (timeline).

Torch-free, and pyplot-free: each plot is its own ``matplotlib.figure.Figure`` on an Agg canvas,
so nothing global (backend, current figure) is touched. Files are written atomically: the PNG is
rendered in memory, written to a temp file in the target's folder, then renamed over the target;
on any failure an existing file is left as it was and no temp file remains.

Drawing cost grows with (stream, colour) groups, not with spans: each stream's spans of one
colour are one ``broken_barh`` collection, so 10,000 spans draw as fast as a hundred.
"""

from __future__ import annotations

import io
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from scenarios.files import write_bytes_atomic
from twin.engine import Span, Timeline
from twin.graph import COMPUTE_STREAM
from twin.simulate import SimResult

MS_PER_S = 1e3
DPI = 120

# Fixed colours, so one op class or collective kind looks the same in every plot.
OP_CLASS_COLORS = {
    "gemm": "#1f77b4",
    "attention": "#9467bd",
    "elementwise": "#17becf",
    "norm": "#2ca02c",
    "embedding": "#bcbd22",
    "quantize": "#8c564b",
    "optimizer": "#e377c2",
    "other": "#7f7f7f",
}
COLLECTIVE_COLORS = {
    "all_gather": "#ff7f0e",
    "reduce_scatter": "#d62728",
    "all_reduce": "#8b0000",
    "all_to_all": "#ffbb00",
    "broadcast": "#f4a582",
    "send_recv": "#b2182b",
}
AXIS_COLORS = ("#d62728", "#ff7f0e", "#ffbb00", "#8b0000", "#f4a582", "#b2182b", "#e6550d")
PHASE_COLORS = {"data": "#bbbbbb", "fwd": "#9ecae1", "bwd": "#fdae6b", "opt": "#a1d99b"}
SM_CONTENTION_COLOR = "#404040"
IDLE_COLOR = "#e0e0e0"
FALLBACK_COLOR = "#999999"


# ---- breakdown --------------------------------------------------------------------------------
def plot_breakdown(result: SimResult, path: str | os.PathLike[str]) -> Path:
    """Write ``breakdown_figure(result)`` as a PNG: the result's own numbers, nothing recomputed."""
    return save_png(breakdown_figure(result), path)


def breakdown_figure(result: SimResult) -> Figure:
    """A horizontal stacked bar of where the step goes, in ms; MFU in the title.

    Top bar (sums to the step time): compute by op class at its isolated time
    (``isolated_compute_s_by_op_class``), SM contention, each axis's split of the exposed
    communication (``exposed_comm_s_split_by_axis``), idle. Bottom bar: busy time of each
    communication axis (overlapped + exposed; the streams run concurrently, so this bar may
    differ from the step). Every number is a field of ``result``, as the tables print it.
    """
    fig = _figure(width_in=12.0, height_in=3.4 if result.comm_s_by_axis else 2.4)
    ax = fig.add_subplot()
    step_ms = result.step_time_s * MS_PER_S
    tiny_ms = step_ms * 1e-9  # float noise, not time
    rows = [(name, [seg for seg in segs if seg[1] > tiny_ms]) for name, segs in _bars(result)]
    rows = [(name, segs) for name, segs in rows if segs or name == "step"]
    handles = []
    for y, (_, segments) in enumerate(rows):
        left = 0.0
        for label, ms, color, hatch in segments:
            ax.barh(y, ms, left=left, height=0.6, color=color, hatch=hatch, label=label,
                    edgecolor="white", linewidth=0.5)  # fmt: skip
            if ms >= 0.05 * max(step_ms, 1e-12):
                ax.text(left + ms / 2, y, _ms_label(ms), ha="center", va="center",
                        fontsize=8, color=_text_color(color))  # fmt: skip
            share = f", {ms / step_ms:.1%}" if y == 0 and step_ms > 0 else ""
            handles.append(Patch(facecolor=color, hatch=hatch, edgecolor="white",
                                 label=f"{label}: {ms:,.1f} ms{share}"))  # fmt: skip
            left += ms
    ax.axvline(step_ms, color="black", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)  # step on top
    ax.set_xlabel("ms")
    fig.supxlabel("op classes at their isolated time (SM contention is its own segment); exposed "
                  "comm per axis: its split of the exposed time, as in the communication table's "
                  "split column", fontsize=7, color="#555555")  # fmt: skip
    comm_ms = sum(ms for _, ms, _, _ in rows[-1][1]) if len(rows) > 1 else 0.0
    ax.set_xlim(0, max(step_ms, comm_ms) * 1.02 or 1.0)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              frameon=False)  # fmt: skip
    straggler_ms = result.straggler_s * MS_PER_S
    straggler = f" (straggler {straggler_ms:,.1f} ms)" if straggler_ms > tiny_ms else ""
    ax.set_title(
        f"{result.scenario}: {result.num_gpus:,} × {result.gpu} on {result.network} — "
        f"step {step_ms:,.1f} ms{straggler}, MFU {result.mfu:.1%} of {result.mfu_peak}",
        fontsize=10,
    )
    return fig


Segment = tuple[str, float, str, str]  # (label, ms, colour, hatch)


def _bars(result: SimResult) -> list[tuple[str, list[Segment]]]:
    """[(row name, segments)]: the step bar and the comm-busy bar, in ms, from ``result``."""
    b = result.breakdown_s
    axis_colors = {a: AXIS_COLORS[i % len(AXIS_COLORS)] for i, a in enumerate(result.comm_s_by_axis)}
    step: list[Segment] = [
        (op_class, s * MS_PER_S, _class_color(op_class), "")
        for op_class, s in _desc(result.isolated_compute_s_by_op_class)
    ]
    step.append(("sm_contention", b.get("sm_contention", 0.0) * MS_PER_S, SM_CONTENTION_COLOR, ""))
    step += [(f"exposed {axis}", s * MS_PER_S, axis_colors.get(axis, FALLBACK_COLOR), "//")
             for axis, s in _desc(result.exposed_comm_s_split_by_axis)]  # fmt: skip
    step.append(("idle", b.get("idle", 0.0) * MS_PER_S, IDLE_COLOR, ""))
    comm = [(f"{axis} busy", s * MS_PER_S, axis_colors[axis], "")
            for axis, s in _desc(result.comm_s_by_axis)]  # fmt: skip
    return [("step", step), ("comm busy\nby axis", comm)]


def _desc(d: Mapping[str, float]) -> list[tuple[str, float]]:
    return sorted(d.items(), key=lambda kv: -kv[1])


# ---- timeline ---------------------------------------------------------------------------------
def plot_timeline(timeline: Timeline, path: str | os.PathLike[str], *, title: str = "") -> Path:
    """Write ``timeline_figure(timeline, title=title)`` as a PNG."""
    return save_png(timeline_figure(timeline, title=title), path)


def timeline_figure(timeline: Timeline, *, title: str = "") -> Figure:
    """One row per stream (compute first, then comm.<axis> in order of first use), spans as boxes
    coloured by op class (compute) or collective kind (comm), phases shaded; x in ms.
    """
    streams = _stream_order(timeline.spans)
    fig = _figure(width_in=14.0, height_in=1.6 + 0.45 * max(len(streams), 1))
    ax = fig.add_subplot()
    step_ms = timeline.step_time_s * MS_PER_S
    min_width_ms = step_ms / 2500  # about one pixel: a span never vanishes
    phase_handles = _shade_phases(ax, timeline.spans, step_ms)

    # Spans under a pixel are widened to one, but drawn beneath the others (and, among widened
    # ones, the class with more time on top): an isolated short collective stays visible, while a
    # short kernel between long ones does not cover them.
    row_of = {stream: row for row, stream in enumerate(streams)}
    groups: dict[tuple[bool, int, str], list[tuple[float, float]]] = defaultdict(list)
    class_ms: dict[str, float] = defaultdict(float)
    for s in timeline.spans:
        class_ms[s.op_class] += s.duration_s * MS_PER_S
        width_ms = s.duration_s * MS_PER_S
        widened = width_ms < min_width_ms
        key = (not widened, row_of[s.stream], s.op_class)
        groups[key].append((s.start_s * MS_PER_S, min_width_ms if widened else width_ms))
    used: dict[str, str] = {}
    def draw_order(item):
        (on_top, _, op_class), _ = item
        return on_top, class_ms[op_class]

    for (on_top, row, op_class), xranges in sorted(groups.items(), key=draw_order):
        color = _span_color(streams[row], op_class)
        ax.broken_barh(xranges, (row - 0.38, 0.76), facecolors=color, linewidth=0,
                       zorder=2 if on_top else 1)  # fmt: skip
        used.setdefault(op_class, color)

    compute_keys = [k for k in OP_CLASS_COLORS if k in used]
    comm_keys = [k for k in COLLECTIVE_COLORS if k in used]
    other_keys = sorted(set(used) - set(compute_keys) - set(comm_keys))
    handles = [Patch(facecolor=used[k], label=k) for k in compute_keys + comm_keys + other_keys]
    ax.legend(handles=handles + phase_handles, loc="upper left", bbox_to_anchor=(1.005, 1.0),
              fontsize=7, frameon=False)  # fmt: skip
    ax.set_yticks(range(len(streams)), streams)
    ax.set_ylim(max(len(streams), 1) - 0.5, -0.5)  # compute on top
    ax.set_xlim(0, step_ms * 1.005 or 1.0)
    ax.set_xlabel("ms")
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    ax.set_axisbelow(True)
    head = f"{title} — " if title else ""
    ax.set_title(f"{head}step {step_ms:,.1f} ms, {len(timeline.spans):,} spans", fontsize=10)
    if not timeline.spans:
        ax.text(0.5, 0.5, "no spans", transform=ax.transAxes, ha="center", va="center")
    return fig


def _stream_order(spans: Iterable[Span]) -> list[str]:
    seen = list(dict.fromkeys(s.stream for s in spans))
    return sorted(seen, key=lambda k: k != COMPUTE_STREAM)  # stable: compute first


def _shade_phases(ax, spans: tuple[Span, ...], step_ms: float) -> list[Patch]:
    """Shade each run of consecutive compute spans of one phase; label runs wide enough."""
    runs: list[list] = []  # [phase, start_ms, end_ms]
    for s in sorted((s for s in spans if s.is_compute), key=lambda s: s.start_s):
        if runs and runs[-1][0] == s.phase:
            runs[-1][2] = s.end_s * MS_PER_S
        else:
            runs.append([s.phase, s.start_s * MS_PER_S, s.end_s * MS_PER_S])
    for phase, start_ms, end_ms in runs:
        color = PHASE_COLORS.get(phase, FALLBACK_COLOR)
        ax.axvspan(start_ms, end_ms, color=color, alpha=0.25, linewidth=0, zorder=0)
    wide = [(p, a, b) for p, a, b in runs if b - a >= 0.04 * step_ms]  # labels that fit
    top = ax.secondary_xaxis("top")
    top.set_xticks([(a + b) / 2 for _, a, b in wide], [p for p, _, _ in wide], fontsize=8)
    top.tick_params(length=0)
    phases = dict.fromkeys(phase for phase, _, _ in runs)
    return [Patch(facecolor=PHASE_COLORS.get(p, FALLBACK_COLOR), alpha=0.4, label=f"phase {p}")
            for p in phases]  # fmt: skip


def _span_color(stream: str, op_class: str) -> str:
    if stream == COMPUTE_STREAM:
        return _class_color(op_class)
    return COLLECTIVE_COLORS.get(op_class, FALLBACK_COLOR)


def _class_color(op_class: str) -> str:
    return OP_CLASS_COLORS.get(op_class, FALLBACK_COLOR)


def _ms_label(ms: float) -> str:
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2f}"


def _text_color(hex_color: str) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "white"


# ---- files ------------------------------------------------------------------------------------
def _figure(*, width_in: float, height_in: float) -> Figure:
    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Render ``fig`` to PNG bytes in memory, then write them atomically to ``path``."""
    if Path(path).is_dir():  # before rendering: fail fast
        raise ValueError(f"plot path {path} is a folder; give a file name such as plot.png")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return write_bytes_atomic(path, buf.getvalue())
