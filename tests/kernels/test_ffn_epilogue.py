"""The FFN with its GELU in cuBLASLt epilogues (``kernels.ffn.epilogue``): on CPU its torch-ops
path against autograd of the same function; on a GPU the two epilogue GEMMs against it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.ffn.epilogue import (DBIAS, gelu_ffn, linear_dgelu_bgrad, linear_dgelu_bgrad_ref, linear_gelu_aux,
                                  linear_gelu_aux_ref, linear_wgrad_bgrad, linear_wgrad_bgrad_ref)


def _case(T=37, d=24, H=64, dtype=torch.float32, device="cpu"):
    g = torch.Generator(device=device).manual_seed(0)
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, generator=g, device=device)).to(dtype).requires_grad_()  # noqa: E731
    return mk(T, d), mk(H, d, scale=d**-0.5), mk(H, scale=0.1), mk(d, H, scale=H**-0.5), mk(d, scale=0.1)


@pytest.mark.parametrize("dbias", DBIAS)
def test_gelu_ffn_is_the_tanh_gelu_ffn_with_its_gradients(dbias):
    """Forward and every gradient (x, w1, b1, w2, b2) equal autograd's of
    ``ffn2(gelu(ffn1(x), approximate="tanh"))``, wherever the bias gradient is summed: the
    backward's dGELU, bias gradient and four matmuls are the ones the epilogue path computes."""
    params = _case()
    y = gelu_ffn(*params, dbias=dbias)
    gy = torch.randn_like(y)
    got = torch.autograd.grad(y, params, gy)
    x, w1, b1, w2, b2 = params
    ref = F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)
    want = torch.autograd.grad(ref, params, gy)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    for name, a, b in zip(("x", "w1", "b1", "w2", "b2"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"d{name}: {m}")


def test_gelu_ffn_is_not_exact_gelu():
    """The path computes the tanh approximation: it differs from exact GELU (by ~1e-3 at most),
    which is why a model that takes it names the activation."""
    x, w1, b1, w2, b2 = _case()
    a, h = linear_gelu_aux_ref(x, w1, b1)
    exact = F.gelu(h)
    assert 1e-6 < float((a - exact).abs().max()) < 2e-3


def test_hidden_size_not_a_multiple_of_8_and_unknown_dbias_are_refused():
    x, w1, b1, w2, b2 = _case(H=60)
    with pytest.raises(ValueError, match="hidden size 60 must be a multiple of 8"):
        gelu_ffn(x, w1, b1, w2, b2)
    with pytest.raises(ValueError, match="dbias 'epilogue' is unknown; use one of: wgrad, dgelu, sum"):
        gelu_ffn(*_case(), dbias="epilogue")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cublaslt_epilogues_match_their_references():
    x, w1, b1, w2, _ = (p.detach() for p in _case(T=1000, d=256, H=1024, dtype=torch.bfloat16, device="cuda"))
    a, h = linear_gelu_aux(x, w1, b1)
    ar, hr = linear_gelu_aux_ref(x, w1, b1)
    dy = torch.randn(1000, 256, device="cuda").bfloat16()
    dh, db = linear_dgelu_bgrad(dy, w2, h)
    dhr, dbr = linear_dgelu_bgrad_ref(dy, w2, h)
    dh1, none = linear_dgelu_bgrad(dy, w2, h, bgrad=False)  # DGELU alone
    dw, dbw = linear_wgrad_bgrad(dh, x)  # the weight gradient with the bias gradient in its epilogue
    dwr, dbwr = linear_wgrad_bgrad_ref(dh, x)
    assert none is None
    for got, want in ((a, ar), (h, hr), (dh, dhr), (db, dbr), (dh1, dhr), (dw, dwr), (dbw, dbwr)):
        assert float((got.float() - want.float()).norm() / want.float().norm()) < 1e-2


def test_gelu_ffn_traces_whole_under_torch_compile():
    """The executor compiles its layers: the FFN's custom ops trace as single nodes (no graph break,
    ``fullgraph=True``), forward and backward, with the eager path's values."""
    x, w1, b1, w2, b2 = _case()
    f = torch.compile(lambda *a: gelu_ffn(*a), fullgraph=True, backend="aot_eager")
    y = f(x, w1, b1, w2, b2)
    got = torch.autograd.grad(y.sum(), (x, w1, b1, w2, b2))
    want = torch.autograd.grad(gelu_ffn(x, w1, b1, w2, b2).sum(), (x, w1, b1, w2, b2))
    torch.testing.assert_close(y, gelu_ffn(x, w1, b1, w2, b2))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
