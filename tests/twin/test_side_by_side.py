"""twin.side_by_side: calls run in forked children give what they give in turn, exceptions included."""

import pytest

from twin.side_by_side import side_by_side


def test_results_in_order_and_equal_to_the_calls_in_turn():
    calls = [lambda k=k: [k * 0.1 + i / 3 for i in range(1000)] for k in range(3)]
    assert side_by_side(calls) == [call() for call in calls]
    assert side_by_side(calls[:1]) == [calls[0]()]
    assert side_by_side([]) == []


def test_a_childs_exception_is_raised_here():
    def boom():
        raise ValueError("model.moe.num_experts (63) must be divisible by parallelism.expert (8)")

    with pytest.raises(ValueError, match="num_experts"):
        side_by_side([lambda: 1, boom])


def test_a_simulated_deep_layout_is_the_same_side_by_side():
    """The planner simulates a deep model's shallow copies side by side (twin.fold): the same
    step, to the bit, as simulating them in turn."""
    import scenarios
    from twin.fold import at_depth, depth_fold
    from twin.simulate import simulate_timelines

    s = at_depth(scenarios.load("gem-h200-2gpu"), 16)
    views = depth_fold(s).copies(s)
    calls = [lambda v=v: simulate_timelines(v, imbalance=False)[0].step_time_s for v in views]
    assert side_by_side(calls) == [call() for call in calls]
