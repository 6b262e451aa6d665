"""The static HTML report: summary numbers, tables, two embedded images, a Perfetto trace; and
what headless Chromium renders of it (skipped without Chromium)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import pytest
import typer
from typer.testing import CliRunner

import scenarios
from twin.cli import friendly
from twin.cli_extra import report_command
from twin.html_report import write_report
from twin.simulate import simulate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
IMG = re.compile(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    result = simulate(scenarios.load("gem-h200-2gpu"))
    result.save(folder / "result.json")
    out = write_report(folder / "result.json", folder / "report.html", plots_dir=folder / "png")
    return result, out


def test_page_has_summary_tables_images_and_trace(page):
    result, out = page
    text = out.read_text()
    assert f"{result.step_time_s * 1e3:,.3f} ms" in text
    assert f"{result.samples_per_s:,.0f}" in text
    assert f"{result.mfu:.1%} of {result.mfu_peak}" in text
    assert "straggler" in text and "fits" in text
    for table in ('id="summary"', 'id="breakdown"', 'id="comm"', 'id="memory"', 'id="ranks"'):
        assert table in text
    images = IMG.findall(text)
    assert len(images) == 2
    for b64 in images:
        assert base64.b64decode(b64)[:8] == PNG_MAGIC
    assert "http://" not in text and "<script" not in text and "<link" not in text  # no assets
    trace = out.with_name("report.trace.json")
    assert f'href="{trace.name}"' in text and "ui.perfetto.dev" in text
    assert json.loads(trace.read_text())["traceEvents"]
    assert sorted(p.suffix for p in (out.parent / "png").iterdir()) == [".png", ".png"]
    assert "simulating" not in text  # re-simulation reproduced the result: no note


def test_mismatch_and_unknown_scenario_are_noted(tmp_path):
    result = simulate(scenarios.load("gem-h200-1gpu", ["training.micro_batch=64"]))
    result.save(tmp_path / "r.json")
    text = write_report(tmp_path / "r.json", tmp_path / "a.html").read_text()
    assert "not the result" in text and len(IMG.findall(text)) == 2
    data = json.loads((tmp_path / "r.json").read_text()) | {"scenario": "gone-from-library"}
    (tmp_path / "g.json").write_text(json.dumps(data))
    text = write_report(tmp_path / "g.json", tmp_path / "g.html").read_text()
    assert "--scenario" in text and len(IMG.findall(text)) == 1  # breakdown only


def _app() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)
    app.command("report")(friendly(report_command))
    app.command("noop")(lambda: None)
    return app


def test_command_errors_exit_2(tmp_path):
    res = CliRunner().invoke(_app(), ["report", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "not found" in res.output
    (tmp_path / "bad.json").write_text("{}")
    res = CliRunner().invoke(_app(), ["report", str(tmp_path / "bad.json")])
    assert res.exit_code == 2 and "is not a simulate result" in " ".join(res.output.split())


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install -y chromium)")
def test_chromium_renders_summary_and_images(page, tmp_path):
    result, out = page
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
    # The images' natural size proves the data URIs decoded; the DOM dump shows what rendered.
    probe = out.with_name("probe.html")
    probe.write_text(out.read_text().replace(
        "</body>",
        "<script>window.addEventListener('load',()=>{const s=[...document.images].map(i=>"
        "i.naturalWidth+'x'+i.naturalHeight).join(' ');document.body.insertAdjacentHTML("
        "'beforeend','<pre id=probe>'+s+'</pre>')})</script></body>"))  # fmt: skip
    dom = subprocess.run([*base, "--virtual-time-budget=3000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    assert f"{result.step_time_s * 1e3:,.3f} ms" in dom and "Summary" in dom
    sizes = re.search(r'<pre id="probe">([^<]*)</pre>', dom)
    assert sizes, dom[-500:]
    dims = [tuple(map(int, s.split("x"))) for s in sizes.group(1).split()]
    assert len(dims) == 2 and all(w > 100 and h > 100 for w, h in dims)
    shot = tmp_path / "shot.png"
    subprocess.run([*base, f"--screenshot={shot}", "--window-size=1200,900", out.as_uri()],
                   capture_output=True, timeout=60)  # fmt: skip
    assert shot.read_bytes()[:8] == PNG_MAGIC
