"""``gemtwin published``: the twin against published A100 DLRM results, each priced from its own
published configuration (twin/data/published)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from scenarios.distributions import id_cdf
from twin.cli import app
from twin.published import Published, compare, hybrid_hot_rows, scenario_of


@pytest.fixture(scope="module")
def pub():
    return Published.load()


def test_every_result_builds_the_scenario_of_its_published_configuration(pub):
    for rid, r in pub.results.items():
        s = scenario_of(pub, rid)
        assert s.hardware.num_gpus == r["num_gpus"]["value"] and s.training.global_batch == r["global_batch_size"]["value"]
        assert s.hardware.gpu.startswith("a100") and s.model.kind == "dlrm" and len(s.model.embeddings.pooled) == 26
        assert s.parallelism.dense_replicate == s.parallelism.sparse_shard == s.hardware.num_gpus
        how = pub.setup["results"][rid]
        assert how["stack"] in pub.setup["stacks"] and set(how.get("missing", ())) <= set(pub.setup["missing"])
    dcn = scenario_of(pub, "mlperf-v3.0-dell-xe9680-a100-dcnv2").model
    assert dcn.interaction == "dcnv2" and sum(f.pooling.max for f in dcn.embeddings.pooled) == 214


def test_the_hybrid_rule_and_the_datasets_id_law_give_dells_logged_frequent_categories(pub):
    """Dell's 4-GPU MLPerf v2.0 log: 60,328 frequent categories covering 91.89% of lookups
    (p_dup_max 0.02, batch 55,296 over 4 GPUs); the id law's exponent for Criteo was read off it."""
    skew = pub.setup["datasets"]["criteo-1tb"]["id_skew"]
    rows = pub.models["mlperf-dlrm-v1"]["table_rows"]["value"]
    hot = [hybrid_hot_rows(n, skew, batch=55296, gpus=4, p_dup_max=0.02) for n in rows]
    share = np.mean([id_cdf(np.array([k + 1.0]), n, skew)[0] for n, k in zip(rows, hot)])
    assert sum(hot) == pytest.approx(60328, rel=0.02) and share == pytest.approx(0.9189, abs=0.01)
    s = scenario_of(pub, "mlperf-v2.0-dell-xe8545-4gpu")
    assert [f.hot_rows for f in s.model.embeddings.pooled] == hot
    # more nodes, a higher bar: fewer frequent categories on 14 nodes than on one
    assert hybrid_hot_rows(rows[0], skew, batch=71680, gpus=112, ratio=0.5) < hot[0]


def test_a_series_compares_each_points_ratio_to_its_first(pub):
    c = compare(pub, only="torchrec-2204")
    assert [r.id for r in c.rows] == ["torchrec-2204-1gpu-b16k", "torchrec-2204-4gpu-b16k", "torchrec-2204-8gpu-b16k"]
    (s,) = c.scaling
    assert s.gpus == (1, 4, 8) and s.strong and s.published[0] == s.twin[0] == 1.0
    assert s.published[2] == pytest.approx(1671168 / 740065)
    assert s.errors[1] == pytest.approx(c.rows[2].twin / c.rows[0].twin / s.published[2] - 1)


def test_the_command_prints_both_tables_and_refuses_an_unknown_filter(tmp_path):
    r = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["published", "--only", "xe8545", "--json", str(tmp_path / "c.json"),
                                 "--scenarios", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    assert "mlperf-v2.0-dell-xe8545-4gpu" in r.output and "results within 15%" in r.output
    assert (tmp_path / "c.json").exists() and (tmp_path / "s" / "mlperf-v2.0-dell-xe8545-4gpu.yaml").exists()
    bad = CliRunner().invoke(app, ["published", "--only", "h100"])
    assert bad.exit_code == 2 and "--only 'h100' matches no result" in bad.output


def test_the_committed_table_is_what_the_command_prints_today(pub):
    """twin/data/published/comparison.json (`gemtwin published --json`) is the twin's current answer:
    a change that moves a prediction re-writes it (and comparison.txt) in the same commit."""
    import json
    from pathlib import Path

    want = json.loads((Path(__file__).parents[2] / "twin/data/published/comparison.json").read_text())
    got = compare(pub)
    assert [r.id for r in got.rows] == [r["id"] for r in want["rows"]]
    for r, w in zip(got.rows, want["rows"]):
        assert r.twin == pytest.approx(w["twin"], rel=1e-9) and r.published == w["published"], r.id
        assert list(r.missing) == w["missing"], r.id
    for s, w in zip(got.scaling, want["scaling"], strict=True):
        assert list(s.twin) == pytest.approx(w["twin"], rel=1e-9), s.series
