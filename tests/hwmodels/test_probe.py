"""gemtwin hw probe: the alpha/beta fit, profiles as hardware (probe:PATH), their errors, and one real probe.

The fast tests build a profile from synthetic measurements (hwmodels.profile.build_profile, torch-free);
the real probe (spawns gloo ranks, ~10 s on 2 cores) is marked slow.
"""

from __future__ import annotations

import copy

import pytest
import yaml
from typer.testing import CliRunner

import scenarios
from hwmodels._data import load_yaml
from hwmodels.collectives import collective_cost
from hwmodels.gpus import get_gpu
from hwmodels.network import get_network
from hwmodels.profile import build_profile, fit_alpha_beta, load_profile
from twin.cli import app
from twin.simulate import simulate

SIZES = (4, 4096, 65536, 262144, 1 << 20, 4 << 20, 16 << 20)


def _meas(*, fp32: float = 1.5e11, bw: float = 2.0e10, alpha: float = 2e-4, beta: float = 1.5e9) -> dict:
    """Measurements as hwmodels/bench/probe.py ``measure`` returns them, at chosen rates."""
    gemm = [{"dtype": dt, "m": n, "k": n, "n": n, "time_s": 1.0, "median_s": 1.0, "calls": 5,
             "flops_per_s": rate * n / 1024} for dt, rate in (("fp32", fp32), ("bf16", fp32 / 50))
            for n in (256, 512, 1024)]
    copy_ = [{"elems": n, "bytes": 8 * n, "time_s": 1.0, "median_s": 1.0, "calls": 5, "Bps": bw}
             for n in (1 << 20, 1 << 24)]
    coll = {k: [{"msg_bytes": m, "time_s": alpha + m / beta, "median_s": alpha + m / beta, "calls": 5}
                for m in SIZES] for k in ("all_reduce", "all_to_all")}
    env = {"host": "testhost", "time_utc": "2026-12-02T00:00:00Z", "torch": "2.13", "threads": 2, "cores": 2,
           "mem_total_bytes": 24 << 30, "cpu_model": "Test CPU", "load_average": [0, 0, 0]}
    return {"env": env, "ranks": 2, "budget_s": 50, "wall_s": 1.0, "statistic": "median", "gemm": gemm,
            "copy": copy_, "collectives": coll}


def _write(tmp_path, name: str = "probe.yaml", **rates):
    path = tmp_path / name
    doc = build_profile(_meas(**rates), base=load_yaml("gpus.yaml")["gpus"]["cpu"])
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _on(path, sets: tuple[str, ...] = ()) -> scenarios.Scenario:
    return scenarios.load("debug-cpu", [f"hardware.gpu=probe:{path}", f"hardware.network=probe:{path}", *sets])


def test_fit_recovers_alpha_and_beta_from_synthetic_timings():
    rows = [(m, 1.3e-4 + m / 2.2e9) for m in SIZES]
    f = fit_alpha_beta(rows)
    assert f.alpha_s == pytest.approx(1.3e-4, rel=1e-9) and f.beta_Bps == pytest.approx(2.2e9, rel=1e-9)
    noisy = [(m, t * (1.05 if i % 2 else 0.95)) for i, (m, t) in enumerate(rows)]  # +-5% on alternate rows
    g = fit_alpha_beta(noisy)
    assert g.alpha_s == pytest.approx(1.3e-4, rel=0.1) and g.beta_Bps == pytest.approx(2.2e9, rel=0.1)
    assert 0.04 < g.max_rel_err < 0.1


def test_fit_refuses_one_size_and_times_that_fall():
    with pytest.raises(ValueError, match="2 or more message sizes"):
        fit_alpha_beta([(4, 1e-4), (4, 1.1e-4)])
    with pytest.raises(ValueError, match="do not grow"):
        fit_alpha_beta([(4, 1e-3), (1 << 20, 1e-4)])


def test_profile_loads_as_a_catalog_entry_and_a_preset_that_reproduce_the_fit(tmp_path):
    path = _write(tmp_path, alpha=2e-4, beta=1.5e9)
    gpu, net = get_gpu(f"probe:{path}"), get_network(f"probe:{path}")
    assert gpu.name == f"probe:{path}" and gpu.base == "cpu"
    assert gpu.peak("fp32") == pytest.approx(1.5e11) and gpu.hbm_bw_Bps == pytest.approx(2.0e10)
    assert all(str(path) in s and "measured by gemtwin hw probe on testhost" in s
               for f, s in gpu.sources.items() if f != "tdp_w")
    for kind in ("all_reduce", "all_to_all"):  # the preset prices t = alpha + m / beta exactly
        for m in SIZES:
            t = collective_cost(kind=kind, msg_bytes=m, group_size=2, network=net).time_s
            assert t == pytest.approx(2e-4 + m / 1.5e9, rel=1e-9), (kind, m)
    assert load_profile(path) is load_profile(path)  # read once per file version


def test_debug_cpu_simulates_on_a_profile_and_its_rates_move_the_step(tmp_path):
    slow, fast = _write(tmp_path, "slow.yaml", fp32=5e10, bw=5e9), _write(tmp_path, "fast.yaml", fp32=4e11, bw=8e10)
    t_slow, t_fast = simulate(_on(slow)).step_time_s, simulate(_on(fast)).step_time_s
    bundled = simulate(scenarios.load("debug-cpu")).step_time_s
    assert t_slow > bundled > t_fast > 0


def test_a_cpu_calibration_still_applies_on_a_profile(tmp_path):
    from hwmodels.calibration import Calibration, CalibrationRun, utc_now
    from twin.workload import Hardware

    run = CalibrationRun(run_id="r", scenario="debug-cpu", source_path="r.json", n_steps=1, step_time_s=0.1)
    cal = Calibration(version=2, gpu="cpu", created_utc=utc_now(), runs=[run], scale={"gemm": 1.1})
    hw = Hardware.of(_on(_write(tmp_path)), cal)
    assert hw.gpu.base == "cpu" and hw.gpu.name.startswith("probe:") and hw.scale == {"gemm": 1.1}
    h200 = cal.model_copy(update={"gpu": "h200"})
    with pytest.raises(ValueError, match="measured on h200"):
        Hardware.of(_on(_write(tmp_path)), h200)


@pytest.mark.parametrize("field", ["gpu", "network"], ids=["hardware.gpu", "hardware.network"])
def test_a_bad_profile_is_one_line_naming_the_field_value_and_fix(tmp_path, field):
    r = CliRunner().invoke(app, ["simulate", "debug-cpu", "--set", f"hardware.{field}=probe:{tmp_path}/no.yaml"])
    assert r.exit_code == 2
    line = r.output.strip()
    assert "\n" not in line and f"hardware.{field}" in line and "no.yaml" in line and "gemtwin hw probe -o" in line
    assert "Traceback" not in r.output


def test_a_file_that_is_not_a_profile_is_one_line(tmp_path):
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump({"model": {}, "hardware": {}}))
    with pytest.raises(ValueError, match=r"is a scenario, not a hardware profile"):
        get_gpu(f"probe:{scen}")
    bad = tmp_path / "bad.yaml"
    doc = yaml.safe_load(_write(tmp_path).read_text())
    broken = copy.deepcopy(doc)
    broken["gpus"]["probe"]["hbm_bw_Bps"]["value"] = -1
    bad.write_text(yaml.safe_dump(broken))
    with pytest.raises(ValueError, match=r"^profile file .*bad.yaml.*: hbm_bw_Bps = -1"):
        get_gpu(f"probe:{bad}")
    with pytest.raises(ValueError, match="names no file"):
        get_gpu("probe:")


@pytest.mark.slow
def test_a_tiny_probe_writes_a_profile_that_loads_and_simulates(tmp_path):
    path = tmp_path / "probe.yaml"
    r = CliRunner().invoke(app, ["hw", "probe", "-o", str(path), "--budget-s", "3"])
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(path.read_text())
    assert doc["kind"] == "gemtwin hw probe profile" and set(doc["fits"]) == {"all_reduce", "all_to_all"}
    assert all(len(rows) >= 2 for rows in doc["measurements"]["collectives"].values())
    assert simulate(_on(path)).step_time_s > 0
