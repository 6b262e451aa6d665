"""One device call: check blockwise fp8 on the GPU, then time it side by side with bf16; writes
``$OUT/fp8_block_bench.json`` (committed as ``hwmodels/data/measured/fp8_block_h200_<date>.json``).

    python -m kernels.fp8block.bench --out $OUT [--quick]

1. Checks: the Triton quantizer against ``reference.dual_ref`` (bit-exact without epilogue; the
   GELU epilogues to one fp8 quantum, since the GPU uses the fast erf); ``block_mm`` against the
   dequantize-then-matmul reference.
2. The GEMM alone at 8192³: bf16 ``torch.mm`` against ``block_mm`` with 1×128 × 128×128 (the
   forward's scales) and 1×128 × 1×128 (wgrad's), the quantization not included.
3. The quantizer: bytes per second of ``dual`` (both orientations) against a bf16 copy, and each
   launch config of ``quantize.CONFIGS`` per epilogue at the MLP block's shapes
   (``bench_quantize``), which set ``quantize.DEFAULT``.
4. The MLP block of ``gem-h100-4k`` (d 1024 → 4096 → 1024, one micro-batch's tokens), forward +
   backward with quantization included: bf16 (matmul, fused bias + GELU, matmul: the executor's
   CUDA path) against ``fp8_block_ffn`` (fused quantization) and against two ``Fp8BlockLinear``
   with ``F.gelu`` between (unfused); then the same block with its pre-norm on the fp32 residual stream
   (``block_ln``): torch's LayerNorm + bf16 against the norm fused into the first quantizer.
5. The threshold table: a Linear's forward + backward, bf16 against ``Fp8BlockLinear``, over a grid
   of (M, K, N); ``precision.mlp: auto`` and the twin read it (``kernels.fp8block.table``).
All times: ``triton.testing.do_bench`` medians, of CUDA-graph replays where a step would be replayed
(the block and the table: ``kernels.common.timing.replay_ms``), inputs bf16, weights bf16 (FSDP2's
compute copy).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from triton.testing import do_bench

from kernels.common.timing import replay_ms
from kernels.fp8block.gemm import block_mm
from kernels.fp8block.linear import Fp8BlockLinear, bf16_ffn, fp8_block_ffn
from kernels.fp8block.quantize import dual, ln_stats, weight
from kernels.fp8block.reference import dequantize_ref, dual_ref, mm_ref, quantize_ref, quantize_weight_ref

T0 = time.time()
MS = [4096, 16384, 65536, 196608]
WIDTHS = [512, 1024, 2048, 4096]


def say(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def ms(fn, rep=100) -> float:
    return do_bench(fn, warmup=20, rep=rep, return_mode="median")


def _rel(d, r) -> float:
    """Relative norm error of ``d``'s row-wise fp8 values against the reference ``r``'s."""
    want = dequantize_ref(r.q, r.scale)
    return float((dequantize_ref(d.q, d.scale) - want).norm() / want.norm())


def checks(res, g):
    out = []
    for (R, C) in [(200, 256), (4096, 1024), (1000, 384)]:
        x = (torch.randn(R, C, device="cuda", generator=g) * torch.logspace(-20, 20, C, device="cuda")[None]).bfloat16()
        x[:3, :128] = 0
        if R == 1000:
            x[5, 7] = float("nan")
        for elem in ("e4m3", "e5m2"):
            d, r = dual(x, elem), dual_ref(x, elem)
            ok = all(torch.equal(getattr(d, n).view(torch.uint8), getattr(r, n).view(torch.uint8)) for n in ("q", "qt")) \
                and all(torch.equal(getattr(d, n).nan_to_num(-1), getattr(r, n).nan_to_num(-1)) for n in ("scale", "scale_t"))
            out.append({"shape": [R, C], "elem": elem, "epilogue": "none", "bit_exact": bool(ok)})
    R, C = 4096, 2048
    x, h = (torch.randn(R, C, device="cuda", generator=g).bfloat16() for _ in range(2))
    b = torch.randn(C, device="cuda", generator=g)
    for ep in ("bias_gelu", "bias_gelu_grad"):
        kw = dict(epilogue=ep, bias=b, h=h if ep == "bias_gelu_grad" else None, dbias=True)
        d, r = dual(x, "e4m3", **kw), dual_ref(x, "e4m3", **kw)
        err = _rel(d, r)
        dberr = float((d.dbias - r.dbias).norm() / r.dbias.norm())
        out.append({"shape": [R, C], "elem": "e4m3", "epilogue": ep, "rel_err_vs_ref": err, "dbias_rel_err": dberr})
    s = torch.randn(R, 1024, device="cuda", generator=g) * 2 + 0.5  # the layer_norm epilogue (fp32 residual in)
    gam = 1 + 0.1 * torch.randn(1024, device="cuda", generator=g)
    beta = 0.1 * torch.randn(1024, device="cuda", generator=g)
    st = ln_stats(s, 1e-5)
    _, mt, rt = torch.ops.aten.native_layer_norm(s, [1024], None, None, 1e-5)
    d, r = (f(s, "e4m3", epilogue="layer_norm", bias=beta, gain=gam, stats=st) for f in (dual, dual_ref))
    out.append({"shape": [R, 1024], "elem": "e4m3", "epilogue": "layer_norm",
                "scales_equal": bool(torch.equal(d.scale, r.scale) and torch.equal(d.scale_t, r.scale_t)),
                "rel_err_vs_ref": _rel(d, r),
                "stats_max_rel_err_vs_torch": [float(((st[0] - mt.view(-1)).abs() / mt.view(-1).abs()).max()),
                                               float(((st[1] - rt.view(-1)).abs() / rt.view(-1)).max())]})
    wt = torch.randn(1024, 2048, device="cuda", generator=g).bfloat16()
    q, qt, sc = weight(wt)
    qr, sr = quantize_weight_ref(wt)
    out.append({"shape": [1024, 2048], "elem": "e4m3", "weight_tiles_bit_exact": bool(
        torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and torch.equal(sc, sr)
        and torch.equal(qt.view(torch.uint8), qr.t().contiguous().view(torch.uint8)))})
    res["quantize_checks"] = out
    say("quantize checks:", json.dumps(out))
    M, K, N = 4096, 2048, 1024
    a = torch.randn(M, K, device="cuda", generator=g)
    w = torch.randn(N, K, device="cuda", generator=g)
    aq, as_ = quantize_ref(a)
    for name, (bq, bs) in (("1x128_x_128x128", quantize_weight_ref(w)), ("1x128_x_1x128", quantize_ref(w))):
        y = block_mm(aq, as_, bq, bs, torch.float32)
        ref = mm_ref(aq, as_, bq, bs)
        exact = a @ w.t()
        res[f"gemm_check_{name}"] = {"max_rel_err_vs_emulation": float((y - ref).abs().max() / ref.abs().max()),
                                     "rel_err_vs_fp32": float((y - exact).norm() / exact.norm())}
    say("gemm checks:", {k: v for k, v in res.items() if k.startswith("gemm_check")})


def gemm(res, g):
    n = 8192
    a = torch.randn(n, n, device="cuda", generator=g).bfloat16()
    b = torch.randn(n, n, device="cuda", generator=g).bfloat16()
    flop = 2 * n ** 3
    t_bf16 = ms(lambda: torch.mm(a, b.t()))
    da, db = dual(a, col=False), dual(b, col=False)
    aq, as_, bq1, bs1 = da.q, da.scale, db.q, db.scale
    wq, ws = quantize_weight_ref(b)
    t_tile = ms(lambda: block_mm(aq, as_, wq, ws))
    t_row = ms(lambda: block_mm(aq, as_, bq1, bs1))
    res["gemm_8192"] = {"bf16_ms": t_bf16, "fp8_block_1x128_128x128_ms": t_tile, "fp8_block_1x128_1x128_ms": t_row,
                        "bf16_TFLOPs": flop / t_bf16 / 1e9, "fp8_block_1x128_128x128_TFLOPs": flop / t_tile / 1e9,
                        "fp8_block_1x128_1x128_TFLOPs": flop / t_row / 1e9,
                        "ratio_1x128_128x128": t_bf16 / t_tile, "ratio_1x128_1x128": t_bf16 / t_row}
    say("gemm 8192^3:", json.dumps(res["gemm_8192"]))


def quantizer(res, g):
    R, C = 65536, 4096
    x = torch.randn(R, C, device="cuda", generator=g).bfloat16()
    y = torch.empty_like(x)
    t_copy = ms(lambda: y.copy_(x))
    out = {"shape": [R, C], "copy_TBps": 4 * R * C / t_copy / 1e9}
    for cfg in ("four_w4", "four_w8"):
        t_both = ms(lambda: dual(x, row=True, col=True, config=cfg))
        t_row = ms(lambda: dual(x, row=True, col=False, config=cfg))
        out[cfg] = {"both_ms": t_both, "row_ms": t_row,
                            "both_TBps": R * C * (2 + 2 + 8 / 128) / t_both / 1e9,
                            "row_TBps": R * C * (2 + 1 + 4 / 128) / t_row / 1e9}
    res["quantize"] = out
    say("quantize:", json.dumps(out))


def quantize_configs(res, tokens, configs):
    from kernels.fp8block.bench_quantize import measure

    res["quantize_configs"] = measure(tokens, configs)


# the call of bench_quantize that times each epilogue's quantizer as the MLP block runs it
_EPILOGUE_CALL = {"none": "x_both", "bias_gelu": "gelu_both", "bias_gelu_grad": "gelu_grad_both_db",
                  "layer_norm": "ln_both"}


def set_defaults(res, spec: str) -> None:
    """``--quantize-defaults``: ``best`` (the fastest config per epilogue in this call's sweep, among those
    bit-equal to the default) or ``epilogue=config,...``; recorded in the JSON."""
    from kernels.fp8block import quantize

    if spec == "best":
        sweep = {k: v for k, v in res.get("quantize_configs", {}).items() if isinstance(v, dict)}
        pick = {ep: min((k for k, v in sweep.items() if v["same_as_default"][ep]), key=lambda k: sweep[k][call],
                        default=quantize.DEFAULT[ep]) for ep, call in _EPILOGUE_CALL.items()}
    else:
        pick = dict(kv.split("=", 1) for kv in spec.split(","))
    for ep, cfg in pick.items():
        if ep not in quantize.DEFAULT or cfg not in quantize.CONFIGS:
            raise SystemExit(f"--quantize-defaults {spec}: '{ep}={cfg}' is not an epilogue=config pair; "
                             f"epilogues {', '.join(quantize.DEFAULT)}, configs {', '.join(quantize.CONFIGS)}")
    quantize.DEFAULT.update(pick)
    res["quantize_defaults"] = dict(quantize.DEFAULT)
    say("quantize defaults:", res["quantize_defaults"])


def _fwd_bwd(fn, x, g_out, params):
    def run():
        for p in params:
            p.grad = None
        x.grad = None
        fn(x).backward(g_out)
    return run


def _time_against_bf16(out, runs, x, gy, params, eager=False) -> None:
    """Into ``out``: each run's forward + backward in ms (CUDA-graph replays; ``eager``: also
    launched eagerly), and each non-bf16 run's ratio to ``runs["bf16"]`` and its gradients'
    relative errors from bf16's (input first, then ``params``)."""
    grads = {}
    for name, fn in runs.items():
        out[f"{name}_ms"] = replay_ms(_fwd_bwd(fn, x, gy, params), rep=200)
        if eager:
            out[f"{name}_eager_ms"] = ms(_fwd_bwd(fn, x, gy, params), rep=200)
        for p in params:
            p.grad = None
        x.grad = None
        fn(x).backward(gy)
        grads[name] = [x.grad.float().clone()] + [p.grad.float().clone() for p in params]
    for name in runs:
        if name != "bf16":
            out[f"ratio_{name}"] = out["bf16_ms"] / out[f"{name}_ms"]
            out[f"{name}_grad_rel_err"] = [float((a - b).norm() / b.norm()) for a, b in zip(grads[name], grads["bf16"])]


def mlp_block(res, g, tokens):
    d, H = 1024, 4096
    torch.manual_seed(0)
    l1, l2 = nn.Linear(d, H).cuda().bfloat16(), nn.Linear(H, d).cuda().bfloat16()
    f1, f2 = Fp8BlockLinear.from_linear(l1, guard_calls=0), Fp8BlockLinear.from_linear(l2, guard_calls=0)
    x = torch.randn(tokens, d, device="cuda", generator=g).bfloat16().requires_grad_()
    gy = torch.randn(tokens, d, device="cuda", generator=g).bfloat16()
    params = list(l1.parameters()) + list(l2.parameters())
    runs = {"bf16": lambda t: bf16_ffn(t, l1, l2), "fp8_block_fused": lambda t: fp8_block_ffn(t, f1, f2),
            "fp8_block_unfused": lambda t: f2(F.gelu(f1(t)))}
    out = {"tokens": tokens, "d": d, "hidden": H, "flop": 3 * 2 * 2 * tokens * d * H}
    _time_against_bf16(out, runs, x, gy, params, eager=True)
    res["mlp_block"] = out
    say("mlp block:", json.dumps(out))


def mlp_block_ln(res, g, tokens):
    """The MLP block with its pre-norm, as ``SequenceLayer`` runs it under autocast: ``ffn2(gelu(ffn1(
    ln2(S))))`` of the fp32 residual stream ``S``, LayerNorm parameters fp32, the Linears' bf16.
    bf16: torch's LayerNorm (fp32 out), then the CUDA path of ``mlp_block``; fp8 fused: the norm in
    the first quantizer (``fp8_block_ffn(S, norm=ln)``: its statistics, then the normalized rows
    straight to fp8); fp8 unfused: torch's LayerNorm written out, then ``fp8_block_ffn``."""
    d, H = 1024, 4096
    torch.manual_seed(0)
    l1, l2 = nn.Linear(d, H).cuda().bfloat16(), nn.Linear(H, d).cuda().bfloat16()
    ln = nn.LayerNorm(d).cuda()
    f1, f2 = Fp8BlockLinear.from_linear(l1, guard_calls=0), Fp8BlockLinear.from_linear(l2, guard_calls=0)
    x = torch.randn(tokens, d, device="cuda", generator=g).requires_grad_()
    gy = torch.randn(tokens, d, device="cuda", generator=g).bfloat16()
    params = list(ln.parameters()) + list(l1.parameters()) + list(l2.parameters())

    def autocast(fn):
        def run(t):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return fn(t)
        return run

    runs = {"bf16": autocast(lambda t: bf16_ffn(ln(t), l1, l2)),
            "fp8_block_fused": autocast(lambda t: fp8_block_ffn(t, f1, f2, norm=ln)),
            "fp8_block_unfused_norm": autocast(lambda t: fp8_block_ffn(ln(t), f1, f2))}
    out = {"tokens": tokens, "d": d, "hidden": H, "input": "fp32 residual stream, autocast bf16"}
    _time_against_bf16(out, runs, x, gy, params)
    out["norm_fusion_gain"] = out["fp8_block_unfused_norm_ms"] / out["fp8_block_fused_ms"]
    res["mlp_block_ln"] = out
    say("mlp block with its norm:", json.dumps(out))


def profile_block(res, g, tokens):
    """GPU time per kernel of one forward + backward of the MLP block, bf16 and fp8_block fused
    (torch.profiler), and each of the six GEMMs alone at the block's shapes."""
    from torch.profiler import ProfilerActivity, profile

    d, H = 1024, 4096
    l1, l2 = nn.Linear(d, H).cuda().bfloat16(), nn.Linear(H, d).cuda().bfloat16()
    f1, f2 = Fp8BlockLinear.from_linear(l1, guard_calls=0), Fp8BlockLinear.from_linear(l2, guard_calls=0)
    x = torch.randn(tokens, d, device="cuda", generator=g).bfloat16().requires_grad_()
    gy = torch.randn(tokens, d, device="cuda", generator=g).bfloat16()
    params = list(l1.parameters()) + list(l2.parameters())
    out = {}
    for name, fn in (("bf16", lambda t: bf16_ffn(t, l1, l2)), ("fp8_block_fused", lambda t: fp8_block_ffn(t, f1, f2))):
        run = _fwd_bwd(fn, x, gy, params)
        run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                run()
            torch.cuda.synchronize()
        kern = {}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                kern[e.name[:90]] = kern.get(e.name[:90], 0.0) + e.device_time / 3 / 1e3
        out[name] = dict(sorted(kern.items(), key=lambda kv: -kv[1])[:14])
        ops = {e.key: e.device_time_total / 3 / 1e3 for e in prof.key_averages() if e.key.startswith("aten::")}
        out[name + "_aten_ops"] = dict(sorted(ops.items(), key=lambda kv: -kv[1])[:10])
        out[name + "_total_ms"] = sum(kern.values())
    gemms = {}
    xd = dual(x.detach(), col=True)
    hd = dual(torch.randn(tokens, H, device="cuda", generator=g).bfloat16())
    w1q, _, w1s = weight(l1.weight)
    w2q, w2qt, w2s = weight(l2.weight)
    hb = torch.randn(tokens, H, device="cuda", generator=g).bfloat16()
    gemms["ffn1_fwd_fp8"] = ms(lambda: block_mm(xd.q, xd.scale, w1q, w1s))
    gemms["ffn1_fwd_bf16"] = ms(lambda: torch.mm(x.detach(), l1.weight.t()))
    gemms["ffn2_fwd_fp8"] = ms(lambda: block_mm(hd.q, hd.scale, w2q, w2s))
    gemms["ffn2_fwd_bf16"] = ms(lambda: torch.mm(hb, l2.weight.t()))
    w2t = (w2qt, w2s.t())
    gemms["ffn2_dgrad_fp8"] = ms(lambda: block_mm(xd.q, xd.scale, *w2t))
    gemms["ffn2_dgrad_bf16"] = ms(lambda: torch.mm(gy, l2.weight))
    gemms["ffn1_wgrad_fp8"] = ms(lambda: block_mm(hd.qt, hd.scale_t, xd.qt, xd.scale_t, torch.float32))
    gemms["ffn1_wgrad_bf16"] = ms(lambda: torch.mm(hb.t(), x.detach()))
    out["gemms_ms"] = gemms
    try:  # does cuBLASLt's block-scaled GEMM take a bias epilogue here?
        y = F.scaled_mm(hd.q, w2q.t(), hd.scale, F.ScalingType.BlockWise1x128, w2s.contiguous().t(),
                        F.ScalingType.BlockWise128x128, bias=l2.bias, output_dtype=torch.bfloat16)
        ref = block_mm(hd.q, hd.scale, w2q, w2s) + l2.bias
        out["gemm_bias_epilogue"] = {"works": True, "max_abs_diff": float((y.float() - ref.float()).abs().max()),
                                     "ms": ms(lambda: F.scaled_mm(hd.q, w2q.t(), hd.scale, F.ScalingType.BlockWise1x128,
                                                                  w2s.contiguous().t(), F.ScalingType.BlockWise128x128,
                                                                  bias=l2.bias, output_dtype=torch.bfloat16))}
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        out["gemm_bias_epilogue"] = {"works": False, "error": str(e).splitlines()[0][:300]}
    res["mlp_block_profile"] = out
    say("mlp block profile:", json.dumps(out, indent=0))


def table(res, g, quick):
    rows = []
    for M in (MS[:2] if quick else MS):
        for K in WIDTHS:
            for N in WIDTHS:
                lin = nn.Linear(K, N).cuda().bfloat16()
                f8 = Fp8BlockLinear.from_linear(lin, guard_calls=0)
                x = torch.randn(M, K, device="cuda", generator=g).bfloat16().requires_grad_()
                gy = torch.randn(M, N, device="cuda", generator=g).bfloat16()
                params = list(lin.parameters())
                t16 = replay_ms(_fwd_bwd(lin, x, gy, params), rep=40)
                t8 = replay_ms(_fwd_bwd(f8, x, gy, params), rep=40)
                rows.append({"m": M, "k": K, "n": N, "bf16_ms": t16, "fp8_block_ms": t8, "ratio": t16 / t8})
                del lin, f8, x, gy
        say(f"table M={M}:", " ".join(f"{r['k']}x{r['n']}:{r['ratio']:.2f}" for r in rows if r["m"] == M))
    res["table"] = rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tokens", type=int, default=147456, help="MLP block rows: gem-h100-4k's micro-batch "
                    "(128 samples × mean length 1,152)")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: checks, gemm, quantizer, "
                    "configs, block, block_ln, profile, table")
    ap.add_argument("--configs", default="", help="the configs part's keys of quantize.CONFIGS (default: all)")
    ap.add_argument("--quantize-defaults", default="", help="before the block: 'best' (this call's sweep) or "
                    "'epilogue=config,...'")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
           "torch": torch.__version__, "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d"), "command": "python -m kernels.fp8block.bench --out $OUT"}
    parts = {"checks": lambda: checks(res, g), "gemm": lambda: gemm(res, g), "quantizer": lambda: quantizer(res, g),
             "configs": lambda: quantize_configs(res, a.tokens, [c for c in a.configs.split(",") if c] or None),
             "block": lambda: (set_defaults(res, a.quantize_defaults) if a.quantize_defaults else None,
                               mlp_block(res, g, a.tokens)),
             "block_ln": lambda: mlp_block_ln(res, g, a.tokens),
             "profile": lambda: profile_block(res, g, a.tokens), "table": lambda: table(res, g, a.quick)}
    skip = {p for p in a.skip.split(",") if p}
    if skip - set(parts):
        ap.error(f"--skip {a.skip}: unknown part(s) {', '.join(sorted(skip - set(parts)))}; use {', '.join(parts)}")
    res["parts"] = [p for p in parts if p not in skip]
    for name, part in parts.items():
        if name in skip:
            continue
        try:
            part()
        except Exception:  # noqa: BLE001 - one failed part leaves the others' numbers
            res.setdefault("errors", []).append(traceback.format_exc()[-2000:])
            say(traceback.format_exc())
        torch.cuda.empty_cache()
        (a.out / "fp8_block_bench.json").write_text(json.dumps(res, indent=1))
    say("wrote", a.out / "fp8_block_bench.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
