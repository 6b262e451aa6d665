"""The CLI: real output for good input; one line and exit 2 for bad input, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from twin.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_simulate_default_scenario(tmp_path):
    r = run("simulate", "--out", str(tmp_path / "r.json"), "--trace", str(tmp_path / "t.json"))
    assert r.exit_code == 0, r.output
    assert "gem-h200-1gpu" in r.output and "MFU" in r.output and "h200 bf16 dense" in r.output
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["scenario"] == "gem-h200-1gpu" and 0 < result["mfu"] <= 1
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_flops_and_schema_and_scenarios():
    r = run("flops", "debug-cpu")
    assert r.exit_code == 0 and "dense FLOPs per sample" in r.output
    r = run("schema")
    assert r.exit_code == 0 and json.loads(r.output)["title"] == "Scenario"
    r = run("scenarios")
    assert r.exit_code == 0 and "gem-h100-4k" in r.output


@pytest.mark.parametrize(
    "args, first_words",
    [
        (["simulate", "nope"], "error: scenario 'nope' not found"),
        (["simulate", "--set", "model.bogus=1"], "error: model.bogus: unknown field"),
        (["simulate", "--set", "hardware.num_gpus=zero"],
         "error: hardware.num_gpus: input should be a valid integer"),
        (["simulate", "--set", "hardware.gpu=h300"], "error: hardware.gpu: unknown GPU 'h300'"),
        (["validate", "missing.json"], "error: run record 'missing.json' not found"),
        (["simulate", "--calibration", "missing.yaml"], "error: calibration"),
        (["train", "--steps", "0"], "error: --steps (0) must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, first_words):
    r = run(*args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(first_words), r.output
    assert "Traceback" not in r.output


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nmodel: [1,\n")
    r = run("simulate", str(p))
    assert r.exit_code == 2 and r.output.startswith("error: bad.yaml: line 3 is not valid YAML")


def test_failed_write_leaves_old_result(tmp_path):
    out = tmp_path / "r.json"
    out.write_text('{"old": true}')
    r = run("simulate", "--set", "hardware.gpu=h300", "--out", str(out))
    assert r.exit_code == 2 and json.loads(out.read_text()) == {"old": True}


def test_console_entry_point_in_a_fresh_process():
    p = subprocess.run([sys.executable, "-m", "twin.cli", "simulate", "--set", "model.x=1"],
                       capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "error: model.x: unknown field; known fields here: bottom_mlp, cross, d_model, "
        "dense_features, embeddings, kind, moe, nonseq, sequence, tasks"
    ]
    assert p.stdout == ""


def test_twin_never_imports_torch():
    code = ("import sys, scenarios, twin.simulate, twin.cli, twin.calibrate, kernels.attention.cost; "
            "twin.simulate.simulate(scenarios.load('gem-h100-4k')); "
            "assert 'torch' not in sys.modules, 'torch imported'")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)


def test_simulate_plots_memory_and_per_rank(tmp_path):
    r = run("simulate", "gem-h200-2gpu", "--plots", str(tmp_path), "--per-rank")
    assert r.exit_code == 0, r.output
    assert "memory (peak, one rank)" in r.output and "rank classes" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gem-h200-2gpu-breakdown.png", "gem-h200-2gpu-timeline.png"]


def test_memory_that_does_not_fit_warns_but_still_answers():
    r = run("simulate", "gem-h100-4k", "--set", "training.micro_batch=512",
            "--set", "training.global_batch=2097152", "--brief")
    assert r.exit_code == 0
    assert "warning: does not fit: 85.1 GB per rank on h100 (80.0 GB)" in r.output
