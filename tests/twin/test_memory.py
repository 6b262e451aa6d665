"""Memory per rank (twin.memory): every scenario reports, totals add up, the rules' directions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import scenarios
from hwmodels.gpus import get_gpu
from twin.flops import model_costs
from twin.memory import WORKING_SET, WORKSPACE_BYTES, memory_per_rank

RUN = Path(__file__).parents[2] / "hwmodels" / "data" / "runs" / "h200-2026-11-30-roundtrip" / "h200-gem-1gpu.json"
PARAM_CATS = ("dense_params", "dense_grads", "dense_optimizer")
EMB_CATS = ("embedding_shard", "embedding_optimizer")


def _report(name: str, *sets: str):
    return memory_per_rank(scenarios.load(name, list(sets)))


def _sum(r, cats) -> float:
    return sum(r.by_category_bytes[c] for c in cats)


@pytest.mark.parametrize("name", scenarios.bundled())
def test_every_bundled_scenario_reports_and_adds_up(name):
    s = scenarios.load(name)
    r = memory_per_rank(s)
    assert r.total_bytes == pytest.approx(sum(r.by_category_bytes.values()))
    assert r.by_category_bytes["activations"] == pytest.approx(
        sum(r.by_layer_activation_bytes.values())
    )
    assert all(v >= 0 for v in r.by_category_bytes.values())
    assert r.capacity_bytes == get_gpu(s.hardware.gpu).hbm_bytes
    assert r.fits == (r.total_bytes <= r.capacity_bytes)
    assert r.by_category_bytes["workspace"] == WORKSPACE_BYTES
    assert r.message().startswith("fits: " if r.fits else "does not fit: ")
    sizes = [v for _, v in r.largest(3)]
    assert sizes == sorted(sizes, reverse=True) and len(sizes) == 3


@pytest.mark.parametrize("name", scenarios.bundled())
def test_checkpointing_never_adds_activations(name):
    acts = {
        p: _report(name, f"parallelism.activation_checkpointing={p}").by_category_bytes[
            "activations"
        ]
        for p in ("none", "selective", "full")
    }
    assert acts["full"] <= acts["selective"] <= acts["none"]


@pytest.mark.parametrize("name", ["gem-h200-1gpu", "gem-h100-4k"])
def test_full_below_selective_below_none_with_attention(name):
    acts = [
        _report(name, f"parallelism.activation_checkpointing={p}").by_category_bytes["activations"]
        for p in ("full", "selective", "none")
    ]
    assert acts[0] < acts[1] < acts[2]


def test_more_micro_batch_more_activations():
    small = _report("gem-h200-1gpu", "training.micro_batch=128")
    big = _report("gem-h200-1gpu", "training.micro_batch=256")
    assert small.by_category_bytes["activations"] < big.by_category_bytes["activations"]
    for layer, kept in small.by_layer_activation_bytes.items():
        assert kept <= big.by_layer_activation_bytes[layer]


def test_more_dense_shard_fewer_param_bytes():
    a = _report("gem-h100-4k", "parallelism.dense_shard=8", "parallelism.dense_replicate=512")
    b = _report("gem-h100-4k", "parallelism.dense_shard=64", "parallelism.dense_replicate=64")
    assert _sum(b, PARAM_CATS) == pytest.approx(_sum(a, PARAM_CATS) / 8)
    one = _report("gem-h200-2gpu", "parallelism.dense_shard=1", "parallelism.dense_replicate=2")
    two = _report("gem-h200-2gpu", "parallelism.dense_shard=2", "parallelism.dense_replicate=1")
    assert _sum(two, PARAM_CATS) < _sum(one, PARAM_CATS)
    assert one.by_category_bytes["fsdp_gathered"] == 0 < two.by_category_bytes["fsdp_gathered"]


def test_more_sparse_shard_fewer_embedding_bytes():
    sync = "parallelism.sparse_strategy=replicated_sync"
    a = _report("gem-h100-4k", sync, "parallelism.sparse_shard=1024", "parallelism.sparse_replica=4")
    b = _report("gem-h100-4k", sync, "parallelism.sparse_shard=2048", "parallelism.sparse_replica=2")
    assert _sum(b, EMB_CATS) == pytest.approx(_sum(a, EMB_CATS) / 2)
    # fully_sharded splits over sparse_shard × sparse_replica = num_gpus: the layout does not matter
    c = _report("gem-h100-4k", "parallelism.sparse_shard=2048", "parallelism.sparse_replica=2")
    assert _sum(c, EMB_CATS) == pytest.approx(_sum(a, EMB_CATS) / 4)


def test_three_trillion_params_on_eight_ranks_does_not_fit():
    r = _report(
        "gem-h100-4k", "parallelism.sparse_shard=8", "parallelism.sparse_replica=512",
        "parallelism.sparse_strategy=replicated_sync",
    )  # fmt: skip
    assert not r.fits
    assert r.message() == (
        "does not fit: 1611.1 GB per rank on h100 (80.0 GB); largest: embedding_shard "
        "1569.8 GB, embedding_optimizer 12.8 GB, activations 11.0 GB; try "
        "parallelism.sparse_strategy=fully_sharded or a larger parallelism.sparse_shard"
    )


def test_activation_hint_when_already_fully_checkpointed():
    r = _report("gem-h100-4k", "training.micro_batch=512", "training.global_batch=2097152")
    assert not r.fits and r.largest(1)[0][0] == "activations"
    assert r.message().endswith("; try a smaller training.micro_batch")


def test_h200_1gpu_fits_near_the_executor_measurement():
    r = _report("gem-h200-1gpu")
    assert r.fits and r.message().startswith("fits: ")
    assert r.by_category_bytes["comm_buffers"] == 0 == r.by_category_bytes["fsdp_gathered"]
    measured = json.loads(RUN.read_text())["peak_memory_bytes"]
    assert r.total_bytes == pytest.approx(measured, rel=0.2)


def test_mxfp8_copies_only_with_mxfp8():
    assert _report("gem-b200-8k").by_category_bytes["mxfp8_copies"] > 0
    assert _report("gem-h100-4k").by_category_bytes["mxfp8_copies"] == 0


def test_working_set_and_explicit_costs():
    s = scenarios.load("gem-h200-1gpu")
    costs = model_costs(s.model, batch=s.training.micro_batch, precision=s.precision)
    r = memory_per_rank(s, costs=costs, gpu=get_gpu("h100"))
    assert r.capacity_bytes == get_gpu("h100").hbm_bytes
    assert r.by_category_bytes == memory_per_rank(s).by_category_bytes
    # the peak holds at least the gradients in and out of the largest op
    assert r.by_category_bytes["activations"] >= 2 * max(c.act_bytes for c in costs)
    assert r.by_layer_activation_bytes[WORKING_SET] > 0


def test_the_backward_frees_later_layers_before_an_earlier_one_recomputes():
    """Under full checkpointing the working set is one layer's recompute on top of the kept
    boundaries of the layers before it: it grows with the layer, not with the layer count."""
    two, six = (memory_per_rank(scenarios.load("gem-h200-1gpu", [f"model.sequence.num_layers={n}",
                                                                   "parallelism.activation_checkpointing=full"]))
                for n in (2, 6))  # fmt: skip
    assert two.by_layer_activation_bytes[WORKING_SET] == pytest.approx(six.by_layer_activation_bytes[WORKING_SET],
                                                                       rel=0.1)
    kept = {k: v for k, v in six.by_layer_activation_bytes.items() if k.startswith("seq") and k != "seq_in"}
    assert max(kept.values()) < 0.1 * six.by_layer_activation_bytes[WORKING_SET]  # boundaries only


def test_a_projection_that_only_a_residual_add_reads_is_not_kept():
    s = scenarios.load("gem-h200-1gpu", ["parallelism.activation_checkpointing=none"])
    costs = model_costs(s.model, batch=s.training.micro_batch, precision=s.precision)
    seq0 = {c.name: c.act_bytes for c in costs if c.name.startswith("seq0.")}
    kept = memory_per_rank(s).by_layer_activation_bytes["seq0"]
    assert kept == pytest.approx(sum(seq0.values()) - seq0["seq0.out"] - seq0["seq0.mlp_down"])


def test_the_memory_floor_is_below_every_layout_of_its_choice():
    """``memory_floor_bytes`` lets the planner rule a (micro-batch, checkpointing, precision, expert)
    choice out at once: it must never exceed a layout's own total."""
    import random

    from twin.bench_estimate import space
    from twin.memory import memory_floor_bytes
    from twin.plan_space import apply

    rng = random.Random(0)
    for name, gpus in (("debug-cpu-5d", 8), ("gem-h100-4k", 512), ("dlrm-dcnv2", 64)):
        s = scenarios.load(name)
        cands, gpu, net, gb = space(s, gpus)
        for c in rng.sample(cands, 25):
            sc = apply(s, c, gpus=gpus, gpu=gpu, network=net, global_batch=gb)
            floor, total = memory_floor_bytes(sc), memory_per_rank(sc).total_bytes
            assert 0 < floor <= total, (name, c.label())
