"""The spine on a laptop: predict → ``gemtwin train --nproc 2`` → ``calibrate`` → ``validate``
closes for multi-rank CPU runs (2 gloo ranks, one core each). Two layouts are trained; the
calibration fitted on one predicts the other, which it was not fitted on, and the drift check
runs on it."""

from __future__ import annotations

from typer.testing import CliRunner

from hwmodels.calibration import load_calibration
from twin.cli import app
from twin.runrecord import load_run

TWO = ["--set", "hardware.num_gpus=2", "--set", "training.global_batch=64", "--set", "training.micro_batch=32",
       "--set", "parallelism.sparse_shard=2"]  # fmt: skip


def test_predict_train_calibrate_validate_on_two_ranks(tmp_path):
    cli = CliRunner()
    layouts = {"shard": ["--set", "parallelism.dense_shard=2"], "replicate": ["--set", "parallelism.dense_replicate=2"]}
    for name, sets in layouts.items():
        predicted = cli.invoke(app, ["simulate", "debug-cpu", "--brief", *TWO, *sets])
        assert predicted.exit_code == 0 and "2xcpu" in predicted.output, predicted.output
        r = cli.invoke(app, ["train", "debug-cpu", "--nproc", "2", "--steps", "6", *TWO, *sets,
                             "--out", str(tmp_path / f"{name}.json")])  # fmt: skip
        assert r.exit_code == 0, r.output
    shard, replicate = load_run(tmp_path / "shard.json"), load_run(tmp_path / "replicate.json")
    assert shard.world_size == 2 and shard.comm_s_by_axis and replicate.comm_s_by_axis
    r = cli.invoke(app, ["calibrate", str(tmp_path / "shard.json"), "-o", str(tmp_path / "cal.yaml")])
    assert r.exit_code == 0, r.output
    cal = load_calibration(tmp_path / "cal.yaml")
    assert cal.collective_scale or cal.collective_alpha_beta  # the collectives were fitted too
    assert abs(cal.residuals[shard.run_id]["step"]) < 0.02  # the fitted run, reproduced
    r = cli.invoke(app, ["validate", str(tmp_path / "shard.json"), str(tmp_path / "replicate.json"),
                         "--calibration", str(tmp_path / "cal.yaml"), "--fail-above", "1000"],
                   env={"COLUMNS": "240"})  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "1 held-out run(s): step MAPE" in r.output and "no drift above 1000%" in r.output
