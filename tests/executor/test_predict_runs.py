"""executor/bench/predict_runs.py: the predictions a multi-GPU campaign commits before its runs
(issues 28 and 29): every variant the device script trains, from the twin alone and calibrated,
with the step, MFU, each axis's collective time and exposed part, and memory per rank."""

from __future__ import annotations

import json

import scenarios
from executor.bench import predict_runs as pr


def test_variants_compare_what_the_issues_ask():
    two = pr.variants(scenarios.load("gem-h200-2gpu"))  # no table replicas: the shard group becomes them
    assert two["replicated_sync"] == ["parallelism.sparse_strategy=replicated_sync", "parallelism.sparse_shard=1",
                                      "parallelism.sparse_replica=2"]
    assert two["sm_free"] == ["parallelism.sm_free_collectives=true"] and two["bundled"] == []
    eight = pr.variants(scenarios.load("gem-h200-8gpu"))  # 2D tables: the same layout, synced replicas
    assert eight["replicated_sync"] == ["parallelism.sparse_strategy=replicated_sync"]


def test_predictions_of_the_two_gpu_campaign(tmp_path, capsys):
    assert pr.main(["gem-h200-2gpu", "--out", str(tmp_path)]) == 0
    d = json.loads((tmp_path / "predictions.json").read_text())
    assert d["num_gpus"] == 2 and set(d["variants"]) == {"bundled", "replicated_sync", "sm_free"}
    b, r = d["variants"]["bundled"], d["variants"]["replicated_sync"]
    for v in (b, r):
        for tag in ("twin", "calibrated"):
            p = v[tag]
            assert 0 < p["mfu"] < 1 and p["memory_total_bytes"] == sum(p["memory_bytes"].values())
            assert set(p["exposed_comm_s_by_axis"]) <= set(p["comm_s_by_axis"])
            assert all(p["exposed_comm_s_by_axis"][a] <= p["comm_s_by_axis"][a] + 1e-12 for a in p["exposed_comm_s_by_axis"])
    # the calibration moves compute, not the layout's collectives; replicas synced by all-reduce cost more
    assert b["calibrated"]["step_time_s"] != b["twin"]["step_time_s"]
    assert r["twin"]["comm_s_by_axis"]["sparse_replica"] > 10 * b["twin"]["comm_s_by_axis"]["sparse_shard"]
    assert "| bundled | twin |" in capsys.readouterr().out


def test_bad_scenario_is_a_one_line_error(tmp_path, capsys):
    assert pr.main(["no-such-scenario", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("predict_runs: ") and "\n" not in err
