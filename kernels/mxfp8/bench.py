"""One device call: check and time MXFP8 quantize and GEMM on the GPU, side by side with bf16
``torch.mm`` and fp8 row-wise ``torch._scaled_mm``; writes ``$OUT/mxfp8_bench.json``.

    python -m kernels.mxfp8.bench --out $OUT [--quick]

Correctness first (fresh random inputs, outputs poisoned with NaN before each run):
quantize bit-exact vs ``quantize_ref`` (hardware and soft cast, both dims, E4M3/E5M2, odd
shapes, zero blocks, magnitudes 1e-30..1e30, NaN/Inf blocks); GEMM vs dequantize + fp32
matmul (TF32 off) and vs float64. Then timing: ``triton.testing.do_bench`` medians; inputs
far larger than L2 where it matters (GEMM operands at 2048^3 fit L2 and are reported as such).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from kernels.mxfp8.gemm import mx_mm
from kernels.mxfp8.quantize import quantize
from kernels.mxfp8.reference import dequantize_ref, mx_mm_ref, quantize_ref

T0 = time.time()


def say(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def med(fn, rep=200):
    return do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e-3  # seconds


def copy_ceiling(res):
    x = torch.randn(1 << 29, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    y = torch.empty_like(x)
    t = med(lambda: y.copy_(x))
    res["copy_TBps"] = 2 * x.numel() * 2 / t / 1e12
    say(f"copy 1 GiB bf16: {res['copy_TBps']:.3f} TB/s (read+write)")


def weird(shape, g):
    x = torch.randn(shape, device="cuda", generator=g)
    x = x * torch.logspace(-30, 30, shape[1], device="cuda")[None, :]
    x[: min(3, shape[0]), :32] = 0  # all-zero blocks
    return x.to(torch.bfloat16)


def check_quantize(res, g):
    out = []
    for shape in [(64, 96), (33, 70), (130, 1000), (1000, 33), (4096, 4096)]:
        for dim in (1, 0):
            for elem in ("e4m3", "e5m2"):
                for soft in (False, True):
                    x = weird(shape, g) if shape[0] < 4096 else torch.randn(shape, device="cuda", generator=g).to(torch.bfloat16)
                    if shape == (130, 1000):
                        x[5, 7] = float("nan")
                        x[9, 300] = float("inf")
                    d, s = quantize(x, dim, elem, soft_cast=soft)
                    dr, sr = quantize_ref(x, dim, elem)
                    ok = torch.equal(s, sr) and torch.equal(d.view(torch.uint8), dr.view(torch.uint8))
                    out.append({"shape": shape, "dim": dim, "elem": elem, "soft_cast": soft, "bit_exact": bool(ok)})
    res["quantize_check"] = out
    res["quantize_all_bit_exact"] = all(o["bit_exact"] for o in out)
    x = torch.randn(4096, 4096, device="cuda", generator=g)
    d, s = quantize(x, 1)
    err = (dequantize_ref(d, s) - x).norm() / x.norm()
    res["quantize_roundtrip_rel_err_randn"] = float(err)
    say(f"quantize bit-exact in {len(out)} cases: {res['quantize_all_bit_exact']}; roundtrip rel err {float(err):.4f}")


def time_quantize(res, quick):
    rows = []
    shapes = [(16384, 16384), (65536, 2048), (8192, 8192)] if not quick else [(16384, 16384)]
    for shape in shapes:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        n = x.numel()
        nbytes = n * 2 + n * 1 + n / 32
        for dim in (1, 0):
            cfgs = [(32, 4, 4), (64, 2, 4), (128, 1, 4), (64, 4, 8), (128, 2, 8), (256, 1, 8)] if dim == 1 else \
                   [(64, 1, 4), (128, 1, 4), (128, 2, 8), (256, 1, 8), (64, 4, 4), (256, 2, 8)]
            for BR, G, w in cfgs:
                try:
                    t = med(lambda: quantize(x, dim, BR=BR, G=G, num_warps=w), rep=100)
                except Exception as e:  # noqa: BLE001
                    rows.append({"shape": shape, "dim": dim, "BR": BR, "G": G, "warps": w, "error": repr(e)[:200]})
                    continue
                rows.append({"shape": shape, "dim": dim, "BR": BR, "G": G, "warps": w, "time_s": t,
                             "bytes": nbytes, "TBps": nbytes / t / 1e12})
            best = max((r for r in rows if r["shape"] == shape and r["dim"] == dim and "TBps" in r),
                       key=lambda r: r["TBps"])
            say(f"quantize {shape} dim={dim}: best {best['TBps']:.3f} TB/s (BR={best['BR']} G={best['G']} "
                f"warps={best['warps']})")
        del x
    res["quantize_timing"] = rows


def mx_operands(M, N, K, g):
    a = torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", generator=g, dtype=torch.bfloat16)
    return a, b, quantize(a, 1), quantize(b, 1)


def check_gemm(res, g):
    torch.backends.cuda.matmul.allow_tf32 = False
    out = []
    for M, N, K in [(1000, 777, 544), (128, 256, 4096), (2048, 2048, 2048), (300, 5000, 96)]:
        a, b, (qa, sa), (qb, sb) = mx_operands(M, N, K, g)
        ref = mx_mm_ref(qa, sa, qb, sb)  # dequantize + fp32 matmul
        ref64 = dequantize_ref(qa, sa).double() @ dequantize_ref(qb, sb).double().t()
        row = {"shape": (M, N, K), "fp32_ref_vs_fp64": float((ref.double() - ref64).norm() / ref64.norm())}
        for be in ("emulated", "native"):
            try:
                c = torch.full((M, N), float("nan"), device="cuda")
                c = mx_mm(qa, sa, qb, sb, torch.float32, backend=be)
                row[be] = {"vs_fp32_ref": float((c - ref).norm() / ref.norm()),
                           "vs_fp64": float((c.double() - ref64).norm() / ref64.norm()),
                           "max_abs_vs_fp32_ref": float((c - ref).abs().max()),
                           "all_finite": bool(torch.isfinite(c).all())}
            except Exception as e:  # noqa: BLE001
                row[be] = {"error": repr(e)[:300]}
        out.append(row)
        say(f"gemm check {M}x{N}x{K}: {json.dumps({k: v for k, v in row.items() if k != 'shape'})}")
    torch.backends.cuda.matmul.allow_tf32 = True
    res["gemm_check"] = out


GEMM_CONFIGS = [  # (BM, BN, SUB, GROUP_M, warps, stages)
    (128, 128, 1, 8, 8, 4), (128, 128, 2, 8, 8, 4), (128, 128, 4, 8, 8, 3), (128, 256, 2, 8, 8, 3),
    (256, 128, 2, 8, 8, 3), (128, 64, 4, 8, 4, 4), (64, 128, 4, 8, 4, 4), (128, 128, 4, 8, 4, 3),
]


def gemm_sweep(res, g, quick):
    M = N = K = 8192
    a, b, (qa, sa), (qb, sb) = mx_operands(M, N, K, g)
    rows = []
    for cfg in GEMM_CONFIGS[: 3 if quick else None]:
        try:
            mx_mm(qa, sa, qb, sb, backend="emulated", config=cfg)
            t = med(lambda: mx_mm(qa, sa, qb, sb, backend="emulated", config=cfg), rep=150)
            rows.append({"config": cfg, "time_s": t, "TFLOPs": 2 * M * N * K / t / 1e12})
            say(f"8192^3 emulated config {cfg}: {rows[-1]['TFLOPs']:.0f} TFLOP/s")
        except Exception as e:  # noqa: BLE001
            rows.append({"config": cfg, "error": repr(e)[:300]})
            say(f"config {cfg}: {repr(e)[:200]}")
    res["gemm_config_sweep_8192"] = rows
    ok = [r for r in rows if "TFLOPs" in r]
    return max(ok, key=lambda r: r["TFLOPs"])["config"] if ok else None


def gemm_table(res, g, cfg, quick):
    shapes = [(2048,) * 3, (4096,) * 3, (8192,) * 3, (16384,) * 3,
              (65536, 2048, 512), (65536, 512, 2048), (65536, 4096, 1024), (16384, 2048, 512)]
    if quick:
        shapes = [(8192,) * 3]
    rows = []
    for M, N, K in shapes:
        a, b, (qa, sa), (qb, sb) = mx_operands(M, N, K, g)
        f = 2.0 * M * N * K
        row = {"shape": (M, N, K)}
        row["bf16_mm"] = med(lambda: torch.mm(a, b.t()))
        fa, fb = qa, qb  # fp8 e4m3 data; row-wise fp32 scales (values are not the point, the speed is)
        s_a = torch.rand(M, 1, device="cuda") + 0.5
        s_b = torch.rand(1, N, device="cuda") + 0.5
        for fast in (False, True):
            try:
                row[f"fp8_rowwise_scaled_mm{'_fastacc' if fast else ''}"] = med(
                    lambda: torch._scaled_mm(fa, fb.t(), scale_a=s_a, scale_b=s_b, out_dtype=torch.bfloat16,
                                             use_fast_accum=fast))
            except Exception as e:  # noqa: BLE001
                row[f"fp8_rowwise_scaled_mm{'_fastacc' if fast else ''}_error"] = repr(e)[:200]
        row["mxfp8_ours"] = med(lambda: mx_mm(qa, sa, qb, sb, backend="emulated", config=cfg))
        if not quick:
            try:
                row["mxfp8_dot_scaled_decomposed"] = med(lambda: mx_mm(qa, sa, qb, sb, backend="native"), rep=100)
            except Exception as e:  # noqa: BLE001
                row["mxfp8_dot_scaled_error"] = repr(e)[:200]
        row["mxfp8_quantize_both"] = med(lambda: (quantize(a, 1), quantize(b, 1)))
        for k in list(row):
            if k != "shape" and isinstance(row[k], float):
                row[k.replace("", "") + "_TFLOPs"] = f / row[k] / 1e12 if "quantize" not in k else None
        row["speedup_vs_bf16"] = row["bf16_mm"] / row["mxfp8_ours"]
        rows.append(row)
        say(f"{M}x{N}x{K}: bf16 {f / row['bf16_mm'] / 1e12:.0f}  fp8 rowwise "
            f"{f / row.get('fp8_rowwise_scaled_mm', float('inf')) / 1e12:.0f}  ours {f / row['mxfp8_ours'] / 1e12:.0f} "
            f"TFLOP/s  ours/bf16 {row['speedup_vs_bf16']:.2f}x  (+quantize {row['mxfp8_quantize_both'] * 1e3:.3f} ms)")
        del a, b, qa, qb, sa, sb
        torch.cuda.empty_cache()
    res["gemm_table"] = rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"torch": torch.__version__, "triton": triton.__version__, "device": torch.cuda.get_device_name(),
           "capability": torch.cuda.get_device_capability()}
    say(res)
    g = torch.Generator(device="cuda").manual_seed(0)
    steps = [lambda: copy_ceiling(res), lambda: check_quantize(res, g), lambda: time_quantize(res, a.quick),
             lambda: check_gemm(res, g)]
    for s in steps:
        try:
            s()
        except Exception:  # noqa: BLE001
            res.setdefault("errors", []).append(traceback.format_exc()[-1500:])
            say(traceback.format_exc()[-1500:])
        (out / "mxfp8_bench.json").write_text(json.dumps(res, indent=1, default=str))
    try:
        cfg = gemm_sweep(res, g, a.quick)
        res["gemm_config"] = cfg
        gemm_table(res, g, cfg, a.quick)
    except Exception:  # noqa: BLE001
        res.setdefault("errors", []).append(traceback.format_exc()[-1500:])
        say(traceback.format_exc()[-1500:])
    (out / "mxfp8_bench.json").write_text(json.dumps(res, indent=1, default=str))
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
