"""Every schema error message is pinned: a user reads them to fix their scenario."""

from __future__ import annotations

import pytest

import scenarios
from scenarios import ScenarioError


def load_with(*sets: str, base: str = "gem-h100-4k"):
    return scenarios.load(base, list(sets))


def test_every_bundled_scenario_loads():
    names = scenarios.bundled()
    assert {"debug-cpu", "gem-h200-1gpu", "gem-h200-2gpu", "gem-h100-4k", "gem-b200-8k",
            "gem-gb200-nvl72", "dlrm-dcnv2"} <= set(names)
    for name in names:
        assert scenarios.load(name).name == name


def test_scenario_is_frozen():
    s = scenarios.load("debug-cpu")
    with pytest.raises(Exception):
        s.training.steps = 3


@pytest.mark.parametrize(
    "sets, message",
    [
        (["hardware.num_gpus=3"],
         "parallelism.dense_replicate × parallelism.dense_shard (512 × 8 = 4096) must equal "
         "hardware.num_gpus (3): set parallelism.dense_shard to a divisor of 3"),
        (["parallelism.sparse_replica=2"],
         "parallelism.sparse_replica × parallelism.sparse_shard (2 × 1024 = 2048) must equal "
         "hardware.num_gpus (4096): set parallelism.sparse_replica=4"),
        (["model.moe.num_experts=63"],
         "model.moe.num_experts (63) must be divisible by parallelism.expert (8)"),
        (["parallelism.expert=3"], "parallelism.expert (3) must divide hardware.num_gpus (4096): set it to a divisor of 4096"),
        (["training.micro_batch=7"],
         "training.global_batch (524288) must be a multiple of training.micro_batch × "
         "hardware.num_gpus (7 × 4096 = 28672)"),
        (["model.foo=1"],
         "model.foo: unknown field; known fields here: bottom_mlp, cross, d_model, "
         "dense_features, embeddings, kind, moe, nonseq, sequence, tasks"),
        (["hardware.num_gpus=-1"], "hardware.num_gpus: input should be greater than 0 (got -1)"),
        (["model.sequence.attention=flash"],
         "model.sequence.attention: input should be 'jfa', 'gdpa' or 'block' (got 'flash')"),
        (["model.moe.top_k=65"], "model.moe: top_k (65) must not exceed num_experts (64)"),
        (["parallelism.table_sharding={x: row}"],
         "parallelism.table_sharding has 'x', which is no table family; known: action, ad, "
         "item, user"),
        (["parallelism.table_sharding={user: diagonal}"],
         "parallelism.table_sharding.user: input should be 'table', 'row', 'column', 'grid' or "
         "'data' (got 'diagonal')"),
        (["model.nonseq.fm_tokens=64"],
         "model.nonseq: fm_tokens (64) must be smaller than num_tokens (64): the linear "
         "compression block makes the rest"),
        (["model.bottom_mlp=[64]"],
         "model: bottom_mlp[-1] (64) must equal d_model (1024): the dense features become one "
         "token"),
        (["model.embeddings.sequences=[]"],
         "model: sequence.num_layers (8) needs at least one embeddings.sequences group; add one "
         "or set sequence.num_layers: 0"),
        (["model.embeddings.sequences.0.length.mean=10"],
         "model.embeddings.sequences.0.length: mean (10.0) must lie in [max/2, max] = "
         "[1024.0, 2048] for shape 'uniform' (lengths are uniform on [2*mean-max, max])"),
        (["model.embeddings.sequences.0.tables.0.pooling.max=3"],
         "model.embeddings.sequences.0: tables[item].pooling must be fixed 1 (one id per "
         "token); remove pooling from sequence tables"),
        (["model.kind=transformer"],
         "model.kind: unknown kind 'transformer'; use one of: 'gem', 'dlrm'"),
        (["precision.embeddings=mxfp8"],
         "precision.embeddings: input should be 'fp32' or 'bf16' (got 'mxfp8')"),
        (["training.global_batch=null"],
         "training.global_batch: input should be a valid integer (got None)"),
    ],
)
def test_error_messages_are_pinned(sets, message):
    with pytest.raises(ScenarioError) as e:
        load_with(*sets)
    assert str(e.value) == message
    assert "\n" not in str(e.value)


def test_missing_required_field():
    data = scenarios.loader.read_raw("debug-cpu")
    del data["training"]
    with pytest.raises(ScenarioError, match=r"^training: required field is missing; add it$"):
        scenarios.validate(data)


def test_dlrm_needs_matching_table_dims():
    with pytest.raises(ScenarioError) as e:
        scenarios.load("dlrm-dcnv2", ["model.embeddings.pooled.3.dim=64"])
    assert str(e.value) == (
        "model: embeddings.pooled[c3].dim (64) must equal the last bottom_mlp width (128) for a "
        "DLRM interaction"
    )


def test_grad_accum():
    s = load_with("training.global_batch=1048576")
    assert s.grad_accum == 2


def test_hot_rows_default_off_and_bounded_by_rows():
    s = scenarios.load("dlrm-dcnv2", ["model.embeddings.pooled.0.hot_rows=4096"])
    assert s.model.embeddings.pooled[0].hot_rows == 4096
    assert all(f.hot_rows == 0 for f in scenarios.load("dlrm-dcnv2").model.embeddings.pooled)
    with pytest.raises(ScenarioError, match=r"hot_rows \(100\) must be <= rows \(3\)"):
        scenarios.load("dlrm-dcnv2", ["model.embeddings.pooled.5.hot_rows=100"])
