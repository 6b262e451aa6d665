"""Efficiency curves against size and the gaps between kernels, recovered from synthetic runs
whose truth is known (``twin.calibrate.fit_curves``, ``fit_overhead``)."""

from __future__ import annotations

import numpy as np
import pytest

from twin.calibrate import CurveRow, fit_curves, fit_overhead

L0 = 5e-6


def _rows(a: float, b: float, c: float, *, noise: float = 0.0, seed: int = 0) -> list[CurveRow]:
    """Runs of different sizes (roofline, x_half part, calls) measured as a·R + b·X + c·n."""
    rng = np.random.default_rng(seed)
    sizes = [(0.028, 0.002, 130), (0.014, 0.002, 130), (0.042, 0.002, 130), (0.019, 0.0015, 70),
             (0.047, 0.004, 200), (0.028, 0.001, 130), (0.010, 0.003, 90), (0.035, 0.002, 160)]  # fmt: skip
    out = []
    for R, X, n in sizes:
        m = (a * R + b * X + c * n) * (1 + noise * rng.standard_normal())
        out.append(CurveRow(R, X, n, L0, measured_s=m))
    return out


def test_a_fixed_cost_per_call_is_recovered_where_sizes_differ():
    got = fit_curves({"elementwise": _rows(0.7, 0.7, 0.7 * 30e-6)})["elementwise"]
    assert got.scale == pytest.approx(0.7, rel=0.02)
    assert got.launch_s == pytest.approx(30e-6, rel=0.05)
    assert "launch_s" in got.model and got.loo_error < 1e-3


def test_all_three_terms_are_recovered_when_the_runs_need_them():
    got = fit_curves({"gemm": _rows(1.0, 3.0, 1.0 * 20e-6)})["gemm"]
    assert got.model == ("scale", "x_half_scale", "launch_s")
    assert (got.scale, got.x_half_scale, got.launch_s) == pytest.approx((1.0, 3.0, 20e-6), rel=0.05)


def test_a_plain_scale_stays_a_scale():
    """Runs that a scale explains (within noise) get no curve: the richer models do not predict
    the left-out runs better."""
    got = fit_curves({"norm": _rows(0.6, 0.6, 0.6 * L0, noise=0.005)})["norm"]
    assert got.model == ("scale",) and got.launch_s is None and got.x_half_scale is None
    assert got.scale == pytest.approx(0.6, rel=0.01)


def test_one_bad_run_barely_moves_the_curve():
    rows = _rows(0.7, 0.7, 0.7 * 30e-6)
    rows[2] = CurveRow(rows[2].roofline_s, rows[2].x_half_s, rows[2].calls, L0, measured_s=rows[2].measured_s * 3)
    got = fit_curves({"elementwise": rows})["elementwise"]
    assert got.scale == pytest.approx(0.7, rel=0.05) and got.launch_s == pytest.approx(30e-6, rel=0.15)


def test_too_few_runs_fit_no_curve():
    assert fit_curves({"gemm": _rows(1.0, 1.0, L0)[:2]}) == {}


def test_gaps_that_grow_with_the_work_become_a_fraction():
    kernel = [0.03, 0.055, 0.08, 0.035, 0.095, 0.06]
    c0, f = fit_overhead([0.5e-3 + 0.04 * k for k in kernel], kernel)
    assert c0 == pytest.approx(0.5e-3, rel=0.05) and f == pytest.approx(0.04, rel=0.02)
    c0, f = fit_overhead([2e-3 * (1 + 0.01 * (-1) ** i) for i in range(len(kernel))], kernel)
    assert f == 0.0 and c0 == pytest.approx(2e-3, rel=0.02)  # a constant stays a constant
