"""The scale benchmark: its small points run and its output has the promised shape (no timing)."""

from __future__ import annotations

import json

import pytest

import scenarios
from twin.bench_scale import choose_network, main, overrides_for, run_bench

POINT_KEYS = {"num_gpus", "network", "gpu", "overrides", "wall_s", "wall_s_runs", "simulate_s",
              "cpu_s", "num_ops", "step_time_s", "mfu"}  # fmt: skip


def test_small_points_have_the_promised_shape(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--sizes", "8,512", "--repeats", "1", "--warmups", "0", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [p["num_gpus"] for p in doc["points"]] == [8, 512]
    for p in doc["points"]:
        assert set(p) == POINT_KEYS
        assert p["wall_s"] > 0 and p["simulate_s"] > 0 and len(p["wall_s_runs"]) == 1
        assert p["num_ops"] > 0 and p["step_time_s"] > 0
    assert doc["ratio_largest_to_smallest"] > 0
    assert [t["what"] for t in doc["targets"]] == ["wall_s ratio 512 / 8 GPUs"]
    printed = capsys.readouterr().out
    assert "ratio t(512) / t(8)" in printed and f"wrote {out}" in printed


@pytest.mark.parametrize("num_gpus", [8, 512, 4_096, 16_384, 100_000])
def test_every_size_rescales_to_a_valid_scenario(num_gpus):
    s = scenarios.load("gem-h100-4k", overrides_for(num_gpus))
    p = s.parallelism
    assert s.hardware.num_gpus == num_gpus
    assert p.dense_shard * p.dense_replicate == p.sparse_shard * p.sparse_replica == num_gpus
    assert p.sparse_shard <= 1_024 and s.grad_accum == 1


def test_network_is_kept_when_it_holds_the_gpus_else_the_smallest_that_does():
    assert choose_network(16_384, "h100-roce-3tier") == "h100-roce-3tier"
    assert choose_network(100_000, "h100-roce-3tier") == "gb200-nvl72"
    with pytest.raises(ValueError, match="no network preset holds"):
        choose_network(10**7, "h100-roce-3tier")


def test_bad_sizes_are_one_line_errors(capsys):
    assert main(["--sizes", "12", "--repeats", "1", "--warmups", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "multiple of 8" in err
    with pytest.raises(ValueError, match="--repeats"):
        run_bench((8,), repeats=0)
