"""Properties every prediction keeps, over random valid scenarios (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from test_simulate import random_scenario
from twin.imbalance import rank_classes
from twin.simulate import simulate
from twin.workload import Hardware, build_graph

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@given(random_scenario())
@FAST
def test_step_is_never_shorter_than_any_stream_of_the_slowest_rank(s):
    r = simulate(s)
    hw = Hardware.of(s)
    slowest = max(rank_classes(s), key=lambda c: c.load)
    for stream, ops in build_graph(s, hw, slowest.seq).by_stream().items():
        # each stream runs its ops one after another, at best at their isolated durations
        assert r.step_time_s >= sum(op.duration_s for op in ops) * (1 - 1e-9), stream


@given(random_scenario())
@FAST
def test_mfu_never_exceeds_the_best_kernel_efficiency(s):
    # the best any kernel reaches is the GEMM curve's eff_max (0.762 of bf16 on Hopper, 0.655
    # of MXFP8 on Blackwell); random scenarios name the peak of the precision they compute in
    assert 0 < simulate(s).mfu <= 0.8


@given(random_scenario())
@FAST
def test_more_bandwidth_never_slows_a_step(s):
    # b200-ib has twice h100-ib's NVLink and NIC bandwidth, same tiers and latencies
    slow = s.model_copy(update={"hardware": s.hardware.model_copy(update={"network": "h100-ib"})})
    fast = s.model_copy(update={"hardware": s.hardware.model_copy(update={"network": "b200-ib"})})
    assert simulate(fast).step_time_s <= simulate(slow).step_time_s * (1 + 1e-9)


@given(random_scenario())
@FAST
def test_sm_free_is_never_slower(s):
    p = s.parallelism
    based = s.model_copy(update={"parallelism": p.model_copy(update={"sm_free_collectives": False})})
    free = s.model_copy(update={"parallelism": p.model_copy(update={"sm_free_collectives": True})})
    assert simulate(free).step_time_s <= simulate(based).step_time_s * (1 + 1e-9)
