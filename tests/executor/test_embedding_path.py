"""The executor's embedding lookups: the Triton TBE path (kernels/embedding, interpreter on CPU)
and the torch path train alike; the fused table storage initialises exactly as before."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import scenarios
from executor.data import SyntheticData
from executor.model import PooledTables, SequenceGroupTokens
from executor.parallelize import build, set_embedding_kernel

TINY = ["training.micro_batch=4", "training.global_batch=4"]


def test_fused_tables_initialise_like_separate_modules():
    s = scenarios.load("debug-cpu")
    emb = s.model.embeddings
    torch.manual_seed(3)
    pooled = PooledTables(emb)
    group = SequenceGroupTokens(emb.sequences[0], s.model.d_model)
    torch.manual_seed(3)  # what the model built before the tables were fused: one module per table
    bags = {n: nn.EmbeddingBag(f.rows, f.dim) for f in emb.pooled for n in f.table_names()}
    seq = {n: nn.Embedding(f.rows, f.dim) for f in emb.sequences[0].tables for n in f.table_names()}
    proj = nn.Linear(sum(t.embedding_dim for t in seq.values()), s.model.d_model)
    for name, t in bags.items():
        assert torch.equal(pooled.tables[name].weight, t.weight), name
    for name, t in seq.items():
        assert torch.equal(group.tables[name].weight, t.weight), name
    assert torch.equal(group.proj.weight, proj.weight)
    for mod in (pooled, group):
        assert all(f.holds(mod._weights(g)) for g, f in zip(mod.table_groups, mod.fused))


def test_triton_and_torch_lookups_train_alike():
    from executor.train import train

    runs = {}
    for kind in ("torch", "triton"):
        s = scenarios.load("debug-cpu", [*TINY, f"execution.embedding_kernel={kind}"])
        runs[kind] = train(s, steps=3, profile_steps=1, warmup_steps=1, log=lambda _: None)
        assert runs[kind].embedding_kernel == kind
        assert runs[kind].op_class_time_s["embedding"] > 0  # the TBE's record_function regions
    losses = {k: [x.loss for x in r.steps] for k, r in runs.items()}
    assert losses["triton"] == pytest.approx(losses["torch"], rel=1e-5)
    assert runs["triton"].metrics["loss"] == pytest.approx(runs["torch"].metrics["loss"], rel=1e-5)


def test_auto_is_torch_on_cpu_and_bf16_tables_stay_fused():
    s = scenarios.load("debug-cpu", TINY + ["precision.embeddings=bf16"])
    model = build(s)
    assert model.pooled.kernel == "auto" and not model.pooled.use_triton(torch.device("cpu"))
    for mod in (model.pooled, *model.groups):
        for g, f in zip(mod.table_groups, mod.fused):
            assert f.buffer.dtype == torch.bfloat16 and f.holds(mod._weights(g))
    batch = SyntheticData(s, 0).batch(4)
    set_embedding_kernel(model, "triton")
    ref = build(s)
    set_embedding_kernel(ref, "torch")
    got, want = model.pooled(batch), ref.pooled(batch)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-2, atol=1e-2)  # bf16 sums vs fp32 sums


def test_bf16_tables_are_built_in_bf16_with_the_fp32_tables_values(monkeypatch):
    """A bf16 table is never whole in fp32 (a 52 GB bf16 table cast from fp32 would need 104 GB more):
    built in bf16, drawn in fp32 chunks. Within one chunk it holds the fp32 table's values rounded."""
    from executor import embeddings
    from executor.model import build_model

    fp32 = build_model(scenarios.load("debug-cpu", TINY))
    bf16 = build_model(scenarios.load("debug-cpu", TINY + ["precision.embeddings=bf16"]))
    assert all(f.buffer.dtype == torch.bfloat16 for f in bf16.pooled.fused)
    for name, t in fp32.pooled.tables.items():
        torch.testing.assert_close(bf16.pooled.tables[name].weight, t.weight.to(torch.bfloat16), rtol=0, atol=0)
    monkeypatch.setattr(embeddings, "INIT_CHUNK", 64)  # several chunks a table: still normal, finite, bf16
    chunked = build_model(scenarios.load("debug-cpu", TINY + ["precision.embeddings=bf16"]))
    w = chunked.pooled.tables["user_0"].weight.float()
    assert torch.isfinite(w).all() and 0.8 < float(w.std()) < 1.2 and w.shape[0] * w.shape[1] > 64


def test_triton_path_refuses_tables_that_left_their_buffer():
    s = scenarios.load("debug-cpu", TINY)
    model = build(s)
    set_embedding_kernel(model, "triton")
    t = model.pooled.tables["user_1"]
    t.weight = nn.Parameter(t.weight.detach().clone())
    batch = SyntheticData(s, 0).batch(2)
    with pytest.raises(ValueError, match="^the embedding tables no longer share their fused buffer"):
        model.pooled(batch)
    with pytest.raises(ValueError, match="^embedding kernel 'fast': use auto, triton or torch$"):
        set_embedding_kernel(model, "fast")
