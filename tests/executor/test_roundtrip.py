"""train → calibrate → validate through the CLI, as an engineer runs it."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from hwmodels.calibration import load_calibration
from twin.calibrate import compare, fit
from twin.cli import app
from twin.runrecord import load_run

runner = CliRunner()


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


def test_calibration_refuses_other_gpu(tmp_path):
    run = tmp_path / "run.json"
    assert runner.invoke(app, ["train", "debug-cpu", "--steps", "3", "--out", str(run)]).exit_code == 0
    from hwmodels.calibration import save_calibration

    save_calibration(fit([load_run(run)], sources=[str(run)]), tmp_path / "cal.yaml")
    r = runner.invoke(app, ["simulate", "debug-cpu", "--set", "hardware.gpu=b200",
                            "--calibration", str(tmp_path / "cal.yaml")])  # fmt: skip
    assert r.exit_code == 2
    assert r.output.strip() == (
        "error: calibration is for gpu 'cpu' but hardware.gpu is 'b200'; use a calibration "
        "fitted on b200 runs"
    )
