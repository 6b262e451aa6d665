"""Shared fixtures: a tiny DLRM scenario (dot or DCNv2) built from the bundled dlrm-dcnv2."""

import pytest

import scenarios


@pytest.fixture
def tiny_dlrm():
    def make(interaction: str = "dcnv2"):
        tables = "[" + ", ".join(
            f"{{name: c{i}, rows: {r}, dim: 16, pooling: {{shape: uniform, max: {p}, mean: {p * 0.75}}}}}"
            for i, (r, p) in enumerate([(100, 4), (50, 2), (7, 2)])
        ) + "]"
        return scenarios.load("dlrm-dcnv2", [
            f"model.embeddings.pooled={tables}",
            "model.bottom_mlp=[32, 16]", "model.top_mlp=[32, 16]", f"model.interaction={interaction}",
            "model.dcn_layers=2", "model.dcn_rank=8",
            "hardware.num_gpus=1", "parallelism.dense_replicate=1", "parallelism.sparse_shard=1",
            "training.global_batch=64", "training.micro_batch=64", "training.steps=10",
        ])
    return make
