"""One static HTML page for a simulated step: no server, no external assets.

    write_report(Path("result.json"), Path("report.html"))   # result from `gemtwin simulate --out`

The page has the summary (step time, samples/s, MFU and its peak, straggler, memory fit), the
breakdown, communication per mesh axis, memory per rank, rank classes, the breakdown and timeline
PNGs embedded as base64 data URIs, and a Chrome/Perfetto trace written next to the page.

The result JSON has no timeline, so the scenario is simulated again: ``scenario`` (a bundled name
or a YAML path, plus ``sets``) or, by default, the result's own ``scenario`` name. If that run
does not reproduce the result's step time (the result was made with ``--set`` or a calibration),
the page says so; the numbers in the tables are always the result JSON's.
"""

from __future__ import annotations

import base64
import html
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scenarios.files import write_text_atomic

REPRODUCE_RTOL = 1e-6

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.25em .8em;border-bottom:1px solid #eee;
text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}th{background:#f4f4f4}
.summary td:first-child{color:#555}.fits{color:#17632a;font-weight:600}.nofit{color:#b00;font-weight:600}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.5em 1em}
img{max-width:100%;border:1px solid #eee}code{background:#f4f4f4;padding:0 .3em}
.muted{color:#777;font-size:.9em}
"""


def write_report(
    result_json: str | os.PathLike[str],
    out_html: str | os.PathLike[str],
    *,
    scenario: str | None = None,
    sets: Sequence[str] = (),
    calibration: str | os.PathLike[str] | None = None,
    plots_dir: str | os.PathLike[str] | None = None,
    trace: bool = True,
) -> Path:
    """Write the page for ``result_json`` to ``out_html`` (atomically); return its path.

    ``plots_dir``: also keep the two PNGs there (they are embedded either way). ``trace``: write
    ``<page>.trace.json`` next to the page for ui.perfetto.dev. Raises ``ValueError`` (one line)
    for a missing or unreadable result, and ``ScenarioError`` for a scenario that does not load.
    """
    result_path, out = Path(result_json), Path(out_html)
    if out.exists() and out.is_dir():
        raise ValueError(f"report path {out} is a folder; give a file name such as report.html")
    result = _read_result(result_path)
    ref = scenario or result.get("scenario", "")
    sim, timeline, notes = _resimulate(result, ref, sets, calibration,
                                       trace_path=_trace_path(out) if trace else None)  # fmt: skip
    images = _images(result, sim, timeline, plots_dir)
    if sim is None:
        notes.append("no timeline or trace: the scenario could not be simulated again "
                     f"({ref!r}); pass the scenario with --scenario PATH")  # fmt: skip
    page = render(result, images=images, notes=notes,
                  trace_name=_trace_path(out).name if trace and sim is not None else None,
                  source=result_path.name)  # fmt: skip
    return write_text_atomic(out, page)


def _trace_path(out: Path) -> Path:
    return out.with_name(out.stem + ".trace.json")


def _read_result(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"result {path} not found; write one with "
                                "gemtwin simulate SCENARIO --out result.json")  # fmt: skip
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not JSON ({e}); give a result from gemtwin simulate --out") from None
    need = ("scenario", "step_time_s", "samples_per_s", "mfu", "breakdown_s")
    if not isinstance(data, dict) or any(k not in data for k in need):
        raise ValueError(f"{path} is not a simulate result (needs {', '.join(need)}); "
                         "write one with gemtwin simulate SCENARIO --out result.json")  # fmt: skip
    return data


def _resimulate(result: dict, ref: str, sets, calibration, *, trace_path: Path | None):
    """(SimResult, slowest-class timeline, notes) from simulating ``ref`` again; (None, None,
    notes) when a bundled name is not found and no scenario was given."""
    import scenarios
    from twin.simulate import simulate_timelines

    notes: list[str] = []
    try:
        s = scenarios.load(ref, list(sets))
    except scenarios.ScenarioError as e:
        if "not found" in str(e):
            return None, None, notes
        raise
    cal = None
    if calibration is not None:
        from hwmodels.calibration import load_calibration

        cal = load_calibration(calibration)
    sim, timeline = simulate_timelines(s, calibration=cal, trace=trace_path)
    want = float(result["step_time_s"])
    if abs(sim.step_time_s - want) > REPRODUCE_RTOL * max(abs(want), 1e-12):
        why = " (it was made with a calibration: pass --calibration)" if result.get("calibration") \
            and calibration is None else " (made with --set, a calibration or another version?)"
        notes.append(f"the images and trace come from simulating {ref!r} again, which gives a "
                     f"{sim.step_time_s * 1e3:.3f} ms step, not the result's {want * 1e3:.3f} ms"
                     f"{why}; the tables show the result file")  # fmt: skip
    return sim, timeline, notes


def _images(result: dict, sim, timeline, plots_dir) -> list[tuple[str, str, bytes]]:
    """[(title, file name, PNG bytes)]: breakdown (the result's own numbers when they load as a
    SimResult, else the re-simulated ones) and timeline (needs the re-simulation)."""
    from twin.plots import plot_breakdown, plot_timeline
    from twin.simulate import SimResult

    try:
        shown = SimResult.model_validate(result)
    except ValueError:  # another version's fields: draw the re-simulated result
        shown = sim
    name = result["scenario"]
    out: list[tuple[str, str, bytes]] = []
    with tempfile.TemporaryDirectory(prefix="gemtwin-report-") as tmp:
        folder = Path(plots_dir) if plots_dir is not None else Path(tmp)
        if shown is not None:
            p = plot_breakdown(shown, folder / f"{name}-breakdown.png",
                               timeline=timeline if shown is sim else None)  # fmt: skip
            out.append(("Where the step goes", p.name, p.read_bytes()))
        if timeline is not None:
            p = plot_timeline(timeline, folder / f"{name}-timeline.png",
                              title=f"{name}: slowest rank class")  # fmt: skip
            out.append(("Timeline of the slowest rank class", p.name, p.read_bytes()))
    return out


# ---- HTML -----------------------------------------------------------------------------------
def render(result: dict, *, images: Sequence[tuple[str, str, bytes]] = (), notes: Sequence[str] = (),
           trace_name: str | None = None, source: str = "") -> str:
    """The page as a string (no I/O)."""
    r = result
    step = float(r["step_time_s"])
    e = html.escape
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>gemtwin report: {e(str(r['scenario']))}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{e(str(r['scenario']))}</h1>",
        f'<p class="muted">{r.get("num_gpus", "?"):,} × {e(str(r.get("gpu", "?")))} on '
        f"{e(str(r.get('network', '?')))} · from {e(source)}</p>",
    ]
    parts += [f'<p class="note">{e(n)}</p>' for n in notes]
    fits = bool(r.get("memory_fits", True))
    mem = (f'<span class="{"fits" if fits else "nofit"}">{"fits" if fits else "DOES NOT FIT"}</span>'
           f" — {_gb(r.get('memory_total_bytes', 0))} of {_gb(r.get('memory_capacity_bytes', 0))}"
           f" per rank")  # fmt: skip
    summary = [
        ("step time", f"{step * 1e3:,.3f} ms"),
        ("samples/s", f"{float(r['samples_per_s']):,.0f}"),
        ("MFU", f"{float(r['mfu']):.1%} of {e(str(r.get('mfu_peak', '')))} "
                f"({_si(float(r.get('mfu_peak_flops', 0)), 'FLOP/s')})"),
        ("model FLOPs / step", _si(float(r.get("model_flops_per_step", 0)), "FLOP")),
        ("straggler", f"{float(r.get('straggler_s', 0)) * 1e3:,.3f} ms over a balanced step of "
                      f"{float(r.get('balanced_step_time_s', step)) * 1e3:,.3f} ms"),
        ("memory", mem),
    ]
    if r.get("calibration"):
        summary.append(("calibration", e(str(r["calibration"]))))
    parts.append('<h2>Summary</h2><table class="summary" id="summary">')
    parts += [f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in summary]
    parts.append("</table>")
    if r.get("memory_message"):
        parts.append(f'<p class="muted">{e(str(r["memory_message"]))}</p>')

    parts.append(_table("Breakdown (slowest rank class)", ("where the step goes", "ms", "share"),
                        [(k, _ms(v), f"{v / step:.1%}" if step else "") for k, v in
                         r.get("breakdown_s", {}).items()], id_="breakdown"))  # fmt: skip
    parts.append(_table("Compute by op class", ("op class", "ms"),
                        [(k, _ms(v)) for k, v in _desc(r.get("compute_s_by_op_class", {}))]))
    comm = r.get("comm_s_by_axis", {})
    if comm:
        exp = r.get("exposed_comm_s_by_axis", {})
        parts.append(_table("Communication per mesh axis", ("axis", "busy ms", "exposed ms"),
                            [(k, _ms(v), _ms(exp.get(k, 0.0))) for k, v in _desc(comm)],
                            id_="comm"))  # fmt: skip
    parts.append(_table("Memory per rank (peak)", ("category", "GB"),
                        [(k, f"{v / 1e9:,.2f}") for k, v in _desc(r.get("memory_bytes", {})) if v > 0]
                        + [("total", _gb(r.get("memory_total_bytes", 0)))], id_="memory"))  # fmt: skip
    classes = r.get("rank_classes", [])
    if classes:
        parts.append(_table("Rank classes (by sequence load)",
                            ("ranks", "share", "load vs mean", "waiting ms"),
                            [(c["name"], f"{c['weight']:.0%}", f"{c['load']:.3f}", _ms(c["wait_s"]))
                             for c in classes], id_="ranks"))  # fmt: skip
    for title, name, png in images:
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<h2>{e(title)}</h2>"
                     f'<img alt="{e(title)}" title="{e(name)}" src="data:image/png;base64,{data}">')
    parts.append("<h2>Trace</h2>")
    if trace_name:
        parts.append(
            f'<p>The step as a trace, one process per rank class: <a href="{e(trace_name)}" '
            f'download><code>{e(trace_name)}</code></a> (next to this page). Open '
            '<a href="https://ui.perfetto.dev">ui.perfetto.dev</a>, choose <em>Open trace '
            "file</em> and pick it (or drag it onto the page); <code>chrome://tracing</code> "
            "also reads it.</p>"
        )
    else:
        parts.append("<p>No trace: write one with <code>gemtwin simulate SCENARIO --trace "
                     "step.trace.json</code> and open it in "
                     '<a href="https://ui.perfetto.dev">ui.perfetto.dev</a>.</p>')  # fmt: skip
    parts.append('<p class="muted">Made by gemtwin; a static page, nothing loads from the '
                 "network.</p></body></html>")  # fmt: skip
    return "\n".join(parts) + "\n"


def _table(title: str, head: Sequence[str], rows, *, id_: str = "") -> str:
    e = html.escape
    ident = f' id="{id_}"' if id_ else ""
    out = [f"<h2>{e(title)}</h2><table{ident}><tr>" + "".join(f"<th>{e(h)}</th>" for h in head)
           + "</tr>"]  # fmt: skip
    for row in rows:
        cells = "".join(f"<td>{e(str(row[0]))}</td>" if i == 0 else f'<td class="num">{e(str(c))}</td>'
                        for i, c in enumerate(row))  # fmt: skip
        out.append(f"<tr>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def _desc(d: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(d.items(), key=lambda kv: -kv[1])


def _ms(x: float) -> str:
    return f"{x * 1e3:,.3f}"


def _gb(x: float) -> str:
    return f"{float(x) / 1e9:,.1f} GB"


def _si(x: float, unit: str) -> str:
    for div, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"
