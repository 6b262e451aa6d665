"""Fused bias + GELU (``kernels/ffn/bias_gelu.py``): the Triton kernels equal the fp32 reference
at tiny ragged shapes (Triton interpreter on CPU; several row programs, so the partial column
sums add up), the op's forward and gradients equal ``F.gelu(h0 + b)``'s, it traces under
``torch.compile(fullgraph=True)``, its fakes agree (``opcheck``), bad inputs raise errors that
name the argument, and the GPU bench refuses to run without CUDA."""

from __future__ import annotations

import os
import re

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton.jit in kernels.ffn is created

import torch.nn.functional as F  # noqa: E402

from kernels.ffn import bias_gelu as bg  # noqa: E402
from kernels.ffn.bias_gelu import (  # noqa: E402
    BWD_CONFIGS,
    DEFAULT,
    FWD_CONFIGS,
    bias_gelu,
    bias_gelu_bwd,
    bias_gelu_bwd_ref,
    bias_gelu_fwd,
    bias_gelu_fwd_ref,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# Small tiles: T=33 takes 3 row programs of 2 tiles (the last ragged), H=130 3 column blocks.
TINY_FWD = dict(BLOCK_T=8, BLOCK_H=64, num_warps=1)
TINY_BWD = dict(BLOCK_T=8, BLOCK_H=64, ROWS_PER_PROGRAM=2, num_warps=1)


def _inputs(T, H, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    h0, da = torch.randn(T, H, generator=g) * 3, torch.randn(T, H, generator=g)
    b = torch.randn(H, generator=g)
    return h0.to(DEV, dtype), b.to(DEV, dtype), da.to(DEV, dtype)


def _bf16_ulp(x):
    """The spacing of bf16 numbers at ``x`` (8 significant bits), at least the smallest normal's."""
    e = torch.frexp(x.float().abs().clamp_min(2.0**-126))[1]
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), e - 8)


def _assert_close(got, ref):
    """fp32: assert_close's defaults. bf16: within one ulp of the fp32 reference rounded to bf16,
    plus 1e-6: for x < -4, ``1 + erf(x/√2)`` cancels in fp32 (both sides), so the tail's tiny
    values differ by up to ~2e-7 absolute, a few bf16 ulps of a value near 1e-5."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, ref)
    else:
        err = (got.float() - ref.float()).abs()
        assert bool((err <= _bf16_ulp(ref) + 1e-6).all()), f"max err {err.max()} beyond 1 bf16 ulp + 1e-6"


def test_kernels_run_here():
    assert bg._runs_triton(torch.empty(1, device=DEV)), "TRITON_INTERPRET=1 was not set before triton.jit ran"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("H", [1, 7, 64, 130])
@pytest.mark.parametrize("T", [0, 1, 5, 33])
def test_kernels_match_reference(T, H, dtype):
    h0, b, da = _inputs(T, H, dtype, seed=T * 1000 + H)
    _assert_close(bias_gelu_fwd(h0, b, config=TINY_FWD), bias_gelu_fwd_ref(h0, b))
    dh, db = bias_gelu_bwd(da, h0, b, config=TINY_BWD)
    dh_ref, db_ref = bias_gelu_bwd_ref(da, h0, b)
    _assert_close(dh, dh_ref)
    if dtype == torch.float32:  # T <= 33 fp32 terms summed in another order
        torch.testing.assert_close(db, db_ref, rtol=1e-5, atol=1e-5 * max(T, 1))
    else:
        _assert_close(db, db_ref)
    if T == 0:
        assert torch.equal(db, torch.zeros_like(db))


def test_mixed_dtypes_bf16_activation_fp32_bias():
    h0, _, da = _inputs(33, 130, torch.bfloat16, seed=3)
    b = _inputs(1, 130, torch.float32, seed=4)[1]
    a = bias_gelu_fwd(h0, b, config=TINY_FWD)
    dh, db = bias_gelu_bwd(da, h0, b, config=TINY_BWD)
    assert (a.dtype, dh.dtype, db.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32)
    _assert_close(a, bias_gelu_fwd_ref(h0, b))
    dh_ref, db_ref = bias_gelu_bwd_ref(da, h0, b)
    _assert_close(dh, dh_ref)
    torch.testing.assert_close(db, db_ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", list(FWD_CONFIGS))
def test_every_fwd_config(name):
    h0, b, _ = _inputs(5, 130, torch.float32)
    torch.testing.assert_close(bias_gelu_fwd(h0, b, config=name), bias_gelu_fwd_ref(h0, b))


@pytest.mark.parametrize("name", list(BWD_CONFIGS))
def test_every_bwd_config(name):
    h0, b, da = _inputs(5, 130, torch.float32)
    for got, ref in zip(bias_gelu_bwd(da, h0, b, config=name), bias_gelu_bwd_ref(da, h0, b), strict=True):
        torch.testing.assert_close(got, ref)


def test_defaults_are_table_entries():
    assert DEFAULT["fwd"] in FWD_CONFIGS and DEFAULT["bwd"] in BWD_CONFIGS


def _grads(fn, h0, b, w):
    h0, b = h0.detach().requires_grad_(), b.detach().requires_grad_()
    y = fn(h0, b)
    (y * w).sum().backward()
    return y.detach(), h0.grad, b.grad


def test_op_autograd_matches_gelu():
    h0, b, w = _inputs(33, 130, torch.float32, seed=5)
    for got, ref in zip(_grads(bias_gelu, h0, b, w), _grads(lambda h, c: F.gelu(h + c), h0, b, w), strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_op_autograd_mixed_dtypes():
    h0, _, w = _inputs(5, 64, torch.bfloat16, seed=6)
    b = _inputs(1, 64, torch.float32, seed=7)[1]
    y, dh0, db = _grads(bias_gelu, h0, b, w)
    assert (y.dtype, dh0.dtype, db.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32)
    _, dh0_ref, db_ref = _grads(lambda h, c: F.gelu(h.float() + c), h0, b, w.float())
    _assert_close(dh0, dh0_ref.to(torch.bfloat16))
    torch.testing.assert_close(db, db_ref, rtol=1e-5, atol=1e-5)


def test_op_under_autocast():
    """bf16 autocast: ``h0`` comes out of the matmul in bf16, ``b`` stays an fp32 Parameter."""
    g = torch.Generator().manual_seed(11)
    x, w1, w2 = (torch.randn(shape, generator=g).to(DEV) for shape in ((6, 32), (32, 16), (16, 8)))
    b = torch.randn(16, generator=g).to(DEV).requires_grad_()
    w1.requires_grad_()
    with torch.autocast(DEV, dtype=torch.bfloat16):
        h0 = x @ w1
        a = bias_gelu(h0, b)
        y = a @ w2
    h0.retain_grad()
    a.retain_grad()
    y.float().sum().backward()
    assert (h0.dtype, a.dtype, b.grad.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32)
    dh_ref, db_ref = bias_gelu_bwd_ref(a.grad.float(), h0.detach(), b.detach())
    _assert_close(h0.grad, dh_ref.to(torch.bfloat16))
    torch.testing.assert_close(b.grad, db_ref, rtol=1e-5, atol=1e-5)


def test_gradcheck_float64_reference_path():
    h0, b, _ = _inputs(4, 5, torch.float64, seed=8)  # fp64 is not a kernel dtype: the reference runs
    assert not bg._runs_triton(h0)
    assert torch.autograd.gradcheck(bias_gelu, (h0.requires_grad_(), b.requires_grad_()))


def test_compile_fullgraph_matches_eager():
    h0, b, w = _inputs(5, 64, torch.float32, seed=9)

    def fn(h, c):
        return bias_gelu(h, c) * 2.0 + 1.0

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for got, ref in zip(_grads(compiled, h0, b, w), _grads(fn, h0, b, w), strict=True):
        torch.testing.assert_close(got, ref)


def test_opcheck_fakes_agree():
    h0, b, da = _inputs(5, 7, torch.float32, seed=10)
    torch.library.opcheck(torch.ops.gemtwin.bias_gelu, (h0, b), test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.gemtwin.bias_gelu_bwd, (da, h0, b), test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize(("h0_shape", "b_shape", "message"), [
    ((64,), (64,), "bias_gelu: h0 must be 2-D [T, H]; got shape (64,) (reshape it to [-1, H])"),
    ((5, 64), (63,), "bias_gelu: b must be [H] = [64] to match h0 (5, 64); got shape (63,)"),
])
def test_bad_input_names_the_argument(h0_shape, b_shape, message):
    h0, b = torch.zeros(h0_shape, device=DEV), torch.zeros(b_shape, device=DEV)
    for fn in (bias_gelu, bias_gelu_fwd, lambda h, c: bias_gelu_bwd(h, h, c)):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            fn(h0, b)


def test_bad_dA_and_layout():
    h0, b, _ = _inputs(5, 8, torch.float32)
    with pytest.raises(ValueError, match=r"^bias_gelu_bwd: da must have h0's shape"):
        bias_gelu_bwd(h0[:4], h0, b)
    with pytest.raises(ValueError, match=r"h0 of shape \(8, 5\) must be contiguous; pass h0.contiguous\(\)"):
        bias_gelu_fwd(h0.t(), torch.zeros(5, device=DEV))
    torch.testing.assert_close(bias_gelu(h0.t(), b[:5]), bias_gelu_fwd_ref(h0.t(), b[:5]))  # the op copies


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_bench_exits_2_without_cuda(tmp_path, capsys):
    from kernels.ffn import bench_bias_gelu

    assert bench_bias_gelu.main(["--out", str(tmp_path)]) == 2
    out = capsys.readouterr().out.strip()
    assert "\n" not in out and "CUDA" in out


def test_fast_erf_is_within_its_bound_over_the_whole_range():
    """The fast erf (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7, so Φ within 7.5e-8) in fp32,
    forward and backward, from the far negative tail (where 1 + erf cancels) to saturation: GELU
    within |x|·3e-7 + 1e-7 of ``F.gelu`` (Φ within 7.5e-8 from the approximation, plus the fp32
    rounding of the erf it evaluates near ±1: 3 ulps of 1 are 1.8e-7 of Φ, which this
    environment's interpreter, triton 3.7.1, reaches at |x| ≈ 3) and dH within 2e-7·(1 + |x|) of
    the exact derivative's. It is the default for 16-bit activations only."""
    x = torch.linspace(-12, 12, 2 * 130 + 1)[:260].reshape(2, 130)
    b = torch.zeros(130)
    da = torch.ones_like(x)
    fast_fwd, fast_bwd = dict(TINY_FWD, FAST_ERF=True), dict(TINY_BWD, FAST_ERF=True)
    a = bias_gelu_fwd(x, b, config=fast_fwd)
    assert bool(((a - bias_gelu_fwd_ref(x, b)).abs() <= 3e-7 * x.abs() + 1e-7).all())
    dh, _ = bias_gelu_bwd(da, x, b, config=fast_bwd)
    assert bool(((dh - bias_gelu_bwd_ref(da, x, b)[0]).abs() <= 2e-7 * (1 + x.abs())).all())
    assert bg._fast_erf({}, x.bfloat16()) and not bg._fast_erf({}, x)
