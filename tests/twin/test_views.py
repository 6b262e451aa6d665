"""One result, one set of numbers: the terminal tables, the breakdown plot (read off its
matplotlib artists) and the HTML report print the same values to the printed precision, and the
sums meant to add up do (issue 18, item 7)."""

from __future__ import annotations

import base64
import html
import io
import re

import pytest
from rich.console import Console

import scenarios
from twin.html_report import write_report
from twin.plots import breakdown_figure, plot_breakdown
from twin.report import result_tables
from twin.simulate import simulate
from twin.views import STEP_PARTS, result_views

# The issue's scenario (several axes exposed at once, SM contention), a 2-GPU one and a DLRM.
SCENARIOS = ["gem-h100-4k", "gem-h200-2gpu", "dlrm-dcnv2"]
HALF_MS = 0.0005  # half the last printed digit of a "ms" cell (3 decimals)


@pytest.fixture(scope="module", params=SCENARIOS)
def result(request):
    return simulate(scenarios.load(request.param))


def _views(r):
    return {v.id: v for v in result_views(r)}


def _num(cell: str) -> float:
    return float(cell.replace(",", "").removesuffix(" ms").removesuffix("%"))


def _col(view, i: int) -> dict[str, float]:
    return {row[0]: _num(row[i]) for row in view.rows}


def _total(view, i: int) -> float:
    return _num(view.totals[0][i])


def _adds_up(parts, total: float) -> None:
    """Printed parts add up to the printed total, up to each one's rounding."""
    parts = list(parts)
    assert sum(parts) == pytest.approx(total, abs=HALF_MS * (len(parts) + 1))


def test_the_issues_numbers_now_agree():
    """gem-h100-4k: exposed sparse_replica read 139.2 (table), 138.8 (--plots), ≈128.2 (report
    image); op-class compute summed to 457.4 against a compute of 444.0."""
    r = simulate(scenarios.load("gem-h100-4k"))
    v = _views(r)
    assert _col(v["comm"], 2)["sparse_replica"] > _col(v["comm"], 3)["sparse_replica"]  # each axis vs split
    assert sum(r.exposed_comm_s_by_axis.values()) > r.breakdown_s["exposed_comm"] * 1.05
    assert sum(r.compute_s_by_op_class.values()) > r.breakdown_s["compute"] * 1.02  # contention
    assert sum(r.isolated_compute_s_by_op_class.values()) == pytest.approx(r.breakdown_s["compute"])


def test_sums_meant_to_add_up_do(result):
    v = _views(result)
    b = _col(v["breakdown"], 1)
    step_ms = _num(dict(v["summary"].rows)["step time"])
    _adds_up((b[k] for k in STEP_PARTS), step_ms)
    assert _total(v["breakdown"], 1) == step_ms
    c = v["compute"]
    _adds_up(_col(c, 1).values(), _total(c, 1))
    _adds_up(_col(c, 2).values(), _total(c, 2))
    _adds_up(_col(c, 3).values(), _total(c, 3))
    assert _total(c, 1) == b["compute"] and _total(c, 2) == b["sm_contention"]
    for row in c.rows:
        _adds_up((_num(row[1]), _num(row[2])), _num(row[3]))  # isolated + contention = as run
    mem = v["memory"]
    total_gb = float(mem.totals[0][1].split(" of ")[0])
    assert sum(_col(mem, 1).values()) == pytest.approx(total_gb, abs=0.005 * (len(mem.rows) + 1))
    # Unrounded, the same sums hold exactly (to float rounding).
    r = result
    assert sum(r.isolated_compute_s_by_op_class.values()) == pytest.approx(r.breakdown_s["compute"], rel=1e-9)
    assert sum(r.compute_s_by_op_class.values()) == pytest.approx(
        r.breakdown_s["compute"] + r.breakdown_s["sm_contention"], rel=1e-9)  # fmt: skip
    assert sum(r.breakdown_s[k] for k in STEP_PARTS) == pytest.approx(r.step_time_s, rel=1e-9)


def test_exposed_comm_per_axis_and_its_split(result):
    v = _views(result)
    if "comm" not in v:
        pytest.skip("one GPU: no communication")
    comm, exposed_ms = v["comm"], _col(_views(result)["breakdown"], 1)["exposed_comm"]
    _adds_up(_col(comm, 3).values(), _total(comm, 3))
    assert _total(comm, 3) == exposed_ms
    assert comm.totals[0][2] == ""  # the per-axis column does not add up: no total printed
    for axis, busy, each, split in comm.rows:
        assert _num(busy) >= _num(each) >= _num(split)
    each_sum = sum(result.exposed_comm_s_by_axis.values())
    assert f"adds up to {each_sum * 1e3:,.3f} ms" in comm.caption  # the caption says by how much


def test_terminal_prints_every_view(result):
    console = Console(width=250, record=True, file=io.StringIO())
    for t in result_tables(result):
        console.print(t)
    text = console.export_text()
    lines = {tuple(c.strip() for c in line.strip().strip("│").split("│"))
             for line in text.splitlines() if "│" in line}  # fmt: skip
    flat = " ".join(text.split())
    for v in result_views(result):
        assert " ".join(v.title.split()) in flat
        for row in v.rows + v.totals:
            assert tuple(row) in lines, (v.id, row)
        assert " ".join(v.caption.split()) in flat


def _plot(result) -> tuple[dict[str, float], dict[str, float], dict[str, str], str]:
    """What the breakdown figure draws: {label: width ms} of the step bar and of the comm bar,
    {label: legend text}, the title."""
    ax = breakdown_figure(result).axes[0]
    step, comm = {}, {}
    for bar in ax.containers:
        (patch,) = bar.patches
        row = step if round(patch.get_y() + patch.get_height() / 2) == 0 else comm
        row[bar.get_label()] = patch.get_width()
    legend = {}
    for t in ax.get_legend().get_texts():
        label, rest = t.get_text().split(": ", 1)
        legend[label] = rest
    return step, comm, legend, ax.get_title()


def test_breakdown_plot_draws_the_tables_numbers(result):
    v = _views(result)
    step, comm, legend, title = _plot(result)
    breakdown = dict((row[0], row[1]) for row in v["breakdown"].rows)
    expected = {row[0]: row[1] for row in v["compute"].rows}  # isolated ms
    expected |= {"sm_contention": breakdown["sm_contention"], "idle": breakdown["idle"]}
    busy = {}
    if "comm" in v:
        expected |= {f"exposed {row[0]}": row[3] for row in v["comm"].rows}
        busy = {f"{row[0]} busy": row[1] for row in v["comm"].rows}
    shown = {k: c for k, c in expected.items() if _num(c) > 0}  # zero-width parts are left out
    assert {k: f"{ms:,.3f}" for k, ms in step.items()} == {
        k: c for k, c in expected.items() if k in step}  # fmt: skip
    assert set(shown) <= set(step) <= set(expected)
    assert {k: f"{ms:,.3f}" for k, ms in comm.items()} == busy
    assert sum(step.values()) == pytest.approx(result.step_time_s * 1e3, rel=1e-9)
    for label, ms in (step | comm).items():
        assert legend[label].startswith(f"{ms:,.1f} ms")
    step_cell = dict(v["summary"].rows)["step time"]
    assert f"step {result.step_time_s * 1e3:,.1f} ms" in title  # the title rounds the step, not the cell
    assert _num(step_cell) == pytest.approx(result.step_time_s * 1e3, abs=5e-4)


def _html_tables(page: str) -> dict[str, list[tuple[str, ...]]]:
    out = {}
    for ident, body in re.findall(r'<table id="([^"]+)"[^>]*>(.*?)</table>', page, re.S):
        rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
        out[ident] = [tuple(html.unescape(c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row))
                      for row in rows]  # fmt: skip
    return out


def test_html_report_prints_the_same_tables_and_plot(result, tmp_path):
    result.save(tmp_path / "r.json")
    page = write_report(tmp_path / "r.json", tmp_path / "report.html").read_text()
    tables = _html_tables(page)
    views = result_views(result)
    assert list(tables) == [v.id for v in views]
    for v in views:
        assert tables[v.id] == ([v.head] if v.head else []) + list(v.rows) + list(v.totals)
        assert html.escape(v.caption) in page
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    drawn = plot_breakdown(result, tmp_path / "breakdown.png").read_bytes()
    assert base64.b64decode(images[0]) == drawn  # the very figure the test above reads
