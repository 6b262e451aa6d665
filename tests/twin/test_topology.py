"""Topology-position rank classes (twin.topology): ranks whose groups lie differently on the fabric."""

from __future__ import annotations

import pytest

import scenarios
from hwmodels.network import get_network
from twin import topology
from twin.simulate import simulate
from twin.topology import topology_classes

# 48 H100s on h100-roce-3tier (8-GPU nodes, 16-GPU racks) with sparse_shard 6: groups 0, 3, 4, 7
# stay in one node; groups 1, 2, 5, 6 straddle two nodes (and, for 2 and 5, two racks)
MISALIGNED = ["hardware.num_gpus=48", "parallelism.dense_replicate=6", "parallelism.sparse_shard=6",
              "parallelism.sparse_replica=8", "training.global_batch=6144"]  # fmt: skip


def _misaligned():
    return scenarios.load("gem-h100-4k", MISALIGNED)


def _crossing(shape) -> list[int]:
    return [lv.tier for lv in shape.levels]


@pytest.mark.parametrize("name", scenarios.bundled())
def test_aligned_bundled_scenarios_have_one_topology_class(name):
    s = scenarios.load(name)
    classes, of_rank = topology_classes(s, get_network(s.hardware.network))
    assert [(c.name, c.weight) for c in classes] == [("all", 1.0)] and of_rank is None


def test_misaligned_groups_form_classes_of_their_ranks():
    classes, of_rank = topology_classes(_misaligned(), get_network("h100-roce-3tier"))
    assert [(c.name, c.weight) for c in classes] == [("topo0", 0.5), ("topo1", 0.5)]
    crossing, inside = (classes[0], classes[1]) if len(classes[0].shapes["sparse_shard"].levels) > 1 else \
        (classes[1], classes[0])  # fmt: skip
    assert _crossing(inside.shapes["sparse_shard"]) == [0]  # NVLink only
    assert _crossing(crossing.shapes["sparse_shard"]) == [0, 2]  # leaf- and spine-crossing merged: the spine
    by_group = [int(of_rank[6 * g]) for g in range(8)]
    assert [classes[i] is crossing for i in by_group] == [False, True, True, False, False, True, True, False]
    assert all(len(set(of_rank[6 * g:6 * g + 6].tolist())) == 1 for g in range(8))


def test_positions_join_the_load_classes_and_the_step_waits_for_the_slowest():
    """The load classes in the common position, the other position at the straggler's load
    (standing for all its ranks): 3 + 2 - 1 graphs."""
    r = simulate(_misaligned())
    names = [c.name for c in r.rank_classes]
    assert names == ["p0-50/topo0", "p50-90/topo0", "p90-100/topo0", "p90-100/topo1"]
    assert sum(c.weight for c in r.rank_classes) == pytest.approx(1.0)
    waits = {c.name: c.wait_s for c in r.rank_classes}
    slowest = min(waits, key=waits.get)
    assert slowest.startswith("p90-100/") and waits[slowest] == pytest.approx(0.0, abs=1e-9)
    assert r.straggler_s > 0 and r.step_time_s == pytest.approx(r.balanced_step_time_s + r.straggler_s)


def test_topology_classes_equal_simulating_every_rank():
    """4 classes (3 loads in the common position, the straggler in the other) give the step of the
    48 GPUs simulated one by one (<0.5%)."""
    s = _misaligned()
    classes, full = simulate(s), simulate(s, per_rank=True)
    assert len(classes.rank_classes) == 4 and len(full.rank_classes) == 48
    assert classes.step_time_s == pytest.approx(full.step_time_s, rel=0.005)


def test_cost_grows_with_classes_not_gpus():
    """One graph per class, whatever the GPU count (100,000 GB200s with 1,000-rank sparse groups on
    72-GPU domains: a few topology positions)."""
    from twin.bench_scale import overrides_for

    s = scenarios.load("gem-h100-4k", overrides_for(100_000))
    built = []
    r = simulate(s, on_graph=lambda: built.append(1))
    assert len(built) == len(r.rank_classes) <= 3 + topology.MAX_CLASSES - 1


def test_positions_beyond_the_cap_fold_into_the_costliest(monkeypatch):
    """Without merging there are three positions (in one node; across nodes of one rack: leaf;
    across racks: spine); capped at 2 classes, the rarer two fold into one that takes the
    costlier shape (the spine crossing) for all of their ranks."""
    monkeypatch.setattr(topology, "MERGE_TOLERANCE", 0.0)
    net = get_network("h100-roce-3tier")
    three, _ = topology_classes(_misaligned(), net)
    assert sorted(_crossing(c.shapes["sparse_shard"]) for c in three) == [[0], [0, 1], [0, 2]]
    monkeypatch.setattr(topology, "MAX_CLASSES", 2)
    two, of_rank = topology_classes(_misaligned(), net)
    assert [(c.name, c.weight) for c in two] == [("topo0", 0.5), ("topo1", 0.5)]
    assert _crossing(two[0].shapes["sparse_shard"]) == [0] and _crossing(two[1].shapes["sparse_shard"]) == [0, 2]
    assert [int(of_rank[6 * g]) for g in range(8)] == [0, 1, 1, 0, 0, 1, 1, 0]
