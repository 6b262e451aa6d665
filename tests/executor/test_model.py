"""Forward/backward of GEM and DLRM, the MoE against a dense run-every-expert formula."""

import pytest
import torch
import torch.nn.functional as F

import scenarios
from executor.data import SyntheticData
from executor.model import MoE, compute_loss, cross_stages
from executor.parallelize import build
from scenarios.schema import MoE as MoEConfig


def _forward_backward(scenario, n=16):
    model = build(scenario)
    batch = SyntheticData(scenario, 0).batch(n)
    logits, aux = model(batch)
    loss = compute_loss(logits, batch.labels, aux)
    loss.backward()
    return model, logits, loss


def test_debug_cpu_forward_backward():
    s = scenarios.load("debug-cpu")
    model, logits, loss = _forward_backward(s)
    assert logits.shape == (16, 2) and torch.isfinite(loss)
    tables = {id(m.weight) for m in model.embedding_modules()}
    for name, p in model.named_parameters():
        assert p.grad is not None, name  # every parameter is used (all experts get tokens here)
        assert p.grad.is_sparse == (id(p) in tables), name


@pytest.mark.parametrize("interaction", ["dot", "dcnv2"])
def test_tiny_dlrm_forward_backward(interaction, tiny_dlrm):
    _, logits, loss = _forward_backward(tiny_dlrm(interaction))
    assert logits.shape == (16, 1) and torch.isfinite(loss)


def test_the_dcn_mix_is_compiled_and_matches_eager(tiny_dlrm):
    """A DCNv2 layer's ``x0 ⊙ U(V(x)) + x``: ``compile_dense`` compiles its element-wise part (one
    kernel each way on a GPU, where eager runs a multiply and an add forward and three backward),
    and the compiled model's loss and gradients are the eager one's (in fp32: in bf16 Inductor
    rounds ``x0 ⊙ u + x`` once where eager rounds twice)."""
    from executor.parallelize import compile_dense

    s = tiny_dlrm("dcnv2")
    s = s.model_copy(update={"precision": s.precision.model_copy(update={"mlp": "fp32", "attention": "fp32"})})
    eager, _, loss = _forward_backward(s)
    model = build(s)
    model.load_state_dict(eager.state_dict())
    assert "mix" in compile_dense(model)
    batch = SyntheticData(s, 0).batch(16)
    logits, aux = model(batch)
    got = compute_loss(logits, batch.labels, aux)
    got.backward()
    assert got.item() == pytest.approx(loss.item(), rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        if p.grad is not None and not p.grad.is_sparse:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("overrides", [
    ["precision.mlp=bf16", "precision.attention=bf16", "precision.embeddings=bf16"],
    ["precision.mlp=mxfp8", "precision.attention=fp32", "model.sequence.attention=gdpa"],
])
def test_low_precision_forward_backward(overrides):
    _, logits, loss = _forward_backward(scenarios.load("debug-cpu", overrides))
    assert logits.dtype == torch.float32 and torch.isfinite(loss)


def test_no_sequence_groups():
    s = scenarios.load("debug-cpu", ["model.embeddings.sequences=[]", "model.sequence.num_layers=0",
                                     "model.cross.num_layers=0"])
    _, logits, loss = _forward_backward(s)
    assert torch.isfinite(loss)


def test_cross_stages_are_evenly_spaced():
    assert cross_stages(2, 1) == [1]
    assert cross_stages(4, 2) == [1, 3]
    assert cross_stages(3, 3) == [0, 1, 2]


def test_moe_routes_top_k_and_matches_dense_formula():
    torch.manual_seed(0)
    moe = MoE(8, MoEConfig(num_experts=5, top_k=2, expert_hidden=16)).double()
    h = torch.randn(40, 8, dtype=torch.float64)
    gates, experts, probs = moe.route(h)
    assert experts.shape == (40, 2)
    assert all(len(set(row)) == 2 for row in experts.tolist())  # exactly k distinct experts
    torch.testing.assert_close(gates.sum(-1), torch.ones(40, dtype=torch.float64))
    out, aux = moe(h)
    # dense formula: run every expert on every token, weight by the renormalised top-k gate
    weight = torch.zeros(40, 5, dtype=torch.float64).scatter(1, experts, gates)
    dense = sum(weight[:, e, None] * _expert(moe.experts, e, h) for e in range(5))
    torch.testing.assert_close(out, dense)
    f = F.one_hot(experts, 5).sum(1).double().mean(0) / 2
    torch.testing.assert_close(aux, (5 * f * probs.mean(0)).sum())


def _expert(experts, e: int, h):
    """Expert ``e`` of the stacked ``GroupedExperts`` alone: ``Linear(d→He) → GELU → Linear(He→d)``."""
    return F.linear(F.gelu(F.linear(h, experts.w1[e], experts.b1[e])), experts.w2[e], experts.b2[e])


def test_moe_uniform_router_aux_is_one():
    moe = MoE(4, MoEConfig(num_experts=4, top_k=1, expert_hidden=4))
    torch.nn.init.zeros_(moe.router.weight)
    _, aux = moe(torch.randn(8, 4))
    assert float(aux.detach()) == pytest.approx(1.0)


def test_max_autotune_picks_the_blocks_compiled_with_max_autotune(monkeypatch):
    """``execution.max_autotune: [sequence]`` compiles only the sequence layers with Inductor's
    max-autotune mode (GEMM templates with fused epilogues); a kind that is not a block kind is a
    one-line error naming the field and the kinds."""
    from torch import nn

    from executor.parallelize import compile_dense

    model = build(scenarios.load("debug-cpu"))
    modes = {}
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kw: modes.__setitem__(type(self).__name__, kw["mode"]))
    compile_dense(model, max_autotune=scenarios.load("debug-cpu", ["execution.max_autotune=[sequence]"]).execution.max_autotune)
    assert modes["SequenceLayer"] == "max-autotune-no-cudagraphs"
    assert {m for k, m in modes.items() if k != "SequenceLayer"} == {None}
    with pytest.raises(ValueError, match=r"^execution.max_autotune.1: input should be 'sequence', 'nonsequence'"):
        scenarios.load("debug-cpu", ["execution.max_autotune=[sequence, ffn]"])
    with pytest.raises(ValueError, match="^execution.max_autotune block kind 'ffn': use sequence, nonsequence, cross or mlp$"):
        compile_dense(model, max_autotune=["ffn"])
