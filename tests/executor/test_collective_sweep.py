"""The collective sweep (executor/bench/collective_sweep.py): its size parsing and bus factors, and
one 2-rank gloo sweep (the default run's one multi-process test of this kind): every op checked on
known values, bus bandwidth = algorithm bandwidth × nccl-tests' factor, the zero-CTA path recorded
as unavailable off NCCL with its reason, and the JSON written whole."""

from __future__ import annotations

import json

import pytest

from executor.bench import collective_sweep as cs


def test_sizes_and_bus_factors():
    assert cs.parse_size("4M") == 4 << 20 and cs.parse_size("64K") == 65536 and cs.parse_size("1g") == 1 << 30
    assert cs.parse_size("1000") == 1000
    with pytest.raises(ValueError, match="'4Q' is not a size"):
        cs.parse_size("4Q")
    assert cs.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert cs.bus_factor("all_gather", 8) == cs.bus_factor("all_to_all", 8) == pytest.approx(0.875)


def test_bad_arguments_are_one_line_errors(capsys):
    for argv, msg in ((["--nproc", "1"], "--nproc 1: a collective sweep needs at least 2 ranks"),
                      (["--ops", "broadcast"], "--ops: 'broadcast' is not one of"),
                      (["--sizes", "x"], "--sizes: 'x' is not a size")):
        with pytest.raises(SystemExit) as e:
            cs.main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err


def test_two_rank_gloo_sweep_checks_every_op_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert cs.main(["--nproc", "2", "--device", "cpu", "--sizes", "4K,64K", "--iters", "2", "--reps", "2",
                    "--warmup", "1", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["world_size"] == 2 and r["backend"] == "gloo"
    assert [(row["op"], row["size_bytes"]) for row in r["rows"]] == [
        ("all_gather", 2048), ("all_gather", 32768), ("reduce_scatter", 2048), ("reduce_scatter", 32768),
        ("all_reduce", 4096), ("all_reduce", 65536), ("all_to_all", 4096), ("all_to_all", 65536)]
    for row in r["rows"]:
        assert row["path"] == "sm" and row["time_us"] > 0
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * cs.bus_factor(row["op"], 2))
    assert "no copy-engine path on gloo" in r["unavailable"]["zero_cta"]
    assert not list(tmp_path.glob("*.tmp"))
    assert "zero_cta: not run" in capsys.readouterr().out
