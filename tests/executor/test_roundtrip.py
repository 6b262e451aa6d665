"""train → calibrate → validate through the CLI, as an engineer runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hwmodels.calibration import load_calibration
from twin.calibrate import compare, fit
from twin.cli import app
from twin.runrecord import load_run

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def test_train_calibrate_validate_round_trip(tmp_path):
    run, cal = tmp_path / "run.json", tmp_path / "cal.yaml"
    r = runner.invoke(app, ["train", "debug-cpu", "--steps", "8", "--out", str(run)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["calibrate", str(run), "-o", str(cal)])
    assert r.exit_code == 0, r.output
    c = load_calibration(cal)
    assert c.runs[0].source_path == str(run) and c.runs[0].n_steps == 8
    assert {"gemm", "attention", "embedding"} <= set(c.scale)
    assert yaml.safe_load(cal.read_text())["version"] == 2
    assert set(c.fit_error) == {c.runs[0].run_id} and abs(c.fit_error[c.runs[0].run_id]) < 0.01
    r = runner.invoke(app, ["validate", str(run), "--calibration", str(cal)])
    assert r.exit_code == 0, r.output
    assert "twin (calibrated)" in r.output
    # On the run it was fitted on (one rank, no communication) the twin reproduces the
    # measured step time: per-class scales plus the per-step overhead add up to it.
    record = load_run(run)
    assert abs(compare(record, c).error) < 0.01
    # Uncalibrated, the twin prices the run on the measured cpu profile (hwmodels gpus.yaml cpu); how
    # far that is from this run depends on how loaded the machine is, so it is reported, not pinned
    plain = compare(record, None).result
    assert (plain.gpu, plain.network, plain.calibration) == ("cpu", "cpu-host", "")
    assert c.gpu == "cpu"  # a CPU run calibrates the CPU profile


@pytest.fixture(scope="module")
def cpu_run_of_an_h200_scenario(tmp_path_factory):
    """A CPU run of a scenario whose hardware.gpu says h200: what a laptop engineer makes."""
    run = tmp_path_factory.mktemp("h200-on-cpu") / "run.json"
    r = runner.invoke(app, ["train", "debug-cpu", "--set", "hardware.gpu=h200", "--set",
                            "hardware.network=h200x2-nv18", "--steps", "3", "--out", str(run)])  # fmt: skip
    assert r.exit_code == 0, r.output
    return run


def test_a_cpu_run_calibrates_the_cpu_whatever_its_scenario_says(cpu_run_of_an_h200_scenario, tmp_path):
    run, cal = cpu_run_of_an_h200_scenario, tmp_path / "cal.yaml"
    assert load_run(run).scenario["hardware"]["gpu"] == "h200"
    r = runner.invoke(app, ["calibrate", str(run), "-o", str(cal)])
    assert r.exit_code == 0, r.output
    c = load_calibration(cal)
    assert c.gpu == "cpu" and c.measured_on.startswith("cpu:")
    assert "calibration for cpu" in r.output
    # validate prices the run on the hardware it ran on, so the fitted run reproduces itself
    assert abs(compare(load_run(run), c).error) < 0.01
    assert compare(load_run(run), None).result.gpu == "cpu"


def test_calibration_refuses_other_hardware_in_one_line(cpu_run_of_an_h200_scenario, tmp_path):
    from hwmodels.calibration import save_calibration

    run, cal = cpu_run_of_an_h200_scenario, tmp_path / "cal.yaml"
    c = fit([load_run(run)], sources=[str(run)])
    save_calibration(c, cal)
    r = runner.invoke(app, ["simulate", "gem-h200-1gpu", "--calibration", str(cal)])
    assert r.exit_code == 2
    assert r.output.strip() == (
        f"error: calibration {cal} was measured on cpu ({c.measured_on}), but hardware.gpu is 'h200': "
        "fit a calibration on h200 runs, or simulate cpu with --set hardware.gpu=cpu"
    )


def test_validate_refuses_a_calibration_of_other_hardware(cpu_run_of_an_h200_scenario):
    cal = str(ROOT / "hwmodels" / "data" / "calibrations" / "h200-fused-executor.yaml")  # an H200 run's
    r = runner.invoke(app, ["validate", str(cpu_run_of_an_h200_scenario), "--calibration", cal])
    assert r.exit_code == 2
    line = r.output.strip()
    assert line.startswith(f"error: calibration {cal} was measured on h200") and "ran on cpu" in line
    assert len(line.splitlines()) == 1
