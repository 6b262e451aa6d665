"""Planner (twin.planner): finds the brute-force optimum, its bound never prunes it, the YAML
it writes reproduces the best, bad inputs give one-line errors."""

from __future__ import annotations

import itertools

import pytest

import scenarios
from twin.memory import memory_per_rank
from twin.plan_bounds import Bounds
from twin.plan_space import Candidate, _comm_variants, apply, experts
from twin.planner import plan, write_best_yaml
from twin.simulate import simulate
from hwmodels.gpus import list_gpus

SPACE = {"activation_checkpointing": ["selective", "full"], "micro_batch": [128, 256],
         "precision": ["bf16", "mxfp8"]}  # fmt: skip


@pytest.fixture(scope="module")
def base():
    return scenarios.load("gem-h200-2gpu")


@pytest.fixture(scope="module")
def planned(base):
    return plan(base, gpus=2, top=3, imbalance_final=False, space=SPACE)


def _brute(s):
    """Every candidate of SPACE at 2 GPUs, simulated when it fits."""
    out = []
    for mb, ck, pr, e, ss in itertools.product(SPACE["micro_batch"], SPACE["activation_checkpointing"],
                                               SPACE["precision"], [1, 2], [1, 2]):  # fmt: skip
        for d, st, n in _comm_variants(2, ss, [1, 2]):
            c = Candidate(mb, ck, pr, e, ss, d, st, n)
            sc = apply(s, c, gpus=2, gpu="h200", network="h200x2-nv18", global_batch=512)
            if memory_per_rank(sc).fits:
                out.append((simulate(sc, imbalance=False).step_time_s, c))
    return sorted(out)


def test_planner_finds_the_brute_force_optimum(base, planned):
    brute = _brute(base)
    assert planned.best is not None
    assert planned.counts.enumerated == 160  # 32 keys: 16 with sparse_shard 1 (8 comm variants), 16 with 2 (2)
    assert planned.best.result.step_time_s == pytest.approx(brute[0][0], rel=1e-9)
    top_planned = [e.result.step_time_s for e in planned.top]
    assert top_planned == pytest.approx([t for t, _ in brute[:3]], rel=1e-9)
    c = planned.counts
    assert (c.pruned_by_bound + c.pruned_by_memory + c.pruned_by_estimate + c.simulated + c.skipped_by_descent
            == c.enumerated)
    assert c.simulated < len(brute)  # the bound pruned something


def test_bound_is_a_lower_bound_and_never_prunes_the_optimum(base, planned):
    for e in planned.top:
        assert e.compute_bound_s <= e.bound_s <= e.result.step_time_s * (1 + 1e-9)
    r = plan(base, gpus=2, top=1, imbalance_final=False, space=SPACE)
    assert r.best.result.step_time_s == pytest.approx(planned.best.result.step_time_s, rel=1e-9)


def test_written_yaml_loads_and_reproduces_the_best(base, planned, tmp_path):
    path = write_best_yaml(planned, base, tmp_path / "best.yaml", extends="gem-h200-2gpu")
    assert "extends: gem-h200-2gpu" in path.read_text()
    s = scenarios.load(str(path))
    assert simulate(s, imbalance=False).step_time_s == pytest.approx(
        planned.best.result.step_time_s, rel=1e-9)
    full = write_best_yaml(planned, base, tmp_path / "full.yaml")
    assert scenarios.load(str(full)).parallelism == s.parallelism


def test_planner_beats_or_matches_the_given_scenario(planned):
    assert planned.given is not None
    assert planned.best.result.samples_per_s >= planned.given.samples_per_s * 0.999


@pytest.mark.parametrize("kwargs, message", [
    ({"gpus": 0}, "gpus (0) must be a positive integer; pass e.g. --gpus 8"),
    ({"gpus": 2, "gpu": "h300"}, f"gpu: unknown GPU 'h300'; known: {', '.join(list_gpus())}"),
    ({"gpus": 4}, "gpus (4) exceeds network 'h200x2-nv18' (2 GPUs); pick a larger preset with --network"),
    ({"gpus": 2, "top": 0}, "top (0) must be a positive integer; pass e.g. --top 5"),
    ({"gpus": 2, "budget": 0}, "budget (0) must be a positive number of simulations; pass e.g. --budget 600"),
])  # fmt: skip
def test_bad_inputs_give_pinned_one_line_errors(base, kwargs, message):
    with pytest.raises(ValueError) as e:
        plan(base, **kwargs)
    assert str(e.value) == message


def test_comm_aware_bound_is_below_every_simulated_step_and_tighter_than_compute(base):
    """Every point of the brute-force space, and layouts of gem-h100-4k with expert and sparse
    all-to-alls crossing nodes: compute bound <= comm-aware bound (with the fully sharded
    replica all-gather and reduce-scatter) <= simulated step."""
    cases = [(base, 2, 512, c) for c in (Candidate(mb, ck, pr, e, ss, d, st, n)
             for mb, ck, pr in ((128, "none", "mxfp8"), (256, "full", "bf16"))
             for e in (1, 2) for ss in (1, 2) for d, st, n in _comm_variants(2, ss, [1, 2]))]  # fmt: skip
    big = scenarios.load("gem-h100-4k")
    cases += [(big, 4096, 524288, Candidate(mb, "full", "bf16", e, ss, d))
              for mb, e, ss, d in ((128, 8, 1024, 8), (64, 64, 4096, 1), (128, 1, 8, 64),
                                   (32, 16, 256, 8))]  # fmt: skip
    # replicated_sync (the table shard's all-reduce after the compute), and mxfp8 over several
    # micro-batches, which runs without CUDA graphs: the host's issue time is the step
    floored = [Candidate(64, "none", "bf16", 8, 8, 8, "replicated_sync", 1),
               Candidate(64, "selective", "mxfp8", 16, 1, 16, "replicated_sync", 10),
               Candidate(32, "full", "mxfp8", 8, 64, 8)]  # fmt: skip
    cases += [(big, 4096, 524288, c) for c in floored]
    # eight micro-batches whose next batch's ids all-to-all (over 8,192 ranks) runs beside the
    # compute: queued in each micro-batch's chain, it put the key's bound 3.6% above the step
    b8k = scenarios.load("gem-b200-8k")
    cases.append((b8k, 8192, b8k.training.global_batch, Candidate(16, "full", "mxfp8", 4, 8192, 64)))
    tighter = by_floor = 0
    bounds = {}
    for s, gpus, gb, c in cases:
        net = s.hardware.network
        b = bounds.setdefault(s.name, Bounds(s, gpus, s.hardware.gpu, net, experts(s, gpus)))
        sc = apply(s, c, gpus=gpus, gpu=s.hardware.gpu, network=net, global_batch=gb)
        step = simulate(sc, imbalance=False).step_time_s
        lo, key = b.compute_bound_s(c, gb // gpus), b.bound_s(c, gb // gpus) + b.variant_extra_s(c)
        hi = max(key, b.floor_s(c, gb // gpus), b.stream_floor_s(c, gb // gpus))
        assert lo <= hi * (1 + 1e-12) and hi <= step * (1 + 1e-9), (c, lo, hi, step)
        tighter += hi > lo * 1.01
        by_floor += c in floored and hi > 2 * key and hi > 0.9 * step
    assert tighter >= 4  # the all-to-alls between compute ops count
    assert by_floor == len(floored)  # the sync and the host's time, which the key's bound cannot see


def test_messages_are_the_collectives_the_graph_issues():
    """``messages`` lists a step's collectives without building its graph (the bounds sum each
    stream from it): per stream, the same messages as the graph's ops, each every micro-batch or
    once, on layouts with every axis, both sparse strategies, hot rows and several micro-batches."""
    import collections
    import random

    from twin.bench_estimate import space
    from twin.workload import Hardware, build_graph, messages

    rng = random.Random(3)
    for name, gpus in (("gem-h100-4k", 512), ("gem-gb200-nvl72", 576), ("dlrm-dcnv2", 64), ("debug-cpu-5d", 4)):
        s = scenarios.load(name)
        cands, gpu, net, gb = space(s, gpus)
        for c in rng.sample(cands, 4):
            sc = apply(s, c, gpus=gpus, gpu=gpu, network=net, global_batch=gb)
            hw = Hardware.of(sc)
            graph = collections.Counter((op.stream, round(op.bytes, 3)) for op in build_graph(sc, hw).ops
                                        if op.stream != "compute")  # fmt: skip
            listed = collections.Counter()
            for m in messages(sc, hw):
                listed[(f"comm.{m.axis}", round(m.msg_bytes, 3))] += sc.grad_accum if m.every_micro_batch else 1
            assert graph == listed, (name, c)


def test_lookups_and_host_time_priced_without_a_graph_match_the_graph():
    """The bounds price a layout's lookups (``lookup_seconds``) and the host's issue time
    (``host_issue_s``) without building its graph: both equal what the graph holds, over one and
    several micro-batches (the sparse update, fused into the backward or not, moves both)."""
    from twin.workload import Hardware, build_graph, host_issue_s, lookup_seconds

    big = scenarios.load("gem-h100-4k")
    for c, gb in ((Candidate(128, "full", "bf16", 8, 64, 8), 128 * 4096),
                  (Candidate(64, "selective", "mxfp8", 16, 512, 16), 524288),
                  (Candidate(64, "full", "mxfp8", 1, 1, 1), 128 * 4096)):  # fmt: skip
        sc = apply(big, c, gpus=4096, gpu="h100", network="h100-roce-3tier", global_batch=gb)
        hw = Hardware.of(sc)
        g = build_graph(sc, hw)
        priced = lookup_seconds(sc, hw)
        for op in g.ops:
            if op.op_class == "embedding":
                name, phase = op.name.removeprefix("mb0.").removeprefix("mb1.").rsplit(".", 1)
                assert op.duration_s == pytest.approx(priced[name][0 if phase == "fwd" else 1], rel=1e-12)
        per_mb, once = host_issue_s(sc, hw)
        assert sc.grad_accum * per_mb + once == pytest.approx(g.host_s, rel=1e-12)
        assert (g.host_s > 0) == (c.precision == "mxfp8")  # MXFP8 layers keep the step out of CUDA graphs


def test_templates_shared_across_gpu_counts_give_the_same_bounds():
    """The forecast shares one micro-batch's op graph between plans at several GPU counts."""
    s = scenarios.load("gem-h100-4k")
    shared: dict = {}
    for gpus in (4096, 1024):
        fresh = Bounds(s, gpus, "h100", "h100-roce-3tier", experts(s, gpus))
        reused = Bounds(s, gpus, "h100", "h100-roce-3tier", experts(s, gpus), shared=shared)
        for c in (Candidate(128, "full", "bf16", 8, 256, 8), Candidate(64, "full", "bf16", 1, 8, 1)):
            per_gpu = 524288 // gpus
            assert reused.bound_s(c, per_gpu) == fresh.bound_s(c, per_gpu)
            assert reused.variant_extra_s(c) == fresh.variant_extra_s(c)
    assert len(shared[("templates", ("gem-h100-4k", "h100", True, True, True))]) == 2  # built once each


def test_budget_counts_simulations_so_the_plan_is_the_same_on_any_machine(base, planned, monkeypatch):
    """``budget`` stops after that many simulations, whatever the clock says: a run whose clock
    jumps an hour per reading stops at the same point and returns the same plan."""
    import time as _time

    full = planned.counts.simulated
    assert full > 2
    a = plan(base, gpus=2, top=1, imbalance_final=False, space=SPACE, budget=2)
    clock = iter(range(0, 10**9, 3600))
    monkeypatch.setattr(_time, "perf_counter", lambda: float(next(clock)))
    b = plan(base, gpus=2, top=1, imbalance_final=False, space=SPACE, budget=2)
    assert a.counts.simulated == b.counts.simulated == 2 and a.budget_exhausted and b.budget_exhausted
    assert a.best.candidate == b.best.candidate and a.best.result.step_time_s == b.best.result.step_time_s


@pytest.mark.parametrize("name, gpus", [("gem-h200-2gpu", 2), ("dlrm-dcnv2", 2)])
def test_plan_equals_an_exhaustive_simulated_search_over_the_full_space(name, gpus):
    """Issue 26: the search (bounds, estimates, the engine only where they cannot rule a layout
    out) returns what simulating every layout of the full space that fits would."""
    from twin.bench_estimate import space

    s = scenarios.load(name)
    cands, gpu, net, gb = space(s, gpus)
    everything = []
    for c in cands:
        sc = apply(s, c, gpus=gpus, gpu=gpu, network=net, global_batch=gb)
        if memory_per_rank(sc).fits:
            everything.append((simulate(sc, imbalance=False).step_time_s, c))
    everything.sort()
    r = plan(s, gpus=gpus, top=3, imbalance_final=False)
    assert r.counts.simulated < len(everything) / 10
    assert r.best.result.step_time_s == pytest.approx(everything[0][0], rel=1e-9)
    assert sorted(e.result.step_time_s for e in r.top) == pytest.approx([t for t, _ in everything[:3]], rel=1e-9)


def _template_walk(b: Bounds, c: Candidate, per_gpu: int, groups: dict, timer, head: float = 0.0) -> float:
    """``Bounds._walk``'s chain read straight off the template, entry by entry, every collective
    on its stream (the walk runs a compiled program, ``plan_bounds._compile``: it must agree)."""
    mf, finish, free, chain = b._moe_factor(c), [], {}, 0.0
    for what, (rest, ops, exp), deps, kind, nbytes, axis, data in b._template(
            c.micro_batch, c.activation_checkpointing, c.precision):  # fmt: skip
        start = max([0.0] + [finish[i] for i in deps])
        if what == "s":
            start = max(start, chain)
            if ops and head:
                start, head = max(start, head), 0.0
            chain = start + rest + (b._lookup_s(c, ops, per_gpu) if ops else 0.0) + mf * exp
            finish.append(chain)
            continue
        timed = (what == "k" or axis == "dense_shard") and axis in groups and groups[axis][0] > 1 and nbytes > 0
        d = timer(kind, nbytes, axis, *groups[axis], mf if axis == "expert" else 1.0) if timed else 0.0
        if data:
            finish.append(start)
            continue
        start = max(start, free.get(axis, 0.0))
        free[axis] = finish_s = start + d
        finish.append(finish_s)
    return chain


def test_bounds_memos_and_compiled_walks_equal_the_direct_computation():
    """The bounds' shortcuts give the very numbers (==, not approx) of computing each candidate
    afresh: the walk's compiled programs against the template walked entry by entry (with and
    without FSDP's collectives timed, with a replica gather before the lookups); the stream floor
    of every variant of a key, on one ``Bounds`` (messages listed once per key and re-sized per
    dense_shard, axis sums and topology classes reused) and on a fresh one each."""
    import random

    from twin.bench_estimate import space
    from twin.plan_space import per_gpu_batch

    rng = random.Random(5)
    for name, gpus in (("gem-h100-4k", 4096), ("gem-gb200-nvl72", 576), ("dlrm-dcnv2", 64)):
        s = scenarios.load(name)
        cands, gpu, net, gb = space(s, gpus)
        per_gpu = per_gpu_batch(s.training.global_batch, gpus)
        warm = Bounds(s, gpus, gpu, net, experts(s, gpus))
        for c in rng.sample(cands, 6):
            for groups in ({"sparse_shard": (c.sparse_shard, 1), "expert": (c.expert, 1)},
                           {"sparse_shard": (c.sparse_shard, 1), "expert": (c.expert, 1),
                            "dense_shard": (c.dense_shard, 1)}):  # fmt: skip
                for head in (0.0, 1e-3):
                    def timer(kind, nbytes, axis, size, stride, imbalance):
                        return warm._fastest(kind=kind, msg_bytes=nbytes, group_size=size, stride=stride,
                                             sm_free=False, imbalance=imbalance)  # fmt: skip
                    got, _ = warm._walk(c, per_gpu, head=head, groups=groups, timer=timer)
                    assert got == _template_walk(warm, c, per_gpu, groups, timer, head), (name, c, groups, head)
            variants = [Candidate(*c.key, d, st, n) for d, st, n in _comm_variants(
                gpus, c.sparse_shard, sorted({v.dense_shard for v in cands}))]  # fmt: skip
            for v in variants:
                fresh = Bounds(s, gpus, gpu, net, experts(s, gpus))
                assert warm.stream_floor_s(v, per_gpu) == fresh.stream_floor_s(v, per_gpu), (name, v)


def test_messages_at_another_dense_shard_are_the_messages_listed_there():
    """``at_dense_shard`` re-sizes a layout's messages for another dense_shard (the gradient
    shard's all-reduce): the same list, message for message, as ``messages`` gives there."""
    from twin.workload import Hardware, at_dense_shard, messages

    for name in ("gem-h100-4k", "gem-gb200-nvl72", "dlrm-dcnv2"):
        s = scenarios.load(name)
        gpus, gpu, net = s.hardware.num_gpus, s.hardware.gpu, s.hardware.network
        k = Candidate(s.training.micro_batch, "full", "bf16", 1, 8, 1)
        ref = apply(s, Candidate(*k.key, 2), gpus=gpus, gpu=gpu, network=net, global_batch=s.training.global_batch)
        listed = messages(ref, Hardware.of(ref))
        assert any(m.dense_params for m in listed)
        for ds in (d for d in (4, 8, 16, 32) if gpus % d == 0 and gpus > d):
            sc = apply(s, Candidate(*k.key, ds), gpus=gpus, gpu=gpu, network=net, global_batch=s.training.global_batch)
            assert at_dense_shard(listed, sc) == messages(sc, Hardware.of(sc)), (name, ds)
