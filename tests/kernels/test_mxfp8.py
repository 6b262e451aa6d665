"""MXFP8: quantize bit-exact vs the reference (Triton interpreter on CPU), roundtrip bound, GEMM vs
dequantize + fp32 matmul, MXFP8Linear grads, the guard's fallback, GDPA, cost (the tiny parity
run is in tests/executor/test_bench_scripts.py)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton.jit in kernels.mxfp8 is created

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kernels.mxfp8 import cost  # noqa: E402
from kernels.mxfp8.reference import (  # noqa: E402
    dequantize_ref,
    exp2i,
    fake_quantize,
    mx_mm_ref,
    quantize_ref,
    scale_exponent,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _weird(rows, cols, lo, hi, zero_rows, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(lo, hi, cols)[None, :]
    x[:zero_rows] = 0
    return x.to(dtype).to(DEV)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(1, 40), cols=st.integers(1, 80), dim=st.sampled_from([0, 1]),
       elem=st.sampled_from(["e4m3", "e5m2"]), lo=st.integers(-38, 0), hi=st.integers(0, 38),
       zero_rows=st.integers(0, 2), seed=st.integers(0, 2**16), dtype=st.sampled_from([torch.bfloat16, torch.float32]))
@example(rows=1, cols=1, dim=0, elem="e4m3", lo=-38, hi=0, zero_rows=0, seed=1, dtype=torch.bfloat16)  # a bf16 subnormal (CI, 2026-11-30)
def test_quantize_triton_bit_exact(rows, cols, dim, elem, lo, hi, zero_rows, seed, dtype):
    from kernels.mxfp8.quantize import quantize

    x = _weird(rows, cols, lo, hi, zero_rows, seed, dtype)
    d, s = quantize(x, dim, elem)
    dr, sr = quantize_ref(x, dim, elem)
    assert torch.equal(s, sr)
    assert torch.equal(d.view(torch.uint8), dr.view(torch.uint8))


def test_quantize_nan_inf_blocks_and_zero_blocks():
    from kernels.mxfp8.quantize import quantize

    x = torch.randn(4, 96)
    x[0, 3], x[1, 40], x[2, :32] = float("nan"), float("-inf"), 0.0
    for d, s in (quantize(x.to(DEV), 1), quantize_ref(x, 1)):
        s = s.cpu()
        assert s[0, 0] == 255 and s[1, 1] == 255 and s[2, 0] == 0  # NaN code; amax=0 -> 2^-127
        assert s[0, 1] != 255 and s[1, 0] != 255
        deq = dequantize_ref(d.cpu(), s)
        assert torch.isnan(deq[0, :32]).all() and torch.isnan(deq[1, 32:64]).all()
        assert (deq[2, :32] == 0).all() and torch.isfinite(deq[3]).all()


def test_scale_rule_rounds_up_never_saturates():
    amax = torch.tensor([448.0, 448.1, 449.0, 1.0, 0.0, 1e-45, 3.3e38, 224.0, 2 * 448.0])
    e = scale_exponent(amax)
    assert e.tolist() == [0, 1, 1, -8, -127, -127, 120, -1, 1]
    assert (amax <= 448.0 * exp2i(e)).all()  # no element saturates
    ok = e > -127
    assert (amax[ok] > 448.0 * exp2i(e[ok] - 1)).all()  # and it is the smallest such e


def test_non_multiple_of_32_is_zero_padded():
    x = torch.randn(3, 45)
    d, s = quantize_ref(x, 1)
    assert d.shape == (3, 64) and s.shape == (3, 2)
    assert (d[:, 45:].float() == 0).all()
    d0, s0 = quantize_ref(x, 0)
    assert d0.shape == (45, 32) and s0.shape == (45, 1)


@pytest.mark.parametrize("elem,bound", [("e4m3", 2.0**-4), ("e5m2", 2.0**-3)])
def test_dequantize_roundtrip_error_bound(elem, bound):
    x = torch.randn(64, 256) * torch.logspace(-3, 3, 256)
    y = fake_quantize(x, 1, elem)
    emin = -6 if elem == "e4m3" else -14  # smallest normal exponent of the element format
    scale = exp2i(scale_exponent(x.abs().reshape(64, 8, 32).amax(-1), elem)).repeat_interleave(32, 1)
    big = x.abs() >= 2.0**emin * scale
    # normal elements: relative error <= half an ulp; everything: absolute error <= half a subnormal step
    assert ((y - x).abs() <= bound * x.abs())[big].all()
    rel = (y - x).norm() / x.norm()
    assert rel < bound


@pytest.mark.parametrize("backend", ["emulated"])
def test_gemm_matches_dequantize_fp32_matmul(backend):
    from kernels.mxfp8.gemm import mx_mm

    g = torch.Generator().manual_seed(1)
    M, N, K = 24, 20, 160  # K: 5 blocks, not a multiple of SUB=2 (masked tail)
    a = torch.randn(M, K, generator=g) * torch.logspace(-4, 4, K)
    b = torch.randn(N, K, generator=g)
    qa, sa = quantize_ref(a, 1)
    qb, sb = quantize_ref(b, 1)
    ref = mx_mm_ref(qa, sa, qb, sb).double()
    ref64 = dequantize_ref(qa, sa).double() @ dequantize_ref(qb, sb).double().t()
    c = mx_mm(qa.to(DEV), sa.to(DEV), qb.to(DEV), sb.to(DEV), torch.float32, backend=backend).cpu().double()
    assert (c - ref64).norm() / ref64.norm() < 1e-6  # fp32 accumulation error only
    assert (ref - ref64).norm() / ref64.norm() < 1e-6
    with pytest.raises(ValueError, match="share K"):
        mx_mm(qa, sa, qb[:, :128], sb[:, :4])


def test_mxfp8_linear_grads_close_to_fp32():
    from kernels.mxfp8.linear import MXFP8Linear

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    mx = MXFP8Linear.from_linear(torch.nn.Linear(64, 48))
    mx.weight, mx.bias = torch.nn.Parameter(lin.weight.detach().clone()), torch.nn.Parameter(lin.bias.detach().clone())
    x = torch.randn(70, 64)  # 70 rows: wgrad's contraction is zero-padded to 96
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = lin(x1), mx(x2)
    g = torch.randn_like(y1)
    y1.backward(g)
    y2.backward(g)

    def rel(a, b):
        return float((a - b).detach().norm() / b.detach().norm())

    assert rel(y2, y1) < 0.06
    assert rel(x2.grad, x1.grad) < 0.08
    assert rel(mx.weight.grad, lin.weight.grad) < 0.08
    assert rel(mx.bias.grad, lin.bias.grad) < 1e-5
    assert not mx.fallback and mx.max_rel_err < 0.06


def test_guard_falls_back_on_a_bad_layer(caplog):
    from kernels.mxfp8.linear import MXFP8Linear

    torch.manual_seed(0)
    mx = MXFP8Linear(64, 16, bias=False, name="crafted", threshold=0.1)
    with torch.no_grad():
        mx.weight.normal_()
        mx.weight[:, ::32] = 1e6  # one huge weight per block: the rest flushes to zero in E4M3
    x = torch.randn(40, 64)
    x[:, ::32] = 0.0  # ...and it multiplies a feature that is always 0: the bf16 output is all small terms
    with caplog.at_level("WARNING", logger="mxfp8"):
        mx(x)
    assert mx.fallback and mx.max_rel_err > 0.5
    assert "crafted" in caplog.text and "falls back to bf16" in caplog.text
    y = mx(x)  # now plain bf16
    ref = torch.nn.functional.linear(x.bfloat16(), mx.weight.bfloat16()).float()
    assert torch.equal(y.float(), ref)


def test_guard_runs_on_eager_calls_only_and_compiled_calls_never_break():
    """The guard syncs with the host, so under ``torch.compile`` it is skipped (a graph break there
    recompiled for every error value: the MXFP8 parity runs hit dynamo's recompile limit); the
    executor runs a compiled model eagerly (``set_stance("force_eager")``) until no guard is
    pending, then compiled."""
    from executor.runtime import eager_while_guarded as _eager_while_guarded
    from kernels.mxfp8.linear import MXFP8Linear, guard_pending

    torch.manual_seed(0)
    mx = MXFP8Linear(64, 32, guard_calls=2)
    compiled = torch.compile(mx, fullgraph=True, backend="aot_eager")  # fullgraph: a break raises
    x = torch.randn(8, 64)
    y = compiled(x)
    assert mx.calls == 0 and guard_pending(mx)
    for _ in range(2):
        with _eager_while_guarded(mx, compiled=True):
            torch.testing.assert_close(compiled(x), y)
    assert mx.calls == 2 and not guard_pending(mx) and 0 < mx.max_rel_err < 0.06
    with _eager_while_guarded(mx, compiled=True):  # nothing pending: compiled (fullgraph), no guard call
        torch.testing.assert_close(compiled(x), y)
    assert mx.calls == 2


def test_gdpa_mxfp8_close_to_exact():
    from kernels.mxfp8.gdpa import gdpa_mxfp8

    torch.manual_seed(0)
    offsets = torch.tensor([0, 5, 5, 40, 72])
    q, k, v = (torch.randn(72, 2, 32) for _ in range(3))
    out = gdpa_mxfp8(q, k, v, offsets, causal=True, activation="silu", max_len=32)
    ref = torch.zeros_like(q)
    for b in range(4):
        s, e = int(offsets[b]), int(offsets[b + 1])
        for h in range(2):
            S = q[s:e, h] @ k[s:e, h].t()
            P = torch.nn.functional.silu(S) / 32 * torch.ones(e - s, e - s).tril()
            ref[s:e, h] = P @ v[s:e, h]
    assert float((out - ref).norm() / ref.norm()) < 0.08
    assert not torch.equal(out, ref)  # it did quantize


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("activation,causal", [("silu", True), ("gelu", False)])
def test_gdpa_mxfp8_triton_equals_the_padded_emulation(activation, causal, device):
    """The flash-kernel MXFP8 GDPA (P quantized per 32 keys inside the kernels, V per 32 keys of
    each sample before them) gives the padded emulation's output and gradients: samples of 0, 1
    and more than 32 rows (blocks that do not start at a multiple of 32 rows of the batch), and
    padding rows after the last sample, which come back zero with zero gradient."""
    from kernels.mxfp8.gdpa import fake_quantize_keys, gdpa_mxfp8

    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the Triton interpreter is off where CUDA is present")
    g = torch.Generator().manual_seed(3)
    lens, pad, H, D, max_len = [40, 0, 70, 1, 33], 7, 2, 32, 72
    offsets = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()]).to(device)
    T = sum(lens) + pad
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = ((torch.randn(T, H, D, generator=g) * 2).to(device, dtype).requires_grad_() for _ in range(3))
    do = torch.randn(T, H, D, generator=g).to(device, dtype)
    do[sum(lens):] = 0
    outs = {}
    for triton in (False, True):
        ins = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        if triton:
            o = gdpa_mxfp8(*ins, offsets, causal=causal, activation=activation, max_len=max_len, triton=True)
        else:  # the padded emulation reads only the samples' rows
            n = sum(lens)
            o = gdpa_mxfp8(*(t[:n] for t in ins), offsets, causal=causal, activation=activation, max_len=max_len)
            o = torch.cat([o, o.new_zeros(pad, H, D)])
        outs[triton] = [o.detach().float(), *torch.autograd.grad(o, ins, do)]
    tol = 1e-3 if dtype == torch.float32 else 2e-2
    for name, a, b in zip(("o", "dq", "dk", "dv"), outs[False], outs[True]):
        err = float((b.float() - a.float()).norm() / a.float().norm())
        assert err < tol, (name, err)
    assert torch.equal(outs[True][0][sum(lens):], torch.zeros(pad, H, D, device=device))
    # V's blocks start at each sample's first key: sample 2 (rows 40..109) has its own scales
    vq = fake_quantize_keys(v.detach(), offsets)
    s2 = v.detach()[40:110]
    ref = fake_quantize_keys(s2, torch.tensor([0, 70], device=device))
    assert torch.equal(vq[40:110], ref)


def test_cost():
    c = cost.gemm(8192, 8192, 8192)
    assert c.flops == 2 * 8192**3
    assert c.bytes == 2 * 8192 * 8192 * (1 + 1 / 32) + 8192 * 8192 * 2
    q = cost.quantize(10, 40)
    assert q.bytes == 10 * 40 * 2 + 10 * 64 + 10 * 2
    lt = cost.linear_training(100, 64, 48)
    assert sum(v.flops for v in lt.values()) == 3 * 2 * 100 * 64 * 48


# --- fused fake quantizers (kernels/mxfp8/fake_quantize.py) against gdpa's PyTorch references ---


def _same_nan(a, b):
    """Equal values and dtype, NaN exactly where the other has NaN (``torch.equal`` is false on NaN)."""
    na, nb = a.isnan(), b.isnan()
    return a.dtype == b.dtype and torch.equal(na, nb) and torch.equal(a.masked_fill(na, 0), b.masked_fill(nb, 0))


def _rows_weird(T, C, seed, dtype):
    """``[T, C]``, finite: each row and column at its own magnitude (2^-40..2^40 per row,
    1e-25..1e25 across columns: any misplaced block boundary changes a block's scale), a zero
    row, a tiny row (fp32/bf16 subnormals) and a huge one (up to 3.3e38)."""
    g = torch.Generator().manual_seed(seed)
    row = 2.0 ** torch.randint(-40, 41, (T, 1), generator=g).float()
    x = torch.randn(T, C, generator=g) * row * torch.logspace(-25, 25, C)[None, :]
    if T > 4:
        x[1], x[3] = 0.0, torch.randn(C, generator=g) * 1e-39
    if T > 6:
        x[5] = (torch.rand(C, generator=g) * 2 - 1) * 3.3e38
    return x.to(DEV, dtype)


@pytest.mark.parametrize("shape", [(3, 128), (2, 5, 32), (7, 45), (4, 1), (9, 31), (2, 3, 70), (0, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_fake_quantize_last_triton_equals_the_reference(shape, dtype, elem):
    """One fused kernel (read x, write dequantize(quantize(x))) gives ``fake_quantize_last_ref``
    bit for bit, in x's dtype and in fp32: partial last blocks (45, 31, 70, 1 columns), zeros,
    subnormals, values near fp32's max; every launch variant."""
    from kernels.mxfp8.fake_quantize import LAST_VARIANTS, fake_quantize_last_triton
    from kernels.mxfp8.gdpa import fake_quantize_last_ref

    x = _rows_weird(shape[0] * (shape[1] if len(shape) == 3 else 1), shape[-1], 7, dtype).reshape(shape)
    ref = fake_quantize_last_ref(x, elem)
    assert torch.equal(fake_quantize_last_triton(x, elem, out_dtype=torch.float32), ref)
    for variant in LAST_VARIANTS:
        got = fake_quantize_last_triton(x, elem, variant=variant)
        assert got.shape == x.shape and torch.equal(got, ref.to(dtype)), variant


def _keys_case(lens, lead, pad, C, seed, dtype):
    offsets = torch.tensor([lead, *(lead + torch.tensor(lens, dtype=torch.int64).cumsum(0)).tolist()])
    T = int(offsets[-1]) + pad
    offsets = offsets.to(DEV)
    return _rows_weird(T, C, seed, dtype).reshape(T, 1, C), offsets


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_fake_quantize_keys_triton_equals_the_reference(dtype, elem):
    """Blocks of 32 rows from each sample's first row: samples of 0, 1, 31, 32, 33, 70 rows (short
    last blocks, blocks straddling the global 32-row grid, several block starts in one 32-row
    window), empty samples first and last, 5 rows before offsets[0] and 9 after offsets[-1]
    (copied); every launch variant, C = 3·40 (partial column tiles)."""
    from kernels.mxfp8.fake_quantize import KEYS_VARIANTS, fake_quantize_keys_triton
    from kernels.mxfp8.gdpa import fake_quantize_keys_ref

    x, offsets = _keys_case([0, 1, 31, 32, 33, 70, 1, 0], 5, 9, 120, 11, dtype)
    x = x.reshape(x.shape[0], 3, 40)
    ref = fake_quantize_keys_ref(x, offsets, elem)
    assert ref.dtype == dtype and not torch.equal(ref[5:], x[5:])  # it quantized
    for variant in KEYS_VARIANTS:
        got = fake_quantize_keys_triton(x, offsets, elem, variant=variant)
        assert got.dtype == dtype and torch.equal(got, ref), variant
    assert torch.equal(got[:5], x[:5]) and torch.equal(got[-9:], x[-9:])


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(lens=st.lists(st.integers(0, 80), min_size=0, max_size=6), lead=st.integers(0, 40), pad=st.integers(0, 40),
       C=st.integers(1, 70), seed=st.integers(0, 2**16), dtype=st.sampled_from([torch.bfloat16, torch.float32]))
@example(lens=[], lead=0, pad=7, C=5, seed=0, dtype=torch.float32)  # B = 0: every row is padding
@example(lens=[64, 1, 1, 1, 95], lead=0, pad=0, C=1, seed=1, dtype=torch.bfloat16)  # aligned, then shifted
def test_fake_quantize_keys_triton_jagged(lens, lead, pad, C, seed, dtype):
    from kernels.mxfp8.fake_quantize import fake_quantize_keys_triton
    from kernels.mxfp8.gdpa import fake_quantize_keys_ref

    x, offsets = _keys_case(lens, lead, pad, C, seed, dtype)
    if x.shape[0] == 0:
        return
    assert torch.equal(fake_quantize_keys_triton(x, offsets), fake_quantize_keys_ref(x, offsets))


def test_fake_quantize_triton_nan_inf_blocks():
    """A block holding NaN or Inf comes back all NaN (the reference's E8M0 NaN scale), in both
    orientations; its neighbours are untouched by it."""
    from kernels.mxfp8.fake_quantize import fake_quantize_keys_triton, fake_quantize_last_triton
    from kernels.mxfp8.gdpa import fake_quantize_keys_ref, fake_quantize_last_ref

    x, offsets = _keys_case([40, 33], 0, 3, 64, 5, torch.bfloat16)
    x[2, 0, 7], x[50, 0, 40] = float("nan"), float("-inf")
    last = fake_quantize_last_triton(x)
    assert _same_nan(last, fake_quantize_last_ref(x).to(x.dtype))
    assert last[2, 0, :32].isnan().all() and not last[2, 0, 32:].isnan().any()
    keys = fake_quantize_keys_triton(x, offsets)
    assert _same_nan(keys, fake_quantize_keys_ref(x, offsets))
    assert keys[:32, 0, 7].isnan().all() and not keys[32:, 0, 7].isnan().any()
    assert keys[40:72, 0, 40].isnan().all() and int(keys.isnan().sum()) == 64


def test_fake_quantize_straight_through_gradient():
    """gdpa's CUDA path wraps the fused kernels in an identity backward: the value is the
    kernel's, the gradient is the incoming gradient, in the input's dtype."""
    from kernels.mxfp8.fake_quantize import fake_quantize_keys_triton, fake_quantize_last_triton
    from kernels.mxfp8.gdpa import _straight_through

    x, offsets = _keys_case([40, 9], 2, 3, 64, 9, torch.bfloat16)
    x.requires_grad_()
    for fn in (fake_quantize_last_triton, lambda t: fake_quantize_keys_triton(t, offsets)):
        y = _straight_through(x, fn)
        assert torch.equal(y.detach(), fn(x.detach())) and y.dtype == x.dtype
        g = torch.randn(x.shape).to(DEV, x.dtype)
        (gx,) = torch.autograd.grad(y, x, g)
        assert torch.equal(gx, g)
