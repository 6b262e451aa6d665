"""``model.sequence.ffn_activation: gelu_tanh`` and ``execution.ffn_kernel: cublaslt`` (issue 25):
one Scenario field says which function the FFN computes, the execution choice how; the executor,
the twin and the resolver agree."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import scenarios
from scenarios.execution import resolve

TANH = ["model.sequence.ffn_activation=gelu_tanh"]


def test_auto_picks_the_epilogues_for_the_tanh_gelu_on_cuda_and_torch_on_cpu():
    s = scenarios.load("gem-h200-1gpu", TANH)
    assert resolve(s, "cuda").ffn_kernel == "cublaslt" and resolve(s, "cpu").ffn_kernel == "torch"
    assert resolve(scenarios.load("gem-h200-1gpu"), "cuda").ffn_kernel == "triton"  # exact GELU: unchanged


@pytest.mark.parametrize("sets, device, message", [
    (TANH + ["execution.ffn_kernel=triton"], "cuda", "execution.ffn_kernel triton computes exact GELU"),
    (["execution.ffn_kernel=cublaslt"], "cuda", "set model.sequence.ffn_activation: gelu_tanh"),
    (TANH + ["execution.ffn_kernel=cublaslt"], "cpu", "execution.ffn_kernel cublaslt needs CUDA"),
])  # fmt: skip
def test_a_kernel_that_computes_another_function_is_a_one_line_error(sets, device, message):
    with pytest.raises(ValueError, match=message):
        resolve(scenarios.load("gem-h200-1gpu", sets), device)


def test_the_sequence_layer_computes_the_tanh_gelu_ffn():
    from executor.model import SequenceLayer

    s = scenarios.load("debug-cpu", TANH)
    torch.manual_seed(0)
    layer = SequenceLayer(s.model, torch.float32)
    S = torch.randn(10, s.model.d_model)
    want = layer.ffn2(F.gelu(layer.ffn1(layer.ln2(S)), approximate="tanh"))
    torch.testing.assert_close(layer._ffn(S), want)
    exact = layer.ffn2(F.gelu(layer.ffn1(layer.ln2(S))))
    assert not torch.allclose(layer._ffn(S), exact, rtol=0, atol=1e-7)


def test_debug_cpu_trains_with_the_tanh_gelu_and_the_record_says_so(tmp_path):
    from executor.train import train

    s = scenarios.load("debug-cpu", TANH + ["training.eval_batches=0"])
    record = train(s, steps=2)
    assert all(math.isfinite(st.loss) for st in record.steps)
    assert record.scenario["model"]["sequence"]["ffn_activation"] == "gelu_tanh"
    assert record.execution["ffn_kernel"] == "torch"


def test_the_twin_prices_the_epilogues_from_their_measurement():
    """gelu_tanh on a GPU (``ffn_kernel`` auto -> cublaslt): each sequence layer's FFN activation costs
    ``execution.yaml ffn_cublaslt``'s share of the bias + GELU op, and nothing else moves."""
    from twin.execution_cost import family_data
    from twin.simulate import simulate
    from twin.workload import Hardware, build_graph

    def act(s):  # seconds of the FFN activations in one step's graph
        g = build_graph(s, Hardware.of(s))
        return sum(o.duration_s for o in getattr(g, "ops", g) if o.name.endswith(("mlp_act.fwd", "mlp_act.bwd")))

    b, t = scenarios.load("gem-h200-1gpu"), scenarios.load("gem-h200-1gpu", TANH)
    base, r = simulate(b), simulate(t)
    k = float(family_data("h200")["ffn_cublaslt"]["act_factor"])
    assert 0 < k < 1 and not any(c.startswith("execution.ffn_kernel") for c in r.execution_not_priced)
    assert act(t) == pytest.approx(k * act(b), rel=1e-6)
    assert base.step_time_s - r.step_time_s == pytest.approx(act(b) - act(t), rel=1e-3)


def test_gelu_tanh_grad_is_the_derivative_of_torchs_tanh_gelu():
    from kernels.ffn.epilogue import gelu_tanh_grad

    h = torch.linspace(-8, 8, 2001, dtype=torch.float64, requires_grad=True)
    (want,) = torch.autograd.grad(F.gelu(h, approximate="tanh").sum(), h)
    torch.testing.assert_close(gelu_tanh_grad(h.detach()), want, rtol=1e-12, atol=1e-12)


def test_gelu_ffn_linear_under_autocast_runs_in_the_autocast_dtype_and_grads_reach_fp32_params():
    from kernels.ffn.epilogue import gelu_ffn_linear

    torch.manual_seed(0)
    l1, l2 = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)
    x = torch.randn(12, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = gelu_ffn_linear(x, l1, l2)
        ref = l2(F.gelu(l1(x), approximate="tanh"))
    assert y.dtype == torch.bfloat16 == ref.dtype
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in (*l1.parameters(), *l2.parameters()))
