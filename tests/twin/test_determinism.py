"""Determinism: the same scenario and seed give byte-identical result JSON and trace JSON."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import scenarios
from twin.simulate import simulate

SCENARIOS = ("gem-h100-4k", "gem-gb200-nvl72", "dlrm-dcnv2")
REPO = Path(__file__).resolve().parents[2]


def _run(name: str, folder: Path) -> tuple[bytes, bytes]:
    folder.mkdir()
    result = simulate(scenarios.load(name), trace=folder / "trace.json")
    result.save(folder / "result.json")
    return (folder / "result.json").read_bytes(), (folder / "trace.json").read_bytes()


@pytest.mark.parametrize("name", SCENARIOS)
def test_same_scenario_twice_gives_identical_bytes(name, tmp_path):
    first_result, first_trace = _run(name, tmp_path / "a")
    second_result, second_trace = _run(name, tmp_path / "b")
    assert first_result == second_result
    assert first_trace == second_trace
    assert len(first_trace) > 1_000


def test_identical_across_processes_with_different_hash_seeds(tmp_path):
    """Catches iteration over sets or hash-ordered containers leaking into the output."""
    code = (
        "import sys, scenarios; from twin.simulate import simulate; "
        "simulate(scenarios.load('gem-h100-4k'), trace=sys.argv[1] + '/trace.json')"
        ".save(sys.argv[1] + '/result.json')"
    )
    outputs = []
    for seed in ("1", "2"):
        folder = tmp_path / seed
        folder.mkdir()
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", code, str(folder)], cwd=REPO, env=env, check=True)
        outputs.append(((folder / "result.json").read_bytes(), (folder / "trace.json").read_bytes()))
    assert outputs[0] == outputs[1]
