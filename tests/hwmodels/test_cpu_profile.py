"""The `cpu` hardware profile against the measurement it was fitted to.

hwmodels/bench/cpu_profile.py measured the project's 2-core dev/CI CPU
(hwmodels/data/measured/cpu_2core_*.json); `python -m hwmodels.bench.fit_cpu` fitted the `cpu`
catalog entry (gpus.yaml), the `cpu` efficiency family (efficiency.yaml) and the `cpu-host`
preset (networks.yaml) to it. These tests hold the bundled data to that file: every number has a
source, the curves stay within a stated tolerance of every row they were fitted to (the others
are printed by fit_cpu, not pinned), and the gloo sweep is reproduced.
"""

from __future__ import annotations

import pytest

from hwmodels import collective_cost, get_gpu, get_network, kernel_time_s
from hwmodels.bench import fit_cpu
from hwmodels.kernels import KERNEL_KINDS, efficiency_table

CPU = get_gpu("cpu")
FILE = f"hwmodels/data/measured/{fit_cpu.profile_path().name}"

# Each curve's minimax error over its fitted rows (python -m hwmodels.bench.fit_cpu prints them),
# rounded up; the YAML's 3-digit rounding of the fitted numbers stays inside it.
TOLERANCE = {
    "gemm": 0.30, "gemm.bf16": 0.55, "elementwise": 0.15, "norm": 0.75, "embedding.fwd": 0.50,
    "embedding.bwd": 0.86, "optimizer": 0.05,
    "attention.sdpa.fwd": 0.55, "attention.sdpa.bwd": 0.55, "attention.jfa.fwd": 0.47, "attention.jfa.bwd": 0.60,
    "attention.gdpa.fwd": 0.05, "attention.gdpa.bwd": 0.05, "attention.block.fwd": 0.05, "attention.block.bwd": 0.05,
    "attention.asym.fwd": 0.25, "attention.asym.bwd": 0.05,
}


def test_profile_is_a_real_measurement_of_this_machine_with_its_load():
    p = fit_cpu.profile()
    env = p["env"]
    assert env["torch"].endswith("+cpu") and env["torch_threads"] == env["os_cpu_count"] == 2
    assert "EPYC" in env["lscpu"]["Model name"] and env["mem_total_bytes"] > 20 * 2**30
    assert p["passes"] >= 3 and all(len(r["pass_time_s"]) >= 3 for r in p["rows"])  # each case: its best pass
    loads = p["load_average"]["parts"]
    assert loads and all(len(x["before"]) == 3 and len(x["after"]) == 3 for x in loads)
    assert p["gloo"]["world_size"] == 2 and p["gloo"]["backend"] == "gloo"
    assert not [r["name"] for r in p["rows"] if "error" in r]


def test_catalog_entry_every_number_from_the_measurement_or_an_assumption():
    fields = [f"peak_flops.{d}" for d in CPU.peak_flops] + ["hbm_bytes", "hbm_bw_Bps", "sms", "nvlink_bw_Bps",
                                                            "tdp_w"]
    assert sorted(CPU.sources) == sorted(fields) and set(CPU.peak_flops) == {"fp32", "bf16"}
    for field, source in CPU.sources.items():
        assert FILE in source or source.startswith("assumption"), (field, source)
    assert CPU.sources["tdp_w"].startswith("assumption") and CPU.notes["tdp_w"]
    # the peaks are the best measured torch.mm rates, and say so; MFU divides by the bf16 one
    assert CPU.peak("fp32") == pytest.approx(fit_cpu.peak_flops("fp32"), rel=0.01)
    assert CPU.peak("bf16") == pytest.approx(fit_cpu.peak_flops("bf16"), rel=0.01)
    assert all("measured rate, not a datasheet peak" in CPU.notes[f"peak_flops.{d}"] for d in ("fp32", "bf16"))
    assert "MFU" in CPU.notes["peak_flops.bf16"]
    assert CPU.hbm_bw_Bps == pytest.approx(fit_cpu.copy_Bps(), rel=0.01)
    assert CPU.hbm_bytes == fit_cpu.profile()["env"]["mem_total_bytes"] and CPU.sms == 2
    assert CPU.nvlink_bw_Bps == pytest.approx(get_network("cpu-host").tiers[0].bw_per_gpu_Bps, rel=0.01)


def test_family_launch_is_the_measured_per_op_overhead_and_every_kind_has_a_source():
    rows = efficiency_table("cpu")
    assert {r.kind for r in rows} == set(KERNEL_KINDS)
    assert all(r.launch_s == pytest.approx(fit_cpu.launch_s(), rel=0.02) for r in rows)
    for r in rows:
        assert FILE in r.source or r.source.startswith("assumption"), (r.kind, r.side, r.source)
        if r.source.startswith("assumption"):
            assert r.note, (r.kind, r.side)  # says what it borrows


@pytest.mark.parametrize("name", sorted(fit_cpu.FITS))
def test_curves_reproduce_every_row_they_were_fitted_to(name):
    kind, dtype = name.removesuffix(".bf16"), fit_cpu.FITS[name].dtype
    rows = fit_cpu.fitted_rows(name)
    assert rows, name
    off = []
    for r in rows:
        t = kernel_time_s(kind=kind, flops=r.flops, bytes=r.bytes, gpu=CPU, dtype=dtype, segments=r.segments)
        if abs(t / r.seconds - 1) > TOLERANCE[name]:
            off.append(f"{r.label}: {t / r.seconds - 1:+.1%}")
    assert not off, off
    # the catalog carries the fit, not numbers tuned by hand
    assert fit_cpu.fit(name)["max_err"] <= TOLERANCE[name]


@pytest.mark.parametrize("kind", fit_cpu.GLOO_KINDS)
def test_cpu_host_reproduces_the_gloo_sweep(kind):
    net = get_network("cpu-host")
    assert [t.fabric for t in net.tiers] == ["host"]
    rows = [(m, t) for k, m, t in fit_cpu.gloo_rows() if k == kind]
    assert len(rows) == 9  # 4 B .. 64 MiB
    fitted = {m for m, _ in net.tiers[0].efficiency_points[kind]} | {4}  # 4 B: kind_latency_s
    assert len(fitted) >= 5
    for m, measured in rows:
        model = collective_cost(kind=kind, msg_bytes=m, group_size=2, network=net).time_s
        # exact at the fitted sizes (4-digit rounding); a row no slower than the 4-byte latency has
        # no point of its own (the curve is interpolated there), so it is held to 25%
        assert model == pytest.approx(measured, rel=0.01 if m in fitted else 0.25), (kind, m)


def test_debug_cpu_simulates_on_the_cpu_profile():
    """The CPU debug scenario is priced on the CPU it runs on, with MFU against its fp32 peak (its bf16
    matmuls are ~50x slower: against bf16 an fp32 run reads above 100%)."""
    from typer.testing import CliRunner

    import scenarios
    from twin.cli import app
    from twin.simulate import simulate

    s = scenarios.load("debug-cpu")
    assert (s.hardware.gpu, s.hardware.num_gpus, s.hardware.network) == ("cpu", 1, "cpu-host")
    result = simulate(s)
    assert result.mfu_peak == "cpu fp32 dense" and 0 < result.mfu < 1
    r = CliRunner().invoke(app, ["simulate", "debug-cpu"])
    assert r.exit_code == 0, r.output
    assert "debug-cpu: 1 × cpu on cpu-host" in r.output and "of cpu fp32 dense" in r.output
    r = CliRunner().invoke(app, ["hw", "show", "cpu"])
    assert r.exit_code == 0 and "kernel efficiency curves" in r.output and "attention.jfa" in r.output
