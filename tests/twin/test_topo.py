"""`gemtwin hw topo`: tier sizes at a GPU count and the aggregated picture."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hwmodels.network import get_network
from twin.cli import app
from twin.topo import aggregated_graph, draw_topology, tier_counts


def test_tier_counts_h100_roce_4k():
    counts = tier_counts(get_network("h100-roce-3tier"), 4096)
    assert [(c.name, c.domain_gpus, c.domains) for c in counts] == [
        ("nvlink", 8, 512), ("leaf", 16, 256), ("spine", 3072, 2), ("superspine", 24576, 1)]


def test_tier_counts_stop_at_the_first_tier_that_holds_the_job():
    assert [c.name for c in tier_counts(get_network("h100-ib"), 8)] == ["nvlink"]
    assert [c.domains for c in tier_counts(get_network("gb200-nvl72"), 100_000)] == [1389, 174, 11, 1]


def test_aggregated_graph_folds_large_fan_out():
    g = aggregated_graph(get_network("gb200-nvl72"), 100_000, max_children=3)
    assert len(g) < 60  # 100k GPUs, a few dozen boxes
    folded = [d["label"] for _, d in g.nodes(data=True) if d["label"].startswith("+")]
    assert "+9 more\nspine domains" in folded


@pytest.mark.parametrize("n, message", [
    (0, "--gpus (0) must be at least 1"),
    (40_000, "--gpus (40000) exceeds network 'h100-ib' (32768 GPUs); pick a larger preset"),
])
def test_bad_gpu_counts(n, message):
    with pytest.raises(ValueError) as e:
        tier_counts(get_network("h100-ib"), n)
    assert str(e.value) == message


def test_png_and_cli(tmp_path):
    out = draw_topology(get_network("h100-roce-3tier"), 4096, tmp_path / "t.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.png"]
    r = CliRunner().invoke(app, ["hw", "topo", "--preset", "h100-ib", "--gpus", "512",
                                 "--png", str(tmp_path / "c.png")])  # fmt: skip
    assert r.exit_code == 0 and "leaf" in r.output and (tmp_path / "c.png").exists()
    r = CliRunner().invoke(app, ["hw", "topo", "--preset", "nope", "--gpus", "8"])
    assert r.exit_code == 2 and r.output.startswith("error: unknown network preset 'nope'")
