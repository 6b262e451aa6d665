"""Expert parallelism trains what one process with the same capacity trains.

A rank of an ``expert`` group of EP ranks holds E/EP experts of each MoE layer, its tokens go to
them in one all-to-all of a capacity-padded buffer and come back in another, and what overflows
an expert's capacity ``C = ceil(capacity_factor · T·k / E)`` (per source rank, per micro-batch)
is dropped. Data is seeded per micro-batch, so one process that applies the same capacity to
each micro-batch (``executor.moe.set_capacity``) drops exactly the same assignments: the losses,
dense weights (FSDP2), tables and the experts (gathered from every rank into the one-process
stacked layout) must match it, and so must the dropped counts in the RunRecord. Every check of a
world runs in one launch (``test_distributed``'s pattern). The capacity logic itself is checked
in-process.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import scenarios
from executor import launch
from executor.moe import MoE, capacity, dispatch_slots, set_capacity
from scenarios.schema import MoE as MoEConfig
from executor.train import fit
from test_distributed import EXACT, STEPS, _check_record, _kinds, _parity, _rel, _scenario, _train, _weights
from twin.runrecord import load_run

EXPERT_PARAMS = ("w1", "b1", "w2", "b2")


# ---- the capacity logic, in-process ------------------------------------------------------------
def test_capacity_is_the_ceiling_of_the_factor_times_the_mean_load():
    assert capacity(512, 4, 1.0) == 128 and capacity(512, 4, 1.25) == 160 and capacity(10, 4, 1.0) == 3
    assert capacity(512, 4, 1.1) == 141  # 140.8, in integers (a symbolic T under torch.compile)
    assert capacity(1, 8, 1.0) == 1  # never zero slots


def test_assignments_past_the_capacity_are_dropped_in_token_order():
    flat_e = torch.tensor([0, 1, 0, 0, 2, 0, 1])  # expert 0 gets 4 assignments, C = 2: the last 2 drop
    slot, source, dropped = dispatch_slots(flat_e, 3, 2)
    assert slot.tolist() == [0, 2, 1, 6, 4, 6, 3]  # e·C + place; E·C = 6: dropped
    assert source.tolist() == [0, 2, 1, 6, 4, 7]  # the assignment in each slot; T·k = 7: empty
    assert int(dropped) == 2
    slot, source, dropped = dispatch_slots(flat_e, 3, 2, rows=4)  # rows padded (CUDA: to 8), same drops
    assert slot.tolist() == [0, 4, 1, 12, 8, 12, 5] and int(dropped) == 2
    assert source.tolist() == [0, 2, 7, 7, 1, 6, 7, 7, 4, 7, 7, 7]


def _moe(num_experts=4, top_k=2, seed=0):
    torch.manual_seed(seed)
    return MoE(16, MoEConfig(num_experts=num_experts, top_k=top_k, expert_hidden=32)).double()


def _run(moe, h, w):
    moe.zero_grad()
    hg = h.clone().requires_grad_()
    out, aux = moe(hg)
    ((out * w).sum() + aux).backward()
    return out.detach(), aux.detach(), hg.grad, [p.grad.clone() for p in moe.parameters()]


def test_capacity_that_drops_nothing_is_the_dropless_moe():
    """A capacity of every assignment (factor E) keeps all: output, aux loss and gradients are the
    dropless MoE's; the counters say so."""
    moe, h, w = _moe(), torch.randn(40, 16, dtype=torch.float64), torch.randn(40, 16, dtype=torch.float64)
    dropless = _run(moe, h, w)
    moe.capacity_factor = 4.0
    capped = _run(moe, h, w)
    for a, b in zip(capped[:3], dropless[:3]):
        torch.testing.assert_close(a, b)
    for a, b in zip(capped[3], dropless[3]):
        torch.testing.assert_close(a, b)
    assert moe.assignments.tolist() == [2 * 40 * 2, 0]  # two training forwards of 40 tokens, top-2


def test_dropped_assignments_add_nothing():
    """With factor 1 an unbalanced router overflows: the output is the dense formula with the
    dropped assignments' gates zeroed (the first C of each expert, in token order, kept), and the
    aux loss still counts every assignment."""
    moe, h = _moe(), torch.randn(40, 16, dtype=torch.float64).abs()
    with torch.no_grad():
        moe.router.weight[0].abs_().mul_(3)  # expert 0 is everyone's first choice
    moe.capacity_factor = 1.0
    out, aux = moe(h)
    gates, experts, probs = moe.route(h)
    C, kept = capacity(80, 4, 1.0), torch.zeros(40, 2, dtype=torch.bool)
    seen = [0] * 4
    for t in range(40):
        for j in range(2):
            e = int(experts[t, j])
            kept[t, j], seen[e] = seen[e] < C, seen[e] + 1
    assert (~kept).sum() > 0 and int(moe.assignments[1]) == int((~kept).sum())
    weight = torch.zeros(40, 4, dtype=torch.float64).scatter(1, experts, gates * kept)
    ex = moe.experts
    dense = sum(weight[:, e, None] * F.linear(F.gelu(F.linear(h, ex.w1[e], ex.b1[e])), ex.w2[e], ex.b2[e])
                for e in range(4))  # fmt: skip
    torch.testing.assert_close(out, dense)
    f = F.one_hot(experts, 4).sum(1).double().mean(0) / 2
    torch.testing.assert_close(aux, (4 * f * probs.mean(0)).sum())


def test_padded_capacity_rows_change_nothing(monkeypatch):
    """The CUDA layout (each expert's rows padded to a multiple of 8, here on the CPU) computes the
    same output and gradients and drops the same assignments."""
    import executor.moe

    moe, h, w = _moe(), torch.randn(40, 16, dtype=torch.float64), torch.randn(40, 16, dtype=torch.float64)
    moe.capacity_factor = 1.0
    plain = _run(moe, h, w)
    dropped = int(moe.assignments[1])
    monkeypatch.setattr(executor.moe, "_row_multiple", lambda h: 8)  # capacity 20 -> 24 rows an expert
    padded = _run(moe, h, w)
    for a, b in zip([*padded[:3], *padded[3]], [*plain[:3], *plain[3]]):
        torch.testing.assert_close(a, b)
    assert dropped > 0 and int(moe.assignments[1]) == 2 * dropped  # the same drops again


def test_eval_forwards_are_not_counted():
    moe = _moe()
    moe.eval()
    moe(torch.randn(8, 16, dtype=torch.float64))
    assert moe.assignments.tolist() == [0, 0]


# ---- several ranks against one process ---------------------------------------------------------
CLIP = 0.3  # below debug-cpu's first gradient norms (~0.45-0.52): the clip scales every step
CLIPPED = f"training.grad_clip={CLIP}"


def _ep(world: int, expert: int, shard: int, factor: float, *sets: str) -> scenarios.Scenario:
    return _scenario(world, world // shard, shard, f"parallelism.expert={expert}",
                     f"model.moe.capacity_factor={factor}", *sets)  # fmt: skip


def _train_clipped(s: scenarios.Scenario, out: Path | None = None, capacity_factor: float | None = None):
    """``_train``, and the global gradient norm each step's clip computed (``capacity_factor``:
    route with it in one process, as expert parallelism does: a reference, not profiled)."""
    import executor.train

    norms, clip, parallelize = [], executor.train.clip_grad_norm, executor.train.parallelize

    def spy(*args, **kw):
        norm = clip(*args, **kw)
        norms.append(float(norm))
        return norm

    def capped(model, scenario, run, mesh=None):
        applied = parallelize(model, scenario, run, mesh)
        set_capacity(model, capacity_factor)
        return applied

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(executor.train, "clip_grad_norm", spy)
        if capacity_factor is None:  # a rank of a launch: test_distributed's _train (profiled)
            return (*_train(s, out), norms)
        mp.setattr(executor.train, "parallelize", capped)  # the one-process reference
        record, model = fit(s, steps=STEPS, profile_steps=0, warmup_steps=1, log=lambda _: None)
        return record, _weights(model), set(), norms


@pytest.fixture(scope="module")
def references():
    """One process applying the capacity to every micro-batch: (record, weights, clip norms) by
    (capacity factor, clip)."""
    out = {}
    for factor, clip in ((1.25, 1.0), (1.0, CLIP)):
        record, weights, _, norms = _train_clipped(_ep(1, 1, 1, factor, f"training.grad_clip={clip}"),
                                                   capacity_factor=factor)  # fmt: skip
        out[factor, clip] = record, weights, norms
    return out


def _ep_rank(cases: list[scenarios.Scenario], out_dir: str) -> dict:
    """One rank of a launch: every case in turn; every rank returns its weights (its own experts)."""
    launched = launch.find_launcher()
    launch.join(cases[0], launched, timeout_s=120)
    try:
        runs = []
        for i, s in enumerate(cases):
            record, weights, units, norms = _train_clipped(s, Path(out_dir) / f"case{i}.json")
            runs.append(dict(record=record, weights=weights, units=units, norms=norms))
        return dict(rank=launched.rank, runs=runs)
    finally:
        torch.distributed.destroy_process_group()


def _gathered(results: dict, i: int, expert: int) -> dict[str, torch.Tensor]:
    """Rank 0's weights, its experts replaced by the first expert group's (ranks 0..EP-1, one slice
    of E/EP experts each, in order) concatenated into the one-process ``[E, …]`` layout; every
    other expert group holds the same experts."""
    weights = dict(results[0]["runs"][i]["weights"])
    for name in [n for n in weights if n.rsplit(".", 1)[-1] in EXPERT_PARAMS and ".moe.experts." in n]:
        groups = [torch.cat([results[g + r]["runs"][i]["weights"][name] for r in range(expert)])
                  for g in range(0, len(results), expert)]  # fmt: skip
        assert all(torch.equal(g, groups[0]) for g in groups)
        weights[name] = groups[0]
    return weights


def _check_ep_world(references, cases: dict[str, scenarios.Scenario], nproc: int, tmp_path: Path) -> dict:
    """``cases`` (by label) in one launch of ``nproc`` ranks, each against its one-process reference:
    losses, weights (experts gathered), every rank's clip norms, the RunRecord's assignment counts."""
    start = time.perf_counter()
    results = launch.launch_local(_ep_rank, (list(cases.values()), str(tmp_path)), nproc, timeout_s=120)
    wall = time.perf_counter() - start
    figures = {}
    for i, (label, s) in enumerate(cases.items()):
        ref_record, ref_w, ref_norms = references[s.model.moe.capacity_factor, s.training.grad_clip]
        weights = _gathered(results, i, s.parallelism.expert)
        experts = max(_rel(weights[n], ref_w[n]) for n in ref_w if ".moe.experts." in n)
        got = _parity((ref_record, ref_w), dict(record=results[0]["runs"][i]["record"], weights=weights), _kinds(s),
                      EXACT)  # fmt: skip
        norms = max(abs(a - b) / b for r in results.values() for a, b in zip(r["runs"][i]["norms"], ref_norms))
        assert norms < 1e-5 and len(ref_norms) == STEPS, (norms, ref_norms)  # every rank clipped by the global norm
        record = load_run(tmp_path / f"case{i}.json")
        _check_record(record, results, i, nproc)
        assert record.moe_routed_assignments == ref_record.moe_routed_assignments > 0
        assert record.moe_dropped_assignments == ref_record.moe_dropped_assignments
        assert all("nonseq_layers.0.moe.experts" in r["runs"][i]["units"] for r in results.values())
        # the profiled step's all-to-alls over expert; the experts' FSDP2 collectives over expert_replicate
        axes = {"expert"} | ({"expert_replicate"} if record.mesh["expert_replicate"] > 1 else set())
        assert axes <= set(record.comm_s_by_axis), record.comm_s_by_axis
        figures[label] = {**got, "experts": experts, "clip norm": norms, "comm_s": record.comm_s_by_axis, "routed": record.moe_routed_assignments,
                          "dropped": record.moe_dropped_assignments}  # fmt: skip
    print(f"\nworld {nproc}: parity {figures}; launch + {len(cases)} runs {wall:.1f} s")
    return figures


@pytest.mark.slow  # the default run keeps one launch of each kind: test_5d trains the expert axis (8 ranks)
def test_two_ranks_of_expert_parallelism_match_one_process(references, tmp_path):
    """expert 2 × dense_shard 2 (each rank 2 of the 4 experts; FSDP2 on a 1-rank expert_replicate),
    at the default capacity factor and at 1.0, where the router's imbalance drops assignments (and
    the gradient clip binds: the norm is the global one)."""
    cases = {"expert 2, capacity 1.25": _ep(2, 2, 2, 1.25), "expert 2, capacity 1.0": _ep(2, 2, 2, 1.0, CLIPPED)}
    figures = _check_ep_world(references, cases, 2, tmp_path)
    assert figures["expert 2, capacity 1.0"]["dropped"] > 0


@pytest.mark.slow
def test_four_ranks_of_expert_parallelism_match_one_process(references, tmp_path):
    """expert 2 × expert_replicate 2 (each expert slice FSDP2-sharded over 2 ranks) under HSDP 2×2,
    and expert 4 (one expert a rank) under dense_shard 4."""
    figures = _check_ep_world(references, {"expert 2 x expert_replicate 2": _ep(4, 2, 2, 1.0, CLIPPED),
                                           "expert 4": _ep(4, 4, 4, 1.25)}, 4, tmp_path)  # fmt: skip
    assert figures["expert 2 x expert_replicate 2"]["dropped"] > 0


def test_experts_must_divide_among_the_expert_ranks():
    with pytest.raises(scenarios.ScenarioError, match=r"model.moe.num_experts \(4\) must be divisible by "
                       r"parallelism.expert \(8\)"):
        _ep(8, 8, 8, 1.0)
