"""Each GEM component against a simple reference, and its FLOPs against the twin's count.

- MoE with one expert (top-1) is exactly that expert's MLP, with a load-balancing loss of 1;
- a cross layer equals per-sample float64 softmax attention (both directions, length-0 samples);
- every component (bottom MLP, pooled projection, sequence input, input compression, sequence
  layer, non-sequence layer, cross layer, heads), run alone forward and backward under
  ``FlopCounterMode``, costs exactly the FLOPs ``twin.flops.model_costs`` gives its layer;
- training on CPU is deterministic for a seed.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import scenarios
from executor.data import SyntheticData
from executor.model import CrossLayer, MoE, _segment_mean
from executor.parallelize import build
from scenarios.schema import MoE as MoEConfig
from twin import flops


def test_moe_with_one_expert_is_the_mlp():
    torch.manual_seed(0)
    moe = MoE(8, MoEConfig(num_experts=1, top_k=1, expert_hidden=16)).double()
    h = torch.randn(30, 8, dtype=torch.float64)
    out, aux = moe(h)
    ex = moe.experts  # one expert, its weights stacked: [1, He, d], [1, He], [1, d, He], [1, d]

    def expert(x):  # Linear(d→He) → GELU → Linear(He→d)
        return F.linear(F.gelu(F.linear(x, ex.w1[0], ex.b1[0])), ex.w2[0], ex.b2[0])

    mlp = expert(h)
    torch.testing.assert_close(out, mlp, rtol=1e-12, atol=1e-12)
    assert float(aux.detach()) == pytest.approx(1.0)
    hg = h.clone().requires_grad_()
    g1 = torch.autograd.grad(moe(hg)[0].sum(), hg)[0]
    hg2 = h.clone().requires_grad_()
    g2 = torch.autograd.grad(expert(hg2).sum(), hg2)[0]
    torch.testing.assert_close(g1, g2)


def test_cross_layer_matches_per_sample_attention():
    s = scenarios.load("debug-cpu")
    torch.manual_seed(1)
    layer = CrossLayer(s.model).double()
    d, N, H, D = s.model.d_model, s.model.nonseq.num_tokens, s.model.cross.heads, s.model.cross.head_dim
    lengths = [3, 0, 5, 1]
    offsets = torch.tensor([0] + lengths).cumsum(0)
    S = torch.randn(sum(lengths), d, dtype=torch.float64)
    X = torch.randn(len(lengths), N, d, dtype=torch.float64)
    S_new, X_new = layer(S, X, offsets, max(lengths))

    def attend(q, k, v):  # [Lq, H, D] x [Lk, H, D] -> [Lq, H, D], softmax, scale 1/sqrt(D)
        if k.shape[0] == 0:
            return torch.zeros_like(q)
        p = torch.softmax(torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(D), dim=-1)
        return torch.einsum("hij,jhd->ihd", p, v)

    for b, (s0, s1) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
        Sb, Xb = S[s0:s1], X[b]
        q = layer.s_q(layer.s_ln_q(Sb)).view(-1, H, D)
        k, v = layer.s_kv(layer.s_ln_kv(Xb)).view(N, 2, H, D).unbind(1)
        expected_S = Sb + layer.s_out(attend(q, k, v).reshape(-1, H * D))
        torch.testing.assert_close(S_new[s0:s1], expected_S)
        q = layer.x_q(layer.x_ln_q(Xb)).view(N, H, D)
        k, v = layer.x_kv(layer.x_ln_kv(Sb)).view(-1, 2, H, D).unbind(1)
        expected_X = Xb + layer.x_out(attend(q, k, v).reshape(N, H * D))
        torch.testing.assert_close(X_new[b], expected_X)


def _count(fn, *inputs) -> int:
    with FlopCounterMode(display=False) as fc:
        out = fn(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad).backward()
    return fc.get_total_flops()


@pytest.mark.parametrize("overrides", [[], ["model.sequence.attention=gdpa", "model.moe.num_experts=0"],
                                       ["model.sequence.attention=block", "model.sequence.block_size=5"]])
def test_every_component_costs_the_twins_flops(overrides):
    s = scenarios.load("debug-cpu", overrides)
    m = s.model
    model = build(s)
    B = 6
    batch = SyntheticData(s, 0).batch(B)
    groups = [batch.sequences[g.name].lengths.tolist() for g in m.embeddings.sequences]
    twin: dict[str, float] = {}
    for op in flops.model_costs(m, batch=B, seq=flops.SeqStats.from_lengths(m, groups)):
        twin[op.layer] = twin.get(op.layer, 0.0) + op.flops
    d, N = m.d_model, m.nonseq.num_tokens
    lengths = batch.seq_lengths()
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    max_len = int(lengths.max())
    S = torch.randn(int(offsets[-1]), d, requires_grad=True)
    X = torch.randn(B, N, d, requires_grad=True)
    T0 = 1 + sum(f.count for f in m.embeddings.pooled)
    counted = {
        "bottom": _count(model.bottom, batch.dense),
        "seq_in": _count(model.groups[0], batch),
        "compress": _count(model._input_compression, torch.randn(B, T0, d, requires_grad=True)),
        "head": _count(lambda z: model.heads(model.top(z)), torch.randn(B, d + N * d, requires_grad=True)),
    }
    for fam in m.embeddings.pooled:
        if fam.name in model.family_proj:
            x = torch.randn(B, fam.count, fam.dim, requires_grad=True)
            counted["pooled_proj"] = counted.get("pooled_proj", 0) + _count(model.family_proj[fam.name], x)
    for i, layer in enumerate(model.seq_layers):
        counted[f"seq{i}"] = _count(lambda s: layer(s, offsets, max_len), S)
    for i, layer in enumerate(model.nonseq_layers):
        counted[f"ns{i}"] = _count(layer, X)
    for j, layer in enumerate(model.cross_layers):
        counted[f"cross{j}"] = _count(lambda s, x: layer(s, x, offsets, max_len), S, X)
    assert set(counted) == {k for k, v in twin.items() if v}  # every counted layer, nothing left over
    for layer_name, n in counted.items():
        assert n == pytest.approx(twin[layer_name], rel=1e-12), layer_name


def test_segment_mean_of_empty_sample_is_zero():
    S = torch.arange(12.0).view(4, 3)
    offsets = torch.tensor([0, 3, 3, 4])
    torch.testing.assert_close(_segment_mean(S, offsets), torch.stack([S[:3].mean(0), torch.zeros(3), S[3]]))


def test_training_on_cpu_is_deterministic_for_a_seed():
    """Bit-identical with one intra-op thread. With 2 threads two runs were seen to differ by
    ~1e-8 in the cross layer's non-sequence←sequence weights and everything after it (a
    multithreaded CPU reduction in that attention's backward; measured 2026-11-30)."""
    from executor.train import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _deterministic(train)
    finally:
        torch.set_num_threads(threads)


def _deterministic(train):
    s = scenarios.load("debug-cpu", ["training.micro_batch=32", "training.global_batch=32"])
    runs = [train(s, steps=3, profile_steps=0, warmup_steps=0, log=lambda _: None) for _ in range(2)]
    assert [x.loss for x in runs[0].steps] == [x.loss for x in runs[1].steps]
    assert runs[0].metrics == runs[1].metrics
    other = train(scenarios.load("debug-cpu", ["training.micro_batch=32", "training.global_batch=32",
                                               "training.seed=1"]), steps=3, profile_steps=0, warmup_steps=0,
                  log=lambda _: None)
    assert [x.loss for x in other.steps] != [x.loss for x in runs[0].steps]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("overrides", [[], ["model.sequence.attention=gdpa"],
                                       ["model.sequence.attention=block", "model.sequence.block_size=4"],
                                       ["model.sequence.attention=gdpa", "precision.attention=mxfp8"]])
def test_triton_attention_kernels_train_like_the_reference(overrides, device):
    """The model on the ``kernels/`` attention (Triton; the interpreter on CPU) gives the
    reference attention's logits and gradients: switching the executor to the kernels changes
    speed, not the function (self attention of every kind, MXFP8 GDPA against its padded
    emulation, and both cross directions)."""
    from executor.model import compute_loss
    from executor.parallelize import set_attention_kernel

    s = scenarios.load("debug-cpu", ["training.micro_batch=4", "training.global_batch=4",
                                     "model.embeddings.sequences.0.length.max=9", "model.embeddings.sequences.0.length.mean=5",
                                     "model.sequence.num_layers=1",
                                     *overrides])  # fmt: skip
    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the Triton interpreter is off where CUDA is present; the cuda case runs instead")
    batch = next(SyntheticData(s, 0)).to(device)
    out = {}
    for kernel in ("reference", "triton"):
        with torch.device(device):
            model = build(s)  # fp32: the kernels take bf16/fp16/fp32
        set_attention_kernel(model, kernel)
        logits, aux = model(batch)
        compute_loss(logits, batch.labels, aux).backward()
        out[kernel] = (logits, {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    tol = dict(rtol=1e-5, atol=1e-6) if device == "cpu" else dict(rtol=2e-3, atol=1e-4)  # TF32 on CUDA
    if "precision.attention=mxfp8" in overrides:  # bf16 attention: outputs one bf16 rounding apart
        tol = dict(rtol=2e-3, atol=2e-4)
    torch.testing.assert_close(out["triton"][0], out["reference"][0], **tol)
    assert out["triton"][1].keys() == out["reference"][1].keys()
    for name, g in out["reference"][1].items():
        torch.testing.assert_close(out["triton"][1][name].to_dense(), g.to_dense(), rtol=10 * tol["rtol"], atol=tol["atol"],
                                   msg=lambda m, n=name: f"{n}: {m}")


def test_execution_flash_reaches_the_triton_core(monkeypatch):
    """``execution.flash`` (the core's variants) is set on every attention layer by
    ``executor.parallelize`` and arrives with every call of the Triton core, self and cross
    attention alike: nothing reaches the core around the Scenario."""
    from kernels.attention.spec import FlashOptions
    from kernels.flash import core

    if torch.cuda.is_available():
        pytest.skip("the Triton interpreter is off where CUDA is present")
    s = scenarios.load("debug-cpu", ["training.micro_batch=4", "training.global_batch=4",
                                     "model.embeddings.sequences.0.length.max=9", "model.embeddings.sequences.0.length.mean=5",
                                     "model.sequence.num_layers=1", "execution.attention_kernel=triton",
                                     "execution.flash.fused_short=false", "execution.flash.block_local=false",
                                     "execution.flash.tma=false"])  # fmt: skip
    seen = []
    fwd = core.attention_fwd
    monkeypatch.setattr(core, "attention_fwd", lambda *a, flash, **kw: seen.append(flash) or fwd(*a, flash=flash, **kw))
    model = build(s)
    assert {m.flash for m in model.modules() if hasattr(m, "attention_kernel")} == {FlashOptions(False, False, tma="off")}
    model(next(SyntheticData(s, 0)))
    assert len(seen) == 1 + 2 * s.model.cross.num_layers and set(seen) == {FlashOptions(False, False, tma="off")}


def test_grouped_moe_equals_the_expert_loop():
    """The sync-free grouped-matmul MoE (the CUDA path) computes the per-expert loop's output,
    load-balancing loss and gradients, with an expert that gets no token."""
    torch.manual_seed(0)
    moe = MoE(16, MoEConfig(num_experts=4, top_k=2, expert_hidden=32))
    h = torch.randn(40, 16).abs()
    with torch.no_grad():  # positive logits for experts 0-2, negative for expert 3: it gets no token
        moe.router.weight.abs_()
        moe.router.weight[3] *= -1
    w = torch.randn(40, 16)
    res = {}
    for grouped in (False, True):
        moe.grouped = grouped
        moe.zero_grad()
        hg = h.clone().requires_grad_()
        out, aux = moe(hg)
        ((out * w).sum() + aux).backward()
        res[grouped] = out, aux, hg.grad, [p.grad.clone() for p in moe.parameters()]
    assert int((moe.route(h)[1] == 3).sum()) == 0
    torch.testing.assert_close(res[True][0], res[False][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res[True][1], res[False][1])
    torch.testing.assert_close(res[True][2], res[False][2], rtol=1e-5, atol=1e-5)
    for grads in res.values():  # expert 3 (row 3 of each stacked expert weight) learns nothing
        assert not any(g[3].any() for g in grads[3][1:])
    for g1, g0 in zip(res[True][3], res[False][3]):
        torch.testing.assert_close(g1, g0, rtol=1e-4, atol=1e-5)


def _two_group_scenario(overrides):
    """debug-cpu with a second sequence group (its own lengths and a table of another dim)."""
    from scenarios.loader import apply_set, read_raw, validate

    raw = read_raw("debug-cpu")
    for o in overrides:
        raw = apply_set(raw, o)
    raw["model"]["embeddings"]["sequences"].append(
        {"name": "clicks", "length": {"shape": "uniform", "max": 9, "mean": 5},
         "tables": [{"name": "cat", "rows": 50, "dim": 16}]})
    return validate(raw)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("kernel", ["reference", "triton"])
def test_static_shape_batch_changes_nothing(kernel, groups, device):
    """A static-shape batch (every packed id layout padded to a bucket, ``Batch.pack(bucket=)``,
    what CUDA graphs replay) gives the logits, the load-balancing loss, every dense and sparse
    gradient, and the fused row-wise Adagrad update of the unpadded batch: padding tokens get
    zero attention output and zero gradient, padding ids are skipped by the lookups' backward."""
    from executor.model import compute_loss
    from executor.parallelize import set_attention_kernel, set_embedding_kernel
    from kernels.embedding.tbe import RowwiseAdagradInBackward

    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the Triton interpreter (the lookups on CPU) is off where CUDA is present")
    overrides = ["training.micro_batch=6", "training.global_batch=6", "model.sequence.num_layers=1",
                 "model.sequence.attention=gdpa"]
    s = scenarios.load("debug-cpu", overrides) if groups == 1 else _two_group_scenario(overrides)
    batch = next(SyntheticData(s, 0))
    batch.validate(s.model)
    batch = batch.to(device)
    out = {}
    for bucket in (0, 64):
        batch.pack(s.model, bucket=bucket)
        with torch.device(device):
            model = build(s)
        set_attention_kernel(model, kernel)
        set_embedding_kernel(model, "triton")
        tokens, offsets = model._sequence_tokens(batch)
        per_group = [int(g.offsets[-1]) for g in batch.sequences.values()]
        assert tokens.shape[0] == sum(-(-n // bucket) * bucket if bucket else n for n in per_group)
        assert bucket == 0 or tokens.shape[0] > int(offsets[-1])  # the stream is padded
        logits, aux = model(batch)
        compute_loss(logits, batch.labels, aux).backward()
        grads = {n: p.grad.to_dense() for n, p in model.named_parameters() if p.grad is not None}
        fused = [f for m in (model.pooled, *model.groups) for f in m.fused]
        for f in fused:  # now the sparse update inside the backward
            f.in_backward = RowwiseAdagradInBackward(f, lr=0.1)
        logits2, aux2 = model(batch)
        compute_loss(logits2, batch.labels, aux2).backward()
        out[bucket] = logits, aux, grads, [f.buffer.clone() for f in fused], [f.in_backward.state for f in fused]
    torch.testing.assert_close(out[64][0], out[0][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[64][1], out[0][1])
    assert out[64][2].keys() == out[0][2].keys()
    for name, g in out[0][2].items():
        torch.testing.assert_close(out[64][2][name], g, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    for padded, plain in zip(out[64][3] + out[64][4], out[0][3] + out[0][4]):
        torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-6)


def test_activation_checkpointing_keeps_less_and_changes_nothing():
    """``parallelism.activation_checkpointing``: selective recomputes the attention, full each
    layer; autograd keeps less for backward (none > selective > full) and the loss and every
    gradient are the same."""
    from executor.model import compute_loss

    base = ["training.micro_batch=8", "training.global_batch=8", "model.sequence.attention=gdpa"]
    batch = next(SyntheticData(scenarios.load("debug-cpu", base), 0))
    res = {}
    for policy in ("none", "selective", "full"):
        model = build(scenarios.load("debug-cpu", [*base, f"parallelism.activation_checkpointing={policy}"]))
        assert model.checkpointing == policy
        saved = []

        def keep(t, saved=saved):
            saved.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            logits, aux = model(batch)
        loss = compute_loss(logits, batch.labels, aux)
        loss.backward()
        res[policy] = loss.detach(), sum(saved), {n: p.grad.to_dense() for n, p in model.named_parameters()
                                                  if p.grad is not None}  # fmt: skip
    assert res["none"][1] > res["selective"][1] > res["full"][1]
    for policy in ("selective", "full"):
        torch.testing.assert_close(res[policy][0], res["none"][0])
        assert res[policy][2].keys() == res["none"][2].keys()
        for name, g in res["none"][2].items():
            torch.testing.assert_close(res[policy][2][name], g, msg=lambda m, n=name: f"{policy} {n}: {m}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("kind", ["gdpa", "jfa"])
def test_compiled_layers_keep_the_triton_attention_in_their_graph(kind, device):
    """On the Triton kernels the attention is an op that ``torch.compile`` traces into the layer's
    graph (``fullgraph=True`` fails on any graph break), so the residual adds and norms around it
    fuse with the rest of the layer; compiled, a sequence layer and a cross layer (selective
    recompute on: the softmax kinds run their forward again in backward) give the eager outputs
    and gradients, with a length-0 sample and padding rows. CPU: the interpreter and the
    ``aot_eager`` backend; CUDA: Inductor, as the executor compiles."""
    from executor.parallelize import set_attention_kernel

    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the Triton interpreter is off where CUDA is present; the cuda case runs instead")
    s = scenarios.load("debug-cpu", [f"model.sequence.attention={kind}", "parallelism.activation_checkpointing=selective"])
    torch.manual_seed(0)
    with torch.device(device):
        model = build(s)
    set_attention_kernel(model, "triton")
    seq, cross = model.seq_layers[0], model.cross_layers[0]
    seq.ffn_kernel = "triton"  # the FFN's bias + GELU op (kernels.ffn.bias_gelu) is in the graph too
    offsets, rows, d = torch.tensor([0, 5, 5, 14, 17], device=device), 20, s.model.d_model
    S = torch.randn(rows, d, device=device, requires_grad=True)
    X = torch.randn(4, s.model.nonseq.num_tokens, d, device=device, requires_grad=True)
    params = [*seq.parameters(), *cross.parameters()]

    def run(seq, cross):
        S2, X2 = cross(seq(S, offsets, 9), X, offsets, 9)
        loss = (S2[:17] ** 2).sum() + (X2**2).sum()  # padding rows: no gradient flows back from them
        return [S2, X2, *torch.autograd.grad(loss, [S, X, *params])]

    eager = run(seq, cross)
    backend = "aot_eager" if device == "cpu" else "inductor"
    compiled = run(*(torch.compile(m, fullgraph=True, dynamic=True, backend=backend) for m in (seq, cross)))
    tol = dict(rtol=1e-5, atol=1e-6) if device == "cpu" else dict(rtol=2e-3, atol=1e-4)  # TF32, fused reductions
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, **tol)
    assert not eager[2][17:].any()


def test_sequence_ffn_bias_gelu_op_equals_linear_then_gelu(monkeypatch):
    """The sequence FFN's fused path (ffn1's matmul, then ``kernels.ffn.bias_gelu``: the bias, the
    GELU, and in backward the bias gradient in one pass) gives ``ffn2(gelu(ffn1(x)))``'s outputs
    and every parameter's gradient; ``execution.ffn_kernel`` picks it, and a bad value is a one-line
    error naming the field."""
    s = scenarios.load("debug-cpu")
    torch.manual_seed(0)
    layer = build(s).seq_layers[0]
    S = torch.randn(23, s.model.d_model, requires_grad=True)
    offsets = torch.tensor([0, 9, 23])
    import kernels.ffn.bias_gelu as fused

    calls = []
    monkeypatch.setattr(fused, "bias_gelu", lambda h0, b: calls.append(h0.shape) or fused._bias_gelu_op(h0, b))
    out = {}
    for kind in ("torch", "triton"):
        layer.ffn_kernel = kind
        y = layer(S, offsets, 14)
        out[kind] = [y, *torch.autograd.grad((y**2).sum(), [S, *layer.parameters()])]
    for a, b in zip(out["triton"], out["torch"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert calls == [(23, s.model.sequence.ffn_mult * s.model.d_model)]  # the triton run only
    with pytest.raises(ValueError, match="^execution.ffn_kernel: input should be 'auto', 'triton', 'torch' or 'cublaslt'"):
        scenarios.load("debug-cpu", ["execution.ffn_kernel=fused"])
    layer = build(scenarios.load("debug-cpu", ["execution.ffn_kernel=torch"])).seq_layers[0]
    assert layer.ffn_kernel == "torch"
