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
from hwmodels.calibration import Calibration, CalibrationRun, save_calibration
from twin.cli import app as cli_app
from twin.cli import friendly
from twin.cli_extra import report_command
from twin.html_report import write_report
from twin.plots import plot_timeline
from twin.simulate import SimResult, simulate, simulate_timelines

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
    assert 'class="note"' not in text  # re-simulation reproduced the result: no note


def _cli(*args) -> str:
    res = CliRunner().invoke(cli_app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res.output


def _trace_step_s(path) -> float:
    events = json.loads(path.read_text())["traceEvents"]
    return max(e["ts"] + e["dur"] for e in events if e["ph"] == "X") / 1e6


def _reported(tmp_path, scenario) -> tuple[SimResult, str]:
    """Report ``tmp_path/r.json`` through the CLI; check that its timeline image and trace are
    those of ``scenario`` (what the result says it was made of) at the result's step time."""
    _cli("report", tmp_path / "r.json", "-o", tmp_path / "page.html")
    result = SimResult.model_validate_json((tmp_path / "r.json").read_text())
    text = (tmp_path / "page.html").read_text()
    assert 'class="note"' not in text  # reproduced: nothing to warn about
    assert _trace_step_s(tmp_path / "page.trace.json") == pytest.approx(result.step_time_s, rel=1e-12)
    again, timeline = simulate_timelines(scenario, calibration=result.calibration_content)
    assert again.step_time_s == result.step_time_s
    drawn = plot_timeline(timeline, tmp_path / "t.png", title=f"{result.scenario}: slowest rank class")
    assert base64.b64decode(IMG.findall(text)[1]) == drawn.read_bytes()
    return result, text


def test_report_of_a_set_result_draws_that_configuration(tmp_path):
    sets = ["training.micro_batch=64"]
    _cli("simulate", "gem-h200-1gpu", "--set", sets[0], "--out", tmp_path / "r.json")
    result, _ = _reported(tmp_path, scenarios.load("gem-h200-1gpu", sets))
    assert result.resolved_scenario.training.micro_batch == 64
    assert simulate(scenarios.load("gem-h200-1gpu")).step_time_s != result.step_time_s  # the base


def test_report_of_a_users_yaml_needs_only_the_result(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: gem-h200-2gpu\nname: my-2gpu\ntraining: {micro_batch: 128}\n")
    s = scenarios.load(str(mine))
    _cli("simulate", mine, "--out", tmp_path / "r.json")
    mine.unlink()  # the report must not need it
    result, text = _reported(tmp_path, s)
    assert result.scenario == "my-2gpu" and len(IMG.findall(text)) == 2


def test_report_of_a_calibrated_result_uses_its_calibration(tmp_path):
    cal = Calibration(version=1, gpu="h200", created_utc="2026-12-01T00:00:00Z",
                      runs=[CalibrationRun(run_id="r1", scenario="gem-h200-2gpu", n_steps=5,
                                           source_path="r1.json", step_time_s=0.07)],
                      scale={"gemm": 1.5}, overhead_s=0.002)  # fmt: skip
    save_calibration(cal, tmp_path / "cal.yaml")
    _cli("simulate", "gem-h200-2gpu", "--calibration", tmp_path / "cal.yaml", "--out", tmp_path / "r.json")
    (tmp_path / "cal.yaml").unlink()
    result, text = _reported(tmp_path, scenarios.load("gem-h200-2gpu"))
    assert result.calibration_content == cal and "with its calibration" in text
    assert simulate(scenarios.load("gem-h200-2gpu")).step_time_s != result.step_time_s


def test_report_notes_a_result_the_twin_no_longer_reproduces(tmp_path):
    data = simulate(scenarios.load("gem-h200-1gpu")).model_dump(mode="json")
    (tmp_path / "r.json").write_text(json.dumps(data | {"step_time_s": data["step_time_s"] * 2}))
    text = write_report(tmp_path / "r.json", tmp_path / "a.html").read_text()
    assert 'class="note"' in text and "code or hardware data changed" in text


def test_a_result_without_its_resolved_scenario_is_refused_in_one_line(tmp_path):
    data = simulate(scenarios.load("gem-h200-1gpu")).model_dump(mode="json")
    for new in ("resolved_scenario", "calibration_content", "per_rank", "imbalance",
                "isolated_compute_s_by_op_class", "exposed_comm_s_split_by_axis"):
        del data[new]  # as results were written before these fields
    (tmp_path / "old.json").write_text(json.dumps(data))
    res = CliRunner().invoke(cli_app, ["report", str(tmp_path / "old.json"), "-o", str(tmp_path / "o.html")])
    line = " ".join(res.output.split())
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "old.json has no resolved_scenario" in line and "gemtwin simulate SCENARIO" in line
    assert not (tmp_path / "o.html").exists()
    bad = simulate(scenarios.load("gem-h200-1gpu")).model_dump(mode="json")
    bad["resolved_scenario"]["training"]["micro_batch"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"bad.json: resolved_scenario\.training\.micro_batch: ") as e:
        write_report(tmp_path / "bad.json", tmp_path / "b.html")
    assert "\n" not in str(e.value)


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
    summary = re.search(r'<table id="summary".*?</table>', dom, re.S)
    assert summary and f"{result.step_time_s * 1e3:,.3f} ms" in summary.group(0), dom[:500]
    sizes = re.search(r'<pre id="probe">([^<]*)</pre>', dom)
    assert sizes, dom[-500:]
    dims = [tuple(map(int, s.split("x"))) for s in sizes.group(1).split()]
    assert len(dims) == 2 and all(w > 100 and h > 100 for w, h in dims)
    shot = tmp_path / "shot.png"
    subprocess.run([*base, f"--screenshot={shot}", "--window-size=1200,900", out.as_uri()],
                   capture_output=True, timeout=60)  # fmt: skip
    assert shot.read_bytes()[:8] == PNG_MAGIC
