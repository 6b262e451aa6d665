"""What a first-time user reads: whole install hints, short errors, plain help, honest exit codes.

Each test is one thing a newcomer hit on a fresh clone (issue 18): brackets eaten from install
hints, an 18 KB error line, a sweep of nothing but invalid points that exited 0, ``<bool>`` after
every flag in ``--help``, an owner-only ``plan -o`` file, an ``extends:`` typo that did not name
its file, and a 5,000-deep YAML list that ended in a RecursionError traceback.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from twin.cli import app
from twin.console import install_hint

runner = CliRunner()
RUNS = Path(__file__).resolve().parents[2] / "hwmodels" / "data" / "runs"
RUN = str(RUNS / "h200-2026-11-30-roundtrip" / "h200-gem-1gpu.json")  # a committed RunRecord


def one_error_line(r) -> str:
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    return lines[0]


def test_install_hint_keeps_its_brackets_and_names_this_venv(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "executor.train", None)  # as without torch: import fails
    line = one_error_line(runner.invoke(app, ["train", "debug-cpu", "--out", str(tmp_path / "r.json")]))
    hint = install_hint("exec")
    assert line.endswith(f"install them with: {hint}")
    assert hint.startswith("uv pip install -p ") and hint.endswith("[exec]'")  # rich kept '[exec]'
    assert "pip install -e" not in line.replace("uv pip install", "")


def test_install_hint_is_relative_inside_the_checkout(monkeypatch):
    import twin

    root = Path(twin.__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    assert install_hint("exec").endswith(" -e '.[exec]'")


@pytest.mark.parametrize("flag", ["--calibration"])
def test_a_run_record_given_as_calibration_is_named_in_one_short_line(flag):
    line = one_error_line(runner.invoke(app, ["simulate", flag, RUN]))
    assert line == (f"error: {RUN} is a RunRecord (from gemtwin train), not a calibration; fit one "
                    "from RunRecords with: gemtwin calibrate RUN.json -o cal.yaml")


def test_a_run_record_given_as_scenario_is_named():
    line = one_error_line(runner.invoke(app, ["simulate", RUN]))
    assert line.startswith("error: h200-gem-1gpu.json is a RunRecord (from gemtwin train), not a scenario")


def test_echoed_values_are_capped(tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text(json.dumps({"version": 2, "gpu": "h200", "created_utc": "2026-12-01T00:00:00Z",
                               "runs": [{"run_id": "x" * 5000}], "scale": {}}))
    line = one_error_line(runner.invoke(app, ["simulate", "--calibration", str(cal)]))
    assert len(line) < 300 and "xxx..." in line


def test_every_error_line_is_capped():
    from twin.console import LINE_LIMIT, _capped

    long = "field: " + "v" * 5000 + " ; fix: do this"
    capped = _capped(long)
    assert len(capped) <= LINE_LIMIT and capped.startswith("field: ") and capped.endswith("fix: do this")


def test_sweep_of_only_invalid_points_exits_2(tmp_path):
    r = runner.invoke(app, ["sweep", "gem-h200-1gpu", "--grid", "hardware.num_gpus=3,5",
                            "-o", str(tmp_path / "sw"), "--processes", "1"])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "error: all 2 points are invalid" in r.output
    assert (tmp_path / "sw" / "sweep.csv").is_file()  # the error column is still written


def test_sweep_help_promises_parquet_only_with_pyarrow():
    r = runner.invoke(app, ["sweep", "--help"])
    assert r.exit_code == 0 and "sweep.parquet where pyarrow is installed" in " ".join(r.output.split())


@pytest.mark.parametrize("command", ["simulate", "train", "sweep", "plan", "forecast", "report", "hw"])
def test_help_shows_no_bool_metavar(command):
    r = runner.invoke(app, [command, "--help"])
    assert r.exit_code == 0, r.output
    assert "<bool>" not in r.output and "--help" in r.output


def test_plan_out_file_is_readable_like_any_new_file(tmp_path):
    out = tmp_path / "best.yaml"
    r = runner.invoke(app, ["plan", "gem-h200-2gpu", "--gpus", "2", "-o", str(out), "--budget", "300"])
    assert r.exit_code == 0, r.output
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


def test_extends_typo_names_the_file_and_a_close_match(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("extends: gem-h200-1gpuu\nname: mine\n")
    line = one_error_line(runner.invoke(app, ["simulate", str(p)]))
    assert line.startswith("error: mine.yaml: extends: scenario 'gem-h200-1gpuu' not found")
    assert line.endswith("did you mean 'gem-h200-1gpu'?")


@pytest.mark.parametrize("where", ["file", "set"])
def test_deeply_nested_yaml_is_one_line(tmp_path, where):
    deep = "[" * 5000 + "]" * 5000
    if where == "file":
        p = tmp_path / "deep.yaml"
        p.write_text(f"extends: debug-cpu\nmodel: {deep}\n")
        args = ["simulate", str(p)]
    else:
        args = ["simulate", "debug-cpu", "--set", f"model.d_model={deep}"]
    line = one_error_line(runner.invoke(app, args))
    assert "deep" in line and "Traceback" not in line


def test_moderately_nested_yaml_still_gets_the_schema_error(tmp_path):
    p = tmp_path / "ten.yaml"
    p.write_text("extends: debug-cpu\nmodel: {d_model: " + "[" * 10 + "]" * 10 + "}\n")
    line = one_error_line(runner.invoke(app, ["simulate", str(p)]))
    assert line.startswith("error: model.d_model:")
