"""Several rank classes in one engine: a collective starts when its slowest member arrives."""

from __future__ import annotations

import pytest

from twin.engine import simulate_graph, simulate_ranks
from twin.graph import Op, OpGraph


def rank(compute_s: float) -> OpGraph:
    return OpGraph([
        Op("fwd", "compute", compute_s),
        Op("ar", "comm.dense_replicate", 0.5, deps=("fwd",)),
        Op("opt", "compute", 0.25, deps=("ar",)),
    ])


def test_collective_waits_for_the_slowest_rank():
    t = simulate_ranks({"fast": rank(1.0), "slow": rank(2.0)})
    for r in ("fast", "slow"):
        assert (t[r].span("ar").start_s, t[r].span("ar").end_s) == (2.0, 2.5)
        assert t[r].span("opt").end_s == 2.75
    assert t["fast"].idle_s == pytest.approx(1.0)  # the fast rank's straggler wait
    assert t["slow"].idle_s == 0.0


def test_single_rank_is_the_plain_engine():
    alone = simulate_graph(rank(1.0))
    assert simulate_ranks({"r": rank(1.0)})["r"] == alone
    assert alone.step_time_s == 1.75


def test_ops_only_one_rank_has_do_not_wait():
    a = OpGraph([Op("x", "comm.expert", 1.0)])
    b = OpGraph([Op("fwd", "compute", 3.0)])
    t = simulate_ranks({"a": a, "b": b})
    assert t["a"].span("x").end_s == 1.0


def test_collectives_on_one_link_share_it():
    both = OpGraph([Op("a", "comm.dense_replicate", 1.0, link="leaf"),
                    Op("b", "comm.sparse_replica", 1.0, link="leaf")])
    t = simulate_graph(both)
    assert (t.span("a").end_s, t.span("b").end_s) == (2.0, 2.0)
    apart = OpGraph([Op("a", "comm.dense_replicate", 1.0, link="leaf"),
                     Op("b", "comm.dense_shard", 1.0, link="nvlink")])
    t = simulate_graph(apart)
    assert (t.span("a").end_s, t.span("b").end_s) == (1.0, 1.0)


def test_a_late_collective_slows_the_running_one_only_while_they_overlap():
    g = OpGraph([Op("a", "comm.x", 1.0, link="leaf"), Op("w", "compute", 0.5),
                 Op("b", "comm.y", 1.0, deps=("w",), link="leaf")])
    t = simulate_graph(g)
    # a: 0.5 s alone, then half rate: its last 0.5 s of work takes 1 s -> ends at 1.5;
    # b: from 0.5 at half rate until 1.5 (0.5 done), then alone -> ends at 2.0
    assert t.span("a").end_s == pytest.approx(1.5) and t.span("b").end_s == pytest.approx(2.0)
