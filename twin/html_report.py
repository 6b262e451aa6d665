"""One static HTML page for a simulated step: no server, no external assets.

    write_report(Path("result.json"), Path("report.html"))   # result from `gemtwin simulate --out`

The page has the result's tables (``twin.views``, the same the terminal prints), the breakdown
PNG (drawn from the result) and the timeline PNG embedded as base64 data URIs, and a
Chrome/Perfetto trace written next to the page.

The result JSON has no timeline, so the step is simulated again from what the result records:
its resolved scenario (after extends and --set), its calibration's content and its rank model
(``SimResult.resimulate``). That reproduces the result exactly; if it does not (the twin's code
or hardware data changed since), the page says so. A result without a resolved scenario (written
by an older gemtwin) is refused in one line: nothing could say what made it.
"""

from __future__ import annotations

import base64
import html
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from scenarios.files import write_text_atomic
from twin.simulate import SimResult
from twin.views import View, result_views

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.25em .8em;border-bottom:1px solid #eee;
text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}th{background:#f4f4f4}
.summary td:first-child{color:#555}.fits{color:#17632a;font-weight:600}.nofit{color:#b00;font-weight:600}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.5em 1em}
img{max-width:100%;border:1px solid #eee}code{background:#f4f4f4;padding:0 .3em}
.muted{color:#777;font-size:.9em}tr.total td{border-top:2px solid #bbb;font-weight:600}
"""


def write_report(
    result_json: str | os.PathLike[str],
    out_html: str | os.PathLike[str],
    *,
    plots_dir: str | os.PathLike[str] | None = None,
    trace: bool = True,
) -> Path:
    """Write the page for ``result_json`` to ``out_html`` (atomically); return its path.

    ``plots_dir``: also keep the two PNGs there (they are embedded either way). ``trace``: write
    ``<page>.trace.json`` next to the page for ui.perfetto.dev. Raises ``ValueError`` (one line)
    for a missing, unreadable or pre-resolved-scenario result.
    """
    result_path, out = Path(result_json), Path(out_html)
    if out.exists() and out.is_dir():
        raise ValueError(f"report path {out} is a folder; give a file name such as report.html")
    result = read_result(result_path)
    trace_path = _trace_path(out) if trace else None
    sim, timeline = result.resimulate(trace=trace_path)
    notes = [] if sim.step_time_s == result.step_time_s else [
        f"the timeline and trace come from simulating the result's own scenario again, which now "
        f"gives a {sim.step_time_s * 1e3:,.3f} ms step, not the result's "
        f"{result.step_time_s * 1e3:,.3f} ms: the twin's code or hardware data changed since the "
        "result was written; the tables and the breakdown show the result file"]  # fmt: skip
    images = _images(result, timeline, plots_dir)
    page = render(result, images=images, notes=notes, source=result_path.name,
                  trace_name=trace_path.name if trace_path else None)  # fmt: skip
    return write_text_atomic(out, page)


def _trace_path(out: Path) -> Path:
    return out.with_name(out.stem + ".trace.json")


def read_result(path: Path) -> SimResult:
    """The SimResult in ``path``; one-line ``ValueError`` (or ``FileNotFoundError``) otherwise."""
    again = f"write it again with gemtwin simulate SCENARIO [--set ...] --out {path.name}"
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
    if "resolved_scenario" not in data:
        raise ValueError(f"{path} has no resolved_scenario (written by an older gemtwin), so a "
                         f"report cannot tell which configuration made it; {again}")  # fmt: skip
    try:
        return SimResult.model_validate(data)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(x) for x in first["loc"]) or "result"
        raise ValueError(f"{path}: {where}: {first['msg'][:120]} (written by another gemtwin "
                         f"version?); {again}") from None  # fmt: skip


def _images(result: SimResult, timeline, plots_dir) -> list[tuple[str, str, bytes]]:
    """[(title, file name, PNG bytes)]: the breakdown (the result's numbers) and the timeline
    (the re-simulated slowest rank class)."""
    from twin.plots import plot_breakdown, plot_timeline

    name = result.scenario
    with tempfile.TemporaryDirectory(prefix="gemtwin-report-") as tmp:
        folder = Path(plots_dir) if plots_dir is not None else Path(tmp)
        b = plot_breakdown(result, folder / f"{name}-breakdown.png")
        t = plot_timeline(timeline, folder / f"{name}-timeline.png", title=f"{name}: slowest rank class")
        return [("Where the step goes", b.name, b.read_bytes()),
                ("Timeline of the slowest rank class", t.name, t.read_bytes())]  # fmt: skip


# ---- HTML -----------------------------------------------------------------------------------
def render(result: SimResult, *, images: Sequence[tuple[str, str, bytes]] = (),
           notes: Sequence[str] = (), trace_name: str | None = None, source: str = "") -> str:
    """The page as a string (no I/O)."""
    r, e = result, html.escape
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>gemtwin report: {e(r.scenario)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{e(r.scenario)}</h1>",
        f'<p class="muted">{r.num_gpus:,} × {e(r.gpu)} on {e(r.network)} · from {e(source)}</p>',
    ]
    parts += [f'<p class="note">{e(n)}</p>' for n in notes]
    for v in result_views(r):
        parts.append(html_table(v))
        if v.id == "summary" and r.memory_message:
            parts.append(f'<p class="muted">{e(r.memory_message)}</p>')
    for title, name, png in images:
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<h2>{e(title)}</h2>"
                     f'<img alt="{e(title)}" title="{e(name)}" src="data:image/png;base64,{data}">')
    if images:
        parts.append(f'<p class="muted">The timeline and trace: {e(_made_from(r))}.</p>')
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


def _made_from(r: SimResult) -> str:
    cal = f" with its calibration ({r.calibration})" if r.calibration_content else ""
    ranks = "every GPU" if r.per_rank else "rank classes" if r.imbalance else "one mean rank"
    return (f"the scenario recorded in the result (after extends and --set){cal}, simulated again "
            f"over {ranks}")  # fmt: skip


def html_table(v: View) -> str:
    """``v`` as an HTML table (h2 title, header, rows, totals set apart, caption below)."""
    e = html.escape
    cls = ' class="summary"' if not v.head else ""
    out = [f'<h2>{e(v.title)}</h2><table id="{e(v.id)}"{cls}>']
    if v.head:
        out.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in v.head) + "</tr>")
    out += [_html_row(row) for row in v.rows]
    out += [_html_row(row, total=True) for row in v.totals]
    out.append("</table>")
    if v.caption:
        out.append(f'<p class="muted caption">{e(v.caption)}</p>')
    return "\n".join(out)


def _html_row(row: Sequence[str], *, total: bool = False) -> str:
    e = html.escape
    cells = [f"<td>{e(row[0])}</td>"]
    for c in row[1:]:
        css = "num nofit" if c.endswith("DOES NOT FIT") else "num fits" if c.endswith(": fits") else "num"
        cells.append(f'<td class="{css}">{e(c)}</td>')
    tr = '<tr class="total">' if total else "<tr>"
    return f"{tr}{''.join(cells)}</tr>"
