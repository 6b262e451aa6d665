"""The fast estimator (``twin.estimate``) against the engine: exact where the engine's rules need
no rounds, close where contention does, and honest about where it cannot be trusted."""

import random

import pytest

import scenarios
from twin.engine import simulate_graph
from twin.estimate import estimate, estimate_graph
from twin.graph import Op, OpGraph


def compute(name, d, *deps):
    return Op(name, "compute", d, deps=deps)


def comm(name, d, *deps, stream="comm.dense_shard", sm=0.0, link=""):
    return Op(name, stream, d, deps=deps, sm_fraction=sm, link=link)


def test_critical_path_and_stream_order_are_exact():
    g = OpGraph([compute("a", 1.0), comm("ag", 2.0), compute("b", 1.0, "ag"), comm("rs", 0.5, "b"),
                 compute("c", 3.0), compute("opt", 0.25, "rs")])
    e = estimate_graph(g)
    assert e.step_time_s == simulate_graph(g).step_time_s == 6.25
    assert e.lower_bound_s == e.step_time_s and e.trusted


def test_sm_contention_matches_the_engine_example():
    """ENGINE.md's example: a 1 s op with a 0.5-SM collective on [0, 0.5] ends at 1.25 s."""
    g = OpGraph([compute("mm", 1.0), comm("ar", 0.5, sm=0.5)])
    e = estimate_graph(g)
    assert e.step_time_s == pytest.approx(simulate_graph(g).step_time_s, rel=1e-3)
    assert e.lower_bound_s == 1.0  # no contention: below the engine's step, never above


def test_link_sharing_matches_the_engine():
    """Two collectives on one link from t = 0 (1 s and 2 s alone): 2 s and 3 s shared."""
    g = OpGraph([comm("a", 1.0, stream="comm.x", link="leaf"), comm("b", 2.0, stream="comm.y", link="leaf")])
    e = estimate_graph(g)
    assert e.step_time_s == pytest.approx(simulate_graph(g).step_time_s, rel=1e-3)


@pytest.mark.parametrize("name", ["dlrm-dcnv2", "gem-h200-2gpu", "gem-h100-4k"])
def test_bundled_scenarios_within_two_percent(name):
    from twin.simulate import simulate

    s = scenarios.load(name)
    e, r = estimate(s), simulate(s, imbalance=False)
    assert e.trusted
    assert e.step_time_s == pytest.approx(r.step_time_s, rel=0.02)
    assert min(g.lower_bound_s for g in e.graphs.values()) <= r.step_time_s * (1 + 1e-9)
    split = e.exposed_comm_s_split_by_axis()
    assert sum(split.values()) == pytest.approx(e.breakdown_s()["exposed_comm"], rel=1e-6, abs=1e-12)


def test_random_layouts_within_two_percent():
    """A few random layouts of the planner's space (``python -m twin.bench_estimate`` runs hundreds)."""
    from twin.bench_estimate import space
    from twin.plan_space import apply
    from twin.simulate import simulate

    s = scenarios.load("gem-h200-2gpu")
    cands, gpu, net, gb = space(s, 2)
    for c in random.Random(0).sample(cands, 4):
        sc = apply(s, c, gpus=2, gpu=gpu, network=net, global_batch=gb)
        e, r = estimate(sc), simulate(sc, imbalance=False)
        assert e.step_time_s == pytest.approx(r.step_time_s, rel=0.02), c.label()


def test_cpu_collectives_holding_every_core_are_not_trusted():
    """gloo's collectives hold the CPU (sm_fraction 1): compute crawls while they run and the
    rounds do not settle, so a search must simulate such layouts instead."""
    e = estimate(scenarios.load("debug-cpu-5d"))
    assert not e.trusted
    assert max(g.peak_sm_share for g in e.graphs.values()) > 0.5


@pytest.mark.parametrize("name", ["dlrm-dcnv2", "gem-h200-2gpu", "gem-h100-4k"])
def test_lower_bound_parts_is_the_first_rounds_schedule(name):
    """``lower_bound_parts`` (what a planner asks of every candidate it estimates) runs the
    no-contention schedule on its own: the very number of ``estimate_graph``'s first round."""
    from twin.estimate import class_graphs, lower_bound_parts

    graphs = class_graphs(scenarios.load(name))
    devices, host = lower_bound_parts(graphs)
    assert devices == max(max(estimate_graph(g, rounds=1).end_s) for g in graphs.values())
    assert host == max(g.host_s for g in graphs.values())
