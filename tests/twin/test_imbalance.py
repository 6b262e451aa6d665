"""Imbalance from data: rank classes drawn from the length laws, and the straggler's cost."""

from __future__ import annotations

import pytest

import scenarios
from twin.imbalance import rank_classes
from twin.simulate import simulate


def test_classes_cover_all_ranks_and_the_top_one_is_the_straggler():
    classes = rank_classes(scenarios.load("gem-h100-4k"))
    assert [c.name for c in classes] == ["p0-50", "p50-90", "p90-100"]
    assert sum(c.weight for c in classes) == pytest.approx(1.0)
    loads = [c.load for c in classes]
    assert loads == sorted(loads) and loads[0] < 1 < loads[-1]


def test_same_seed_same_classes_other_seed_other_draws():
    a = rank_classes(scenarios.load("gem-h100-4k"))
    assert a == rank_classes(scenarios.load("gem-h100-4k"))
    b = rank_classes(scenarios.load("gem-h100-4k", ["training.seed=7"]))
    assert [c.load for c in a] != [c.load for c in b]


def test_straggler_costs_time_and_fixed_lengths_cost_nothing():
    r = simulate(scenarios.load("gem-h200-2gpu"))
    assert r.straggler_s > 0 and r.step_time_s == pytest.approx(r.balanced_step_time_s + r.straggler_s)
    fixed = scenarios.load("gem-h200-2gpu", ["model.embeddings.sequences.0.length={shape: fixed, max: 768}"])
    rf = simulate(fixed)
    assert rf.straggler_s == pytest.approx(0.0, abs=1e-12)
    assert all(c.load == pytest.approx(1.0) for c in rf.rank_classes)


def test_fast_ranks_wait_for_the_slow_one():
    r = simulate(scenarios.load("gem-h100-4k"))
    waits = {c.name: c.wait_s for c in r.rank_classes}
    assert waits["p90-100"] == pytest.approx(0.0, abs=1e-9)
    assert waits["p0-50"] > waits["p50-90"] > 0


def test_one_gpu_and_dlrm_have_a_single_class():
    assert [c.name for c in rank_classes(scenarios.load("gem-h200-1gpu"))] == ["all"]
    assert [c.name for c in rank_classes(scenarios.load("dlrm-dcnv2"))] == ["all"]


def test_rank_classes_equal_simulating_every_rank():
    """Scale by symmetry: 3 classes give the step of 64 individually simulated GPUs (<1%)."""
    s = scenarios.load("gem-h100-4k", [
        "hardware.num_gpus=64", "parallelism.dense_shard=8", "parallelism.dense_replicate=8",
        "parallelism.sparse_shard=64", "parallelism.sparse_replica=1", "training.global_batch=32768"])
    classes, full = simulate(s), simulate(s, per_rank=True)
    assert len(classes.rank_classes) == 3 and len(full.rank_classes) == 64
    assert classes.step_time_s == pytest.approx(full.step_time_s, rel=0.01)


def test_embedding_shard_load_follows_table_sharding_and_id_skew():
    from scenarios.placement import table_plan
    from twin.imbalance import embedding_load_factor

    s = scenarios.load("gem-h100-4k")
    assert table_plan(s) == {"user": "table", "ad": "table", "item": "row", "action": "row"}
    # row-wise with hashed ids: the item table's hottest id (6% of its lookups at skew 1.1)
    # lands on one of 1,024 shards, which then carries several times the mean
    assert 5 < embedding_load_factor(s) < 9
    milder = scenarios.load("gem-h100-4k", ["model.embeddings.sequences.0.tables.0.id_skew=0.8"])
    assert 1.0 < embedding_load_factor(milder) < 1.3
    assert simulate(s).step_time_s > simulate(milder).step_time_s
    all_table = scenarios.load("gem-h100-4k", [
        "parallelism.table_sharding={user: table, ad: table, item: table, action: table}"])
    # the item table (1,152 tokens x 256 dims per sample) lands whole on one of 1,024 shards
    assert embedding_load_factor(all_table) > 50
    uniform = [f"model.embeddings.{p}.id_skew=0" for p in (
        "pooled.0", "pooled.1", "sequences.0.tables.0", "sequences.0.tables.1")]
    all_row = scenarios.load("gem-h100-4k", uniform + [
        "parallelism.table_sharding={user: row, ad: row, item: row, action: row}"])
    assert embedding_load_factor(all_row) == pytest.approx(1.0)
    assert embedding_load_factor(scenarios.load("gem-h200-1gpu")) == 1.0


def test_hot_id_shares_sum_like_the_power_law():
    from twin.imbalance import hot_id_shares

    shares = hot_id_shares(20_000_000, 1.05, 8)
    assert shares[0] == pytest.approx(0.0599, abs=1e-4)  # executor.data.zipf_ids: 0.0598 drawn
    assert list(shares) == sorted(shares, reverse=True)
    assert hot_id_shares(10, 0.0, 4).tolist() == []  # uniform ids: none hotter
    assert hot_id_shares(3, 1.0, 64).sum() == pytest.approx(1.0)


def test_moe_routing_imbalance_shrinks_with_tokens_and_is_capped():
    from twin.imbalance import moe_load_factor

    big = moe_load_factor(scenarios.load("gem-h100-4k"))
    small = moe_load_factor(scenarios.load("gem-h100-4k", ["training.micro_batch=1",
                                                           "training.global_batch=4096"]))
    assert 1.0 < big < small <= 1.25  # capacity factor 1.25
    tiny = scenarios.load("gem-h100-4k", ["training.micro_batch=1", "training.global_batch=4096",
                                          "model.moe.capacity_factor=1.05"])
    assert moe_load_factor(tiny) == 1.05
    assert moe_load_factor(scenarios.load("gem-h200-1gpu")) == 1.0


def test_every_group_of_an_axis_crosses_the_same_tiers():
    """One topology class: in every bundled scenario, all groups of a mesh axis span the same
    outermost tier (what tier_for_group answers for all of them), checked rank by rank."""
    import numpy as np

    from hwmodels.network import get_network
    from twin.workload import axis_group

    for name in scenarios.bundled():
        s = scenarios.load(name)
        net, n = get_network(s.hardware.network), s.hardware.num_gpus
        for axis in ("dense_shard", "dense_replicate", "expert", "sparse_shard", "sparse_replica"):
            size, stride = axis_group(s, axis)
            ranks = np.arange(n)
            first = ranks - (ranks // stride % size) * stride  # each rank's group's first member
            last = first + (size - 1) * stride
            for t in net.tiers:
                inside = first // t.domain_gpus == last // t.domain_gpus
                mixed = inside.any() and not inside.all()  # some groups inside, others across
                assert not mixed, (name, axis, t.name)
            expected = net.tier_for_group(group_size=size, stride=stride)
            innermost = next(t for t in net.tiers if (first // t.domain_gpus == last // t.domain_gpus).all())
            assert innermost.name == expected.name, (name, axis)
