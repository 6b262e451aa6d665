"""``gemtwin validate`` over many runs: held-out error, the plot, and drift detection."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hwmodels.calibration import load_calibration
from twin.cli import app
from twin.runrecord import RunRecord, load_run
from twin.validate import drift, summary, validate_runs

RUNS = "hwmodels/data/runs/h200-2026-11-30-executor"
FIT = f"{RUNS}/s23.json"  # the run hwmodels/data/calibrations/h200-fused-executor.yaml was fitted on
HELD = [f"{RUNS}/s24.json", f"{RUNS}/s25.json", "hwmodels/data/runs/h200-2026-12-01-executor/s27.json"]
CAL = "hwmodels/data/calibrations/h200-fused-executor.yaml"


@pytest.fixture(scope="module")
def rows():
    paths = [FIT, *HELD]
    return validate_runs([load_run(p) for p in paths], load_calibration(CAL), sources=paths)


def test_fitted_runs_are_told_apart_from_held_out_ones(rows):
    assert [r.held_out for r in rows] == [False, True, True, True]
    s = summary(rows)
    assert (s.held_out, s.fitted) == (3, 1)
    assert s.step_mape == pytest.approx(sum(abs(r.error) for r in rows[1:]) / 3)
    assert s.step_max == max(abs(r.error) for r in rows[1:]) < 0.05  # the committed runs: within 5%
    assert rows[0].error == pytest.approx(0.0, abs=1e-6)  # the fit reproduces its own run
    assert {"gemm", "attention"} <= set(s.class_max)
    assert s.memory_mape is not None and s.memory_mape > 0


def _changed_kernel(path: str, tmp_path, factor: float = 1.3) -> str:
    """The run as if its GEMMs had got ``factor`` slower (a changed kernel): the profiled gemm time
    and the step time grow by the same seconds."""
    data = json.loads(open(path).read())
    extra = data["op_class_time_s"]["gemm"] * (factor - 1)
    data["op_class_time_s"]["gemm"] *= factor
    data["step_time_s"] += extra
    for s in data["steps"]:
        s["step_time_s"] += extra
    data["run_id"] = "slowgemm0001"
    out = tmp_path / "slow-gemm.json"
    RunRecord.model_validate(data).save(out)
    return str(out)


def test_drift_names_the_op_class_that_moved(rows, tmp_path):
    assert drift(rows, 5) == []
    slow = _changed_kernel(HELD[0], tmp_path)
    moved = drift(validate_runs([load_run(slow)], load_calibration(CAL), sources=[slow]), 5)
    assert len(moved) == 1 and "gemm -" in moved[0] and "step time -" in moved[0], moved
    assert "attention" not in moved[0]


def test_cli_validate_many_runs_writes_the_table_the_plot_and_fails_on_drift(tmp_path):
    png = tmp_path / "val.png"
    r = CliRunner().invoke(app, ["validate", FIT, *HELD, "--calibration", CAL, "--png", str(png), "--fail-above", "5"],
                           env={"COLUMNS": "240"})  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "3 held-out run(s): step MAPE" in r.output and "no drift above 5%" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    slow = _changed_kernel(HELD[0], tmp_path)
    r = CliRunner().invoke(app, ["validate", FIT, slow, "--calibration", CAL, "--fail-above", "5"])
    assert r.exit_code == 1
    assert "drift above 5%" in r.output and "gemm" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["validate", FIT, "--fail-above", "0"])
    assert r.exit_code == 2 and "--fail-above (0) must be a positive percentage" in r.output
