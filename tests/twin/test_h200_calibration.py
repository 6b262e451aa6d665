"""The committed H200 measurements and the calibration fitted on them (hwmodels/data/runs).

Recorded on one H200 by executor/bench/h200_roundtrip.sh: gem-h200-1gpu, and two held-out
variants (micro-batch 128; 2 sequence layers). The calibration was fitted on the first only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hwmodels.calibration import load_calibration
from twin.calibrate import compare, fit
from twin.runrecord import load_run

DATA = Path(__file__).resolve().parents[2] / "hwmodels" / "data"
CAL = DATA / "calibrations" / "h200-reference-executor.yaml"


def run(name: str):
    return load_run(DATA / "runs" / "h200-2026-11-30-roundtrip" / f"{name}.json")


def test_runs_are_real_h200_measurements():
    r = run("h200-gem-1gpu")
    assert r.environment.device == "cuda" and r.environment.device_name == "NVIDIA H200"
    assert r.mfu_peak == "h200 bf16 dense" and 0 < r.mfu < 1
    # the profiler's per-class kernel time fits inside the step (no double counting)
    assert sum(r.op_class_time_s.values()) < r.step_time_s


def test_calibration_records_its_run_and_refits_the_same():
    cal = load_calibration(CAL)
    assert [x.source_path for x in cal.runs] == ["hwmodels/data/runs/h200-2026-11-30-roundtrip/h200-gem-1gpu.json"]
    again = fit([run("h200-gem-1gpu")], sources=["x"])
    assert again.scale == pytest.approx(cal.scale) and again.overhead_s == pytest.approx(cal.overhead_s)


def test_fitted_run_reproduces_and_held_out_runs_stay_close():
    cal = load_calibration(CAL)
    assert abs(compare(run("h200-gem-1gpu"), cal).error) < 0.01
    for held_out in ("h200-gem-1gpu-mb128", "h200-gem-1gpu-seq2"):
        uncalibrated, calibrated = compare(run(held_out), None), compare(run(held_out), cal)
        assert abs(calibrated.error) < 0.15  # the execution priced (2026-12-02): +9.3% and +3.8%
        assert abs(calibrated.error) < abs(uncalibrated.error) / 3


def test_runs_record_attention_per_kind_and_the_fit_uses_it():
    r = run("h200-gem-1gpu")
    assert set(r.kernel_time_s) == {"attention.gdpa", "attention.asym"}
    assert sum(r.kernel_time_s.values()) == pytest.approx(r.op_class_time_s["attention"], rel=1e-6)
    cal = load_calibration(CAL)
    assert cal.scale["attention.gdpa.fwd"] == cal.scale["attention.gdpa.bwd"]
    # the twin prices the padded reference the run ran (twin.execution_cost), so its attention
    # scales are near 1 (they were 28 and 5.4 while it priced the Triton kernels)
    for kind in ("attention.gdpa.fwd", "attention.asym.fwd"):
        assert 0.7 < cal.scale[kind] < 1.4, kind
