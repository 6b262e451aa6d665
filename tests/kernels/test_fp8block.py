"""Blockwise fp8 (kernels/fp8block): the Triton quantizer bit-exact against the reference in every
launch config, epilogue and orientation (interpreter on CPU), the weight tiles, the scale rule,
the GEMM emulation, Fp8BlockLinear and the fused FFN against fp32, the ``auto`` decision from the
measured table, and the twin's pricing of both precisions (the tiny parity run is in
tests/executor/test_bench_scripts.py)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton.jit in kernels.fp8block is created

from torch import nn  # noqa: E402

from kernels.fp8block import eligible  # noqa: E402
from kernels.fp8block.reference import (  # noqa: E402
    dequantize_ref, dual_ref, mm_ref, quantize_ref, quantize_weight_ref,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _x(R, C, seed, *, bad=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, C, generator=g) * torch.logspace(-20, 20, C)[None, :]
    x[:2, :128] = 0  # zero blocks
    if bad:
        x[3, 7] = float("nan")
        x[R - 1, C - 1] = float("-inf")
    return x.to(DEV)


def _same(a, b):
    if a.dtype.itemsize == 1:
        return torch.equal(a.view(torch.uint8).cpu(), b.view(torch.uint8).cpu())
    return torch.equal(a.nan_to_num(-1).cpu(), b.nan_to_num(-1).cpu())


def _close(q, s, qr, sr, elem):
    """Same scales, and the elements within 1e-3 of their block's range (``max_elem · scale``)."""
    top = {"e4m3": 448.0, "e5m2": 57344.0}[elem]
    a, b = dequantize_ref(q.cpu(), s.cpu()), dequantize_ref(qr.cpu(), sr.cpu())
    rng = (top * sr.cpu()).repeat_interleave(128, 1)
    fin = torch.isfinite(b)
    return _same(s, sr) and bool(((a - b).abs()[fin] <= 1e-3 * rng[fin]).all())


@pytest.mark.parametrize("config", ["four_w4", "four_w8_pack", "tile_w4", "split_32"])
@pytest.mark.parametrize("epilogue", ["none", "bias_gelu", "bias_gelu_grad", "layer_norm"])
@pytest.mark.parametrize("row,col", [(True, True), (True, False), (False, True)])
def test_dual_bit_exact(config, epilogue, row, col, rows=200):
    """Rows not a multiple of 128 (zero-padded), zero, NaN and Inf blocks, E4M3 and E5M2. Bit-exact
    without an epilogue; with one, the fp32 GELU of the kernel and of torch may round apart in its
    tails (``1 + erf`` cancels below -4), and the GPU contracts the norm's multiply-add, which moves a
    tiny element of a block to another fp8 value: the scales stay equal and every element within 1e-3
    of its block's range. ``layer_norm``: the rows' statistics given to both (``ln_stats_ref``)."""
    from kernels.fp8block.quantize import dual
    from kernels.fp8block.reference import ln_stats_ref

    x, h = _x(rows, 256, 1), _x(rows, 256, 2, bad=False)
    b = torch.randn(256, generator=torch.Generator().manual_seed(3)).to(DEV)
    kw = dict(row=row, col=col, epilogue=epilogue, dbias=True,
              bias=None if epilogue == "none" else b, h=h if epilogue == "bias_gelu_grad" else None)
    if epilogue == "layer_norm":
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(4)).to(DEV) * 3 + 1
        x[3, 7] = float("nan")  # one row's statistics NaN: its blocks NaN in both orientations
        gain = 1 + torch.randn(256, generator=torch.Generator().manual_seed(5)).to(DEV)
        kw.update(gain=gain, stats=ln_stats_ref(x, 1e-5))
    for elem in ("e4m3", "e5m2"):
        d, r = dual(x, elem, config=config, **kw), dual_ref(x, elem, **kw)
        for name in ("q", "scale", "qt", "scale_t"):
            got, want = getattr(d, name), getattr(r, name)
            assert (got is None) == (want is None), name
            if want is not None:
                assert got.shape == want.shape, name
                assert _same(got, want) or (epilogue != "none" and name in ("q", "qt") and _close(
                    got, getattr(d, "scale" if name == "q" else "scale_t"), want,
                    getattr(r, "scale" if name == "q" else "scale_t"), elem)), (name, elem)
        fin = torch.isfinite(r.dbias)
        torch.testing.assert_close(d.dbias[fin].cpu(), r.dbias[fin].cpu(), rtol=1e-4, atol=1e-3)  # fp32 sums in another order


@pytest.mark.parametrize("config", ["four_w4", "four_w8_pack"])
@pytest.mark.parametrize("epilogue", ["none", "bias_gelu", "bias_gelu_grad", "layer_norm"])
def test_dual_bit_exact_whole_tiles(config, epilogue):
    """Rows a multiple of 128: the 4-slice kernel's unmasked path (``EVEN``), the same rules."""
    test_dual_bit_exact(config, epilogue, True, True, rows=256)


def test_ln_stats_match_torch_layer_norm():
    """The Triton statistics (interpreter on CPU) against the two-pass reference and torch's own
    LayerNorm: rows of any count, a large mean (where a one-pass variance would cancel), bf16 and fp32."""
    from kernels.fp8block.quantize import ln_stats
    from kernels.fp8block.reference import ln_stats_ref

    g = torch.Generator().manual_seed(7)
    for R, C, dt in ((5, 128, torch.float32), (37, 384, torch.bfloat16), (130, 1024, torch.float32)):
        x = (torch.randn(R, C, generator=g) * torch.rand(R, 1, generator=g) * 4 + 100).to(dt).to(DEV)
        mu, rs = ln_stats(x, 1e-5)
        mr, rr = ln_stats_ref(x, 1e-5)
        _, mt, rt = torch.ops.aten.native_layer_norm(x.float(), [C], None, None, 1e-5)
        assert mu.dtype == rs.dtype == torch.float32 and mu.shape == rs.shape == (R,)
        torch.testing.assert_close(mu, mr, rtol=1e-6, atol=0)
        torch.testing.assert_close(rs, rr, rtol=1e-5, atol=0)
        torch.testing.assert_close(rs, rt.view(R), rtol=1e-4, atol=0)
        torch.testing.assert_close(mu, mt.view(R), rtol=1e-6, atol=0)


def test_layer_norm_epilogue_needs_its_operands():
    from kernels.fp8block.quantize import dual

    x = torch.randn(4, 128)
    with pytest.raises(ValueError, match="layer_norm needs gain of shape"):
        dual(x, epilogue="layer_norm", bias=torch.zeros(128), gain=torch.ones(128))
    with pytest.raises(ValueError, match="fp32 of shape"):
        dual(x, epilogue="layer_norm", bias=torch.zeros(128), gain=torch.ones(128),
             stats=(torch.zeros(4, dtype=torch.bfloat16), torch.ones(4)))


def test_dual_layout_is_what_cublas_reads():
    """Scales outer-dim-major (stride (1, rows)); the transpose K-major; rows padded to 128."""
    from kernels.fp8block.quantize import dual

    d = dual(_x(130, 384, 4, bad=False))
    assert d.q.shape == (256, 384) and d.scale.shape == (256, 3) and d.scale.stride() == (1, 256)
    assert d.qt.shape == (384, 256) and d.scale_t.shape == (384, 2) and d.scale_t.stride() == (1, 384)
    assert not d.q[130:].float().any() and not d.qt[:, 130:].float().any()


def test_weight_tiles_bit_exact_both_orientations():
    from kernels.fp8block.quantize import weight

    w = _x(256, 384, 5)
    q, qt, s = weight(w)
    qr, sr = quantize_weight_ref(w)
    assert _same(q, qr) and _same(qt, qr.t().contiguous()) and _same(s, sr)
    assert s.shape == (2, 3) and torch.isnan(s[0, 0]) and torch.isnan(s[1, 2])  # the NaN and the -Inf tiles


def test_scale_rule_power_of_two_no_saturation_and_roundtrip():
    x = torch.randn(512, 1024, generator=torch.Generator().manual_seed(6)) * 30
    for elem, top, bound in (("e4m3", 448.0, 0.03), ("e5m2", 57344.0, 0.06)):
        q, s = quantize_ref(x, elem)
        assert torch.equal(s, torch.exp2(torch.log2(s).round()))  # powers of two
        blocks = x.reshape(512, 8, 128).abs().amax(-1)
        assert (blocks <= top * s).all() and (blocks > top * s / 2).all()  # the smallest such 2^e
        err = (dequantize_ref(q, s) - x).norm() / x.norm()
        assert err < bound, (elem, float(err))


def test_non_multiple_of_128_is_a_one_line_error():
    with pytest.raises(ValueError, match="not a multiple of 128"):
        quantize_ref(torch.ones(4, 100))
    from kernels.fp8block.linear import Fp8BlockLinear

    with pytest.raises(ValueError, match="multiples of 128"):
        Fp8BlockLinear(128, 100)
    assert eligible(256, 384) and not eligible(256, 100)


def test_gemm_emulation_equals_dequantized_fp32():
    from kernels.fp8block.gemm import block_mm

    a, w = torch.randn(200, 256), torch.randn(384, 256)
    aq, as_ = quantize_ref(a)
    for bq, bs in (quantize_weight_ref(w), quantize_ref(w)):
        y = block_mm(aq, as_, bq, bs, torch.float32)
        torch.testing.assert_close(y, dequantize_ref(aq, as_) @ dequantize_ref(bq, bs).t())
        assert ((y[:200] - a @ w.t()).norm() / (a @ w.t()).norm()) < 0.06
    assert mm_ref(aq, as_, *quantize_weight_ref(w)).shape == (256, 384)


def _ffn(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(128, 256), nn.Linear(256, 128), torch.randn(300, 128)


def test_linear_and_fused_ffn_close_to_fp32():
    """Gradients within fp8's reach of fp32 (E4M3: ~4% per matmul); the fused FFN computes what two
    Fp8BlockLinear with a GELU between compute, but for its bf16 pre-activation."""
    from kernels.fp8block.linear import Fp8BlockLinear, ffn_ready, fp8_block_ffn

    l1, l2, x0 = _ffn()
    grads = {}
    for name in ("fp32", "layers", "fused"):
        x = x0.clone().requires_grad_()
        for p in (*l1.parameters(), *l2.parameters()):
            p.grad = None
        if name == "fp32":
            y = l2(torch.nn.functional.gelu(l1(x)))
        else:
            f1, f2 = Fp8BlockLinear.from_linear(l1, guard_calls=0), Fp8BlockLinear.from_linear(l2, guard_calls=0)
            assert ffn_ready(f1, f2)
            y = fp8_block_ffn(x, f1, f2) if name == "fused" else f2(torch.nn.functional.gelu(f1(x)))
        y.backward(torch.ones_like(y))
        grads[name] = [y.detach(), x.grad, l1.weight.grad, l1.bias.grad, l2.weight.grad, l2.bias.grad]
    for got, want in zip(grads["layers"], grads["fp32"]):
        assert (got - want).norm() / want.norm() < 0.08
    for got, want in zip(grads["fused"], grads["layers"]):  # the fused one keeps ffn1's output in bf16
        assert (got - want).norm() / want.norm() < 0.03


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_layer_norm_ffn_equals_norm_then_ffn(dtype):
    """``fp8_block_ffn(x, norm=ln)`` (the statistics, then the normalized rows straight to fp8) against
    ``fp8_block_ffn(ln(x))`` (torch's LayerNorm written out, then quantized). fp32 in: the same
    quantized operands up to the last bits of the statistics, so outputs and every gradient (the
    norm's too) agree far inside fp8's error. bf16 in: the unfused norm rounds its output to bf16
    before fp8 (double rounding) and the fused one does not, so the two differ by fp8's own error;
    the fused one is then held to fp32 at least as closely. The gradients come back in their
    parameters' dtypes."""
    from kernels.fp8block.linear import Fp8BlockLinear, fp8_block_ffn

    l1, l2, x0 = _ffn(1)
    ln = nn.LayerNorm(128)
    with torch.no_grad():
        ln.weight.add_(0.3 * torch.randn(128))
        ln.bias.add_(0.3 * torch.randn(128))
    x0 = (x0 * 2 + 0.5).to(dtype)
    f1, f2 = Fp8BlockLinear.from_linear(l1, guard_calls=0), Fp8BlockLinear.from_linear(l2, guard_calls=0)
    params = [ln.weight, ln.bias, *l1.parameters(), *l2.parameters()]
    grads = {}
    for name in ("fp32", "unfused", "fused"):
        x = x0.clone().requires_grad_()
        for p in params:
            p.grad = None
        if name == "fp32":
            y = l2(torch.nn.functional.gelu(l1(ln(x.float()))))
        else:
            y = fp8_block_ffn(x, f1, f2, norm=ln) if name == "fused" else fp8_block_ffn(ln(x), f1, f2)
        y.float().backward(torch.ones_like(y, dtype=torch.float32))
        grads[name] = [y.detach().float(), x.grad.float()] + [p.grad.clone() for p in params]
        if name == "fused":
            assert y.dtype == x.grad.dtype == dtype and all(p.grad.dtype == p.dtype for p in params)
    err = {k: [float((g - w).norm() / w.norm()) for g, w in zip(grads[k], grads["fp32"])] for k in ("fused", "unfused")}
    if dtype == torch.float32:
        for got, want in zip(grads["fused"], grads["unfused"]):
            assert (got - want).norm() / want.norm() < 0.01
    for fused, unfused in zip(err["fused"], err["unfused"]):
        assert fused < 0.1 and fused <= 1.1 * unfused + 1e-6, err


@pytest.mark.parametrize("bias", [True, False])
def test_fused_layer_norm_linear_equals_norm_then_linear(bias):
    """``normed(ln, lin, x)`` with ``lin`` a ready ``Fp8BlockLinear`` (the norm in its input's
    quantizer) computes what ``lin(ln(x))`` does, gradients of x, the weight, the bias and the norm
    included; before the guard is done, and for a plain ``nn.Linear``, ``normed`` is ``lin(ln(x))``
    itself. The input not needing a gradient still gives the norm's."""
    from kernels.fp8block.linear import Fp8BlockLinear, linear_ready, normed

    torch.manual_seed(2)
    lin, ln = nn.Linear(128, 384, bias=bias), nn.LayerNorm(128)
    with torch.no_grad():
        ln.weight.add_(0.3 * torch.randn(128))
        ln.bias.add_(0.3 * torch.randn(128))
    x0 = torch.randn(2, 150, 128) * 2 + 0.5
    f8 = Fp8BlockLinear.from_linear(lin, guard_calls=1)
    params = [p for p in (ln.weight, ln.bias, lin.weight, lin.bias) if p is not None]
    out = {}
    for name in ("guard", "fused", "unfused", "bf16", "no_dx"):
        x = x0.clone().requires_grad_(name != "no_dx")
        for p in params:
            p.grad = None
        if name == "guard":
            assert not linear_ready(f8)
        y = f8(ln(x)) if name == "unfused" else normed(ln, lin if name == "bf16" else f8, x)
        y.backward(torch.ones_like(y))
        out[name] = [y.detach()] + ([] if x.grad is None else [x.grad]) + [p.grad.clone() for p in params]
        if name == "guard":
            assert linear_ready(f8)
    assert y.shape == (2, 150, 384)
    for got, want in zip(out["fused"], out["unfused"]):  # fp32 in: the same quantized operands
        assert (got - want).norm() / want.norm() < 0.01
    for got, want in zip(out["fused"], out["bf16"]):
        assert (got - want).norm() / want.norm() < 0.1
    torch.testing.assert_close(out["no_dx"][0], out["fused"][0])
    for got, want in zip(out["no_dx"][1:], out["fused"][2:]):
        torch.testing.assert_close(got, want)


def test_guard_falls_back_on_a_nan_input():
    from kernels.fp8block.linear import Fp8BlockLinear

    lin = Fp8BlockLinear.from_linear(nn.Linear(128, 128), name="bad")
    x = torch.randn(8, 128)
    x[0, 0] = float("nan")
    lin(x)
    assert lin.fallback and torch.isfinite(lin(torch.randn(8, 128))).all()


def test_auto_decides_from_the_measured_table():
    """``auto``: a layer stays fp8 where the table says it pays, falls back to bf16 where not; both
    decisions are logged."""
    from kernels.fp8block.linear import Fp8BlockLinear
    from kernels.fp8block.table import pays, ratio
    from kernels.mxfp8.linear import MXFP8Linear, guard_pending

    assert pays(196608, 4096, 4096) and not pays(196608, 512, 2048) and not pays(1e6, 4096, 100)
    assert ratio(65536, 2048, 4096) == pytest.approx(ratio(65536.0, 2048.0, 4096.0))
    assert ratio(1e7, 1e5, 1e5) == ratio(196608, 4096, 4096)  # held at the grid's upper edges
    assert ratio(1024, 512, 512) == pytest.approx(ratio(4096, 512, 512) / 4)  # scaled down below it
    MXFP8Linear.decisions.clear()
    big, small = (Fp8BlockLinear.from_linear(nn.Linear(k, n), name=nm, auto=True)
                  for k, n, nm in ((4096, 4096, "big"), (128, 128, "small")))
    assert guard_pending(big)
    big._decide(196608)
    small._decide(4096)
    assert not big.fallback and small.fallback
    assert any("big" in d and ": fp8" in d for d in MXFP8Linear.decisions)
    assert any("small" in d and ": bf16" in d for d in MXFP8Linear.decisions)


def test_layers_settled_in_bf16_go_back_to_plain_linear():
    """``auto`` with no gain (or a guard fallback) leaves a layer computing bf16 behind an eager
    forward that splits compiled graphs (gem-h200-1gpu ran 22% slower so, every layer bf16): after
    the guarded step ``settle`` puts the ``nn.Linear`` back, the same parameters, the same output,
    and the RunRecord still says why it is bf16."""
    from executor.runtime import eager_while_guarded
    from executor.train import low_precision_layers
    from kernels.fp8block.linear import Fp8BlockLinear, convert

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 128)).train()
    x = torch.randn(8, 128)
    want = model(x)
    params = [id(p) for p in model.parameters()]
    assert convert(model, auto=True) == ["0", "2"]
    with eager_while_guarded(model, compiled=False):
        got = model(x)  # 8 rows: below the table, both decide bf16
    assert all(type(m) is nn.Linear for m in (model[0], model[2]))
    assert not any(isinstance(m, Fp8BlockLinear) for m in model.modules())
    assert [id(p) for p in model.parameters()] == params
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.01)  # the decision step ran the bf16 fallback
    torch.testing.assert_close(model(x), want)
    assert low_precision_layers(model) == {"0": "bf16 (auto)", "2": "bf16 (auto)"}


def test_twin_prices_fp8_block_and_auto_from_the_table():
    """The twin converts the layers the executor converts (eligible nn.Linear, not the heads,
    routers, experts or token-mixing matmuls), prices them as bf16 over the measured ratio, picks
    none on gem-h200-1gpu under auto (no shape there pays) and refuses fp8_block off Hopper."""
    import scenarios
    from twin.flops import model_costs
    from twin.simulate import simulate

    s = scenarios.load("gem-h200-1gpu", ["precision.mlp=fp8_block"])
    fp8 = {c.name for c in model_costs(s.model, batch=s.training.micro_batch, precision=s.precision)
           if c.dtype == "fp8_block"}
    assert "seq0.mlp_up" in fp8 and "seq0.qkv" in fp8
    assert not any(n.endswith(("router", "experts_up", "head.tasks", ".lcb", "compress.in")) for n in fp8)
    base = simulate(scenarios.load("gem-h200-1gpu")).step_time_s
    assert simulate(scenarios.load("gem-h200-1gpu", ["precision.mlp=auto"])).step_time_s == pytest.approx(base)
    assert simulate(s).step_time_s > base  # at d_model 512 fp8 loses (table ratios 0.6-0.8)
    with pytest.raises(ValueError, match="needs a Hopper GPU"):
        simulate(scenarios.load("gem-h200-1gpu", ["precision.mlp=fp8_block", "hardware.gpu=b200"]))


def test_twin_prices_a_norm_fused_into_its_fp8_linears():
    """Where the Linears a pre-norm feeds are all blockwise fp8, the executor takes the norm into the
    quantizer: the twin's norm then reads its input once and keeps only its statistics; where any
    of them stays bf16 (gem-h200-1gpu under auto), the norm is priced as before."""
    import scenarios
    from twin.flops import model_costs

    def norms(*sets):
        s = scenarios.load("gem-h200-1gpu", list(sets))
        return {c.name: c for c in model_costs(s.model, batch=s.training.micro_batch, precision=s.precision)
                if c.op_class.name == "NORM"}

    bf16, fp8, auto = norms(), norms("precision.mlp=fp8_block"), norms("precision.mlp=auto")
    T = bf16["seq0.norm1"].act_bytes / (2 * 512 + 8)  # rows: bf16 output + 8 bytes of statistics a row
    for name in ("seq0.norm1", "seq0.norm2", "cross0.s.norm_q", "cross0.x.norm_kv"):
        assert fp8[name].cost.fwd_bytes == bf16[name].cost.fwd_bytes / 2
        assert fp8[name].cost.bwd_bytes == bf16[name].cost.bwd_bytes
    assert fp8["seq0.norm1"].act_bytes == pytest.approx(8 * T)
    assert fp8["ns0.fm_norm"] == bf16["ns0.fm_norm"]  # the executor runs ln_fm, then its MLP: not fused
    assert auto == bf16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cublas_block_gemm_matches_its_emulation():
    from kernels.fp8block.gemm import block_mm, native

    a, w = torch.randn(512, 1024, device="cuda"), torch.randn(768, 1024, device="cuda")
    aq, as_ = quantize_ref(a)
    for bq, bs in (quantize_weight_ref(w), quantize_ref(w)):
        y, ref = block_mm(aq, as_, bq, bs, torch.float32), mm_ref(aq, as_, bq, bs)
        assert native(aq) and float((y - ref).abs().max() / ref.abs().max()) < 1e-3


def test_sass_inspector_compiles_the_quantizer_for_hopper():
    """``python -m kernels.fp8block.sass`` (the quantizer's issue cost where no GPU is lent) compiles
    ``_dual4_kernel`` for sm_90a with Triton's own ptxas (in a process of its own: this module's
    kernels are interpreted): a real count, and the packed row stores issue fewer instructions
    than the byte stores."""
    import re
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "kernels.fp8block.sass", "--configs", "four_w8,four_w8_pack"],
                         capture_output=True, text=True, env=env, timeout=300).stdout
    got = {(c, e): (int(r), int(sp), float(n)) for c, e, r, sp, n in
           re.findall(r"^(\S+)\s+(\S+)\s+regs\s+(\d+) spill\s+(\d+) B\s+([\d.]+) instr/element", out, re.M)}
    assert len(got) == 8, out
    regs, spill, packed = got[("four_w8_pack", "bias_gelu")]
    assert 0 < regs <= 255 and spill == 0
    assert 10 < packed < got[("four_w8", "bias_gelu")][2] < 60
