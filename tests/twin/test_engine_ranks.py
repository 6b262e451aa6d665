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
