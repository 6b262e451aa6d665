"""Depth folding (twin.fold): a deep GEM model's step from two shallow copies, and its use in the planner."""

from __future__ import annotations

import pytest

import scenarios
from twin.fold import ACCUMS, FOLD_MIN_RATIO, at_depth, depth, depth_fold, fold_depths, fold_of, simulate_folded, with_accum
from twin.planner import plan
from twin.simulate import simulate

NUMBERS = ("step_time_s", "samples_per_s", "mfu", "balanced_step_time_s", "straggler_s", "memory_total_bytes",
           "model_flops_per_step", "host_s")  # fmt: skip
DICTS = ("breakdown_s", "compute_s_by_op_class", "compute_s_by_kernel", "comm_s_by_axis",
         "exposed_comm_s_split_by_axis", "memory_bytes")  # fmt: skip


@pytest.fixture(scope="module")
def deep():
    """The 5D debug scenario (MoE, cross layers, 8 ranks) with stacks deep enough to fold."""
    s = scenarios.load("debug-cpu-5d")
    deep = at_depth(s, FOLD_MIN_RATIO * fold_depths(s)[1])
    assert depth_fold(deep)
    return deep


@pytest.fixture(scope="module")
def accumulating():
    """The same at its own depth, with enough micro-batches per step to fold them."""
    s = scenarios.load("debug-cpu-5d")
    many = with_accum(s, FOLD_MIN_RATIO * ACCUMS[1] // 2)
    f = fold_of(many)
    assert f.accum and not f.layers
    return many


@pytest.mark.parametrize("imbalance", [False, True])
@pytest.mark.parametrize("which", ["deep", "accumulating", "both"])
def test_folded_step_equals_the_full_simulation(deep, accumulating, which, imbalance):
    s = {"deep": deep, "accumulating": accumulating, "both": with_accum(deep, 7)}[which]
    full, folded = simulate(s, imbalance=imbalance), simulate_folded(s, imbalance=imbalance)
    # depth folds exactly; this small model's contention drifts a little from one micro-batch to the
    # next (3e-5 of the step, 3e-4 of it between SM contention and exposed communication), which
    # twin.fold's docstring reports
    rel = 1e-9 if which == "deep" else 1e-4
    for f in NUMBERS:
        assert getattr(folded, f) == pytest.approx(getattr(full, f), rel=rel, abs=1e-15), f
    for f in DICTS:
        if which != "deep" and f in ("comm_s_by_axis", "exposed_comm_s_split_by_axis"):
            continue  # per axis, this toy's contention drift reaches 15% (twin.fold's docstring)
        a, b = getattr(folded, f), getattr(full, f)
        assert set(a) == set(b), f
        assert a == pytest.approx(b, rel=rel, abs=(1e-9 if which == "deep" else 1e-3) * full.step_time_s), f
    assert folded.memory_fits == full.memory_fits
    assert folded.goodput.goodput == pytest.approx(full.goodput.goodput, rel=1e-9)
    assert folded.resolved_scenario is s


def test_folded_plan_is_the_full_plan(deep):
    a = plan(deep, gpus=8, top=3, imbalance_final=False, compare_given=False, fold=True)
    b = plan(deep, gpus=8, top=3, imbalance_final=False, compare_given=False, fold=False)
    assert [e.candidate for e in a.top] == [e.candidate for e in b.top]
    assert [e.result.step_time_s for e in a.top] == pytest.approx([e.result.step_time_s for e in b.top], rel=1e-9)
    assert a.counts == b.counts


def test_what_does_not_fold():
    assert not fold_of(scenarios.load("gem-h200-1gpu"))  # 4 layers, one micro-batch: simulated in full
    assert fold_depths(scenarios.load("gem-b200-8k")) == (6, 12)  # a stage for each of its 6 cross layers
    assert depth(scenarios.load("dlrm-dcnv2")) is None
    s = scenarios.load("debug-cpu-5d")
    uneven = scenarios.validate({**s.model_dump(mode="json"), "model": {
        **s.model_dump(mode="json")["model"], "sequence": {**s.model_dump(mode="json")["model"]["sequence"],
                                                            "num_layers": 60}}})  # fmt: skip
    assert depth(uneven) is None
    assert not fold_of(uneven)
    with pytest.raises(ValueError, match="does not fold"):
        simulate_folded(uneven)


def test_a_goal_plan_answers_whether_a_layout_reaches_it():
    s = scenarios.load("gem-h200-2gpu")
    best = plan(s, gpus=2, top=1, imbalance_final=False, compare_given=False)
    rate = best.best.result.samples_per_s
    yes = plan(s, gpus=2, top=1, imbalance_final=False, compare_given=False, goal_samples_per_s=rate * 0.999)
    no = plan(s, gpus=2, top=1, imbalance_final=False, compare_given=False, goal_samples_per_s=rate * 1.001)
    assert best.reached is None
    assert yes.reached and yes.best.result.samples_per_s >= rate * 0.999
    assert no.reached is False
    assert yes.counts.simulated <= best.counts.simulated and no.counts.simulated <= best.counts.simulated


def test_a_planners_grown_batch_folds_too():
    """A forecast hands the planner a scenario whose global batch fits the GPU count it plans, not
    the scenario's own (7 GPUs × 256 of ``gem-h200-2gpu``'s 2): its shallow copies keep it."""
    from twin.forecast import batch_at

    s = batch_at(scenarios.load("gem-h200-2gpu"), 7, 256, 524_288)
    assert at_depth(s, 4).training.global_batch == 1792
