"""H200 kernel sweep for the kernel cost model's efficiency curves (hwmodels/data/efficiency.yaml).

Run on the GPU box (torch + CUDA):  python3 hwmodels/bench/kernel_sweep.py --out $OUT/h200_kernel_sweep.json
Times with CUDA events after a warm-up, median of repeats; the whole sweep takes well under 3 minutes.
Every row: name, kind (the twin's kernel kind), shape, dtype, time_s, flops, bytes, achieved_flops_per_s,
achieved_Bps. Not part of the hwmodels package (imports torch); nothing in hwmodels imports it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

DEV = "cuda"
ROWS: list[dict] = []


def timed(fn, *, warmup: int = 3, repeats: int = 10, budget_s: float = 1.5) -> float:
    """Median seconds of `fn()` over `repeats` CUDA-event timings after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    t_start = time.perf_counter()
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
        if time.perf_counter() - t_start > budget_s and len(times) >= 3:
            break
    return statistics.median(times)


def row(name: str, kind: str, shape: dict, dtype: str, time_s: float, flops: float, bytes_: float, **extra) -> None:
    r = {"name": name, "kind": kind, "shape": shape, "dtype": dtype, "time_s": time_s, "flops": flops,
         "bytes": bytes_, "achieved_flops_per_s": flops / time_s if flops else 0.0,
         "achieved_Bps": bytes_ / time_s if bytes_ else 0.0, **extra}
    ROWS.append(r)
    tf = r["achieved_flops_per_s"] / 1e12
    tb = r["achieved_Bps"] / 1e12
    print(f"{name:60s} {time_s*1e6:10.1f} us {tf:8.1f} TFLOP/s {tb:6.2f} TB/s", flush=True)


def guard(fn, label: str) -> None:
    try:
        fn()
    except Exception as exc:  # keep sweeping; record the failure
        print(f"FAILED {label}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        ROWS.append({"name": label, "error": f"{type(exc).__name__}: {exc}"})
    torch.cuda.empty_cache()


def gemm_bf16() -> None:
    shapes = [(n, n, n) for n in (1024, 2048, 4096, 8192, 16384)]
    shapes += [(65536, 512, 2048), (65536, 2048, 512), (8192, 1024, 4096), (131072, 256, 256)]
    for m, k, n in shapes:
        def one(m=m, k=k, n=n):
            a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
            b = torch.randn(k, n, device=DEV, dtype=torch.bfloat16)
            t = timed(lambda: torch.mm(a, b), repeats=20 if m * k * n < 2**36 else 8)
            row(f"mm bf16 {m}x{k}x{n}", "gemm", {"m": m, "k": k, "n": n}, "bf16", t,
                2.0 * m * k * n, 2.0 * (m * k + k * n + m * n))
        guard(one, f"mm bf16 {m}x{k}x{n}")


def gemm_fp8() -> None:
    for n in (2048, 4096, 8192):
        def one(n=n):
            a = torch.randn(n, n, device=DEV).to(torch.float8_e4m3fn)
            b = torch.randn(n, n, device=DEV).to(torch.float8_e4m3fn).t()  # column-major second operand
            sa = torch.ones(n, 1, device=DEV, dtype=torch.float32)
            sb = torch.ones(1, n, device=DEV, dtype=torch.float32)
            t = timed(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), repeats=20)
            row(f"scaled_mm fp8 e4m3 rowwise {n}^3", "gemm", {"m": n, "k": n, "n": n}, "fp8", t,
                2.0 * n**3, 2.0 * n * n + 2.0 * n * n)  # fp8 inputs 1 B each, bf16 output
        guard(one, f"scaled_mm fp8 {n}^3")


def sdpa_flops(b: int, h: int, sq: int, skv: int, d: int, causal: bool) -> float:
    f = 4.0 * b * h * sq * skv * d  # QK^T and PV
    return f / 2 if causal else f


def sdpa() -> None:
    """Flash-attention SDPA per backend: `default` (what torch picks; the ANCHORS.md rows), `flash` (FA2), `cudnn`."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"default": contextlib.nullcontext, "flash": lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION),
                "cudnn": lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)}
    d, h = 128, 4
    shapes = [(max(1, 262144 // s), h, s, s) for s in (256, 512, 1024, 2048, 4096)]
    shapes += [(64, h, 4096, 256), (8, 16, 4096, 256), (4, 16, 4096, 4096), (16, 8, 1024, 1024)]
    for backend, ctx in backends.items():
        for b, hh, sq, skv in shapes:
            for causal in (False, True):
                if causal and sq != skv:
                    continue
                def one(b=b, hh=hh, sq=sq, skv=skv, causal=causal, backend=backend, ctx=ctx):
                    q = torch.randn(b, hh, sq, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
                    k = torch.randn(b, hh, skv, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
                    v = torch.randn(b, hh, skv, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
                    shape = {"batch": b, "heads": hh, "q_len": sq, "kv_len": skv, "head_dim": d, "causal": causal}
                    f = sdpa_flops(b, hh, sq, skv, d, causal)
                    io = 2.0 * (2 * b * hh * sq * d + 2 * b * hh * skv * d)  # q, out, k, v in bf16
                    g = torch.randn(b, hh, sq, d, device=DEV, dtype=torch.bfloat16)
                    with ctx():
                        t_f = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), repeats=15)
                        def fb():
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(g)
                        t_fb = timed(fb, repeats=15)
                    tag = f"{backend} B{b} H{hh} Q{sq} KV{skv} D{d}{' causal' if causal else ''}"
                    row(f"sdpa fwd {tag}", "attention.fwd", shape, "bf16", t_f, f, io, backend=backend)
                    row(f"sdpa fwd+bwd {tag}", "attention.fwd_bwd", shape, "bf16", t_fb, 3.5 * f, 3.0 * io,
                        backend=backend, note="fwd+bwd flops = 3.5 x fwd (bwd = 2.5 x fwd incl. recompute of QK^T)")
                    row(f"sdpa bwd (fwd+bwd - fwd) {tag}", "attention.bwd", shape, "bf16", max(t_fb - t_f, 1e-9),
                        2.5 * f, 2.0 * io, derived=True, backend=backend)
                guard(one, f"sdpa {backend} B{b} H{hh} Q{sq} KV{skv} causal={causal}")


def embedding_bag() -> None:
    bags = 65536
    for rows_ in (1_000_000, 20_000_000):
        for dim in (64, 128):
            for dt, dtn in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
                def one(rows_=rows_, dim=dim, dt=dt, dtn=dtn):
                    w = torch.randn(rows_, dim, device=DEV, dtype=dt)
                    esz = w.element_size()
                    for pool in (1, 8, 32):
                        ids = torch.randint(0, rows_, (bags * pool,), device=DEV)
                        offs = torch.arange(0, bags * pool, pool, device=DEV)
                        read = float(bags * pool * dim * esz)
                        io = read + bags * dim * esz + ids.numel() * 8
                        shape = {"rows": rows_, "dim": dim, "bags": bags, "ids_per_bag": pool}
                        t_f = timed(lambda: F.embedding_bag(ids, w, offs, mode="sum"), repeats=15)
                        row(f"embedding_bag fwd {dtn} {rows_}x{dim} pool{pool}", "embedding.fwd", shape, dtn, t_f,
                            float(bags * pool * dim), io, read_Bps=read / t_f)
                        wg = w.detach().requires_grad_(True)
                        go = torch.randn(bags, dim, device=DEV, dtype=dt)
                        def fb():
                            out = F.embedding_bag(ids, wg, offs, mode="sum", sparse=True)
                            out.backward(go)
                            wg.grad = None
                        t_fb = timed(fb, repeats=15)
                        row(f"embedding_bag fwd+bwd(sparse) {dtn} {rows_}x{dim} pool{pool}", "embedding.fwd_bwd",
                            shape, dtn, t_fb, 2.0 * bags * pool * dim, 2.0 * io + read, read_Bps=read / t_fb)
                        row(f"embedding_bag bwd(sparse, fwd+bwd - fwd) {dtn} {rows_}x{dim} pool{pool}",
                            "embedding.bwd", shape, dtn, max(t_fb - t_f, 1e-9), float(bags * pool * dim),
                            io + read, derived=True, read_Bps=read / max(t_fb - t_f, 1e-9))
                    del w
                guard(one, f"embedding_bag {dtn} {rows_}x{dim}")


def streaming() -> None:
    def copies():
        for n in (1 << 20, 1 << 24, 1 << 28):  # bf16 elements: 2 MiB .. 512 MiB
            src = torch.randn(n, device=DEV, dtype=torch.bfloat16)
            dst = torch.empty_like(src)
            t = timed(lambda: dst.copy_(src), repeats=20)
            row(f"copy bf16 {n} elems", "elementwise", {"numel": n}, "bf16", t, 0.0, 4.0 * n)
    guard(copies, "copy")

    def elementwise():
        for n in (1 << 20, 1 << 24, 1 << 28):
            a, b, c = (torch.randn(n, device=DEV, dtype=torch.bfloat16) for _ in range(3))
            out = torch.empty_like(a)
            def fma():
                torch.mul(a, b, out=out)
                torch.add(out, c, out=out)
            t = timed(fma, repeats=20)
            # two kernels: mul reads a, b, writes out; add reads out, c, writes out
            row(f"a*b+c bf16 (mul + add) {n} elems", "elementwise", {"numel": n}, "bf16", t, 2.0 * n, 12.0 * n,
                kernels=2)
    guard(elementwise, "elementwise")

    def norms():
        for rows_, dim in ((262144, 512), (262144, 1024)):
            x = torch.randn(rows_, dim, device=DEV, dtype=torch.bfloat16, requires_grad=True)
            ln = torch.nn.LayerNorm(dim, device=DEV, dtype=torch.bfloat16)
            g = torch.randn(rows_, dim, device=DEV, dtype=torch.bfloat16)
            n = rows_ * dim
            t_f = timed(lambda: ln(x), repeats=20)
            def fb():
                ln(x).backward(g)
            t_fb = timed(fb, repeats=20)
            shape = {"rows": rows_, "dim": dim}
            row(f"layer_norm fwd bf16 {rows_}x{dim}", "norm", shape, "bf16", t_f, 8.0 * n, 4.0 * n)
            row(f"layer_norm fwd+bwd bf16 {rows_}x{dim}", "norm.fwd_bwd", shape, "bf16", t_fb, 24.0 * n, 12.0 * n)
            row(f"layer_norm bwd (fwd+bwd - fwd) bf16 {rows_}x{dim}", "norm.bwd", shape, "bf16",
                max(t_fb - t_f, 1e-9), 16.0 * n, 8.0 * n, derived=True)
    guard(norms, "layer_norm")


def env() -> dict:
    def smi(q: str) -> str:
        try:
            return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                                  text=True, timeout=20).stdout.strip()
        except Exception as exc:  # nvidia-smi missing
            return f"unavailable: {exc}"
    try:
        import triton
        triton_v = triton.__version__
    except Exception:
        triton_v = "unavailable"
    p = torch.cuda.get_device_properties(0)
    return {"torch": torch.__version__, "triton": triton_v, "cuda": torch.version.cuda,
            "gpu_name": torch.cuda.get_device_name(0), "sms": p.multi_processor_count, "memory_bytes": p.total_memory,
            "sm_clock_mhz": smi("clocks.sm"), "sm_clock_max_mhz": smi("clocks.max.sm"),
            "mem_clock_mhz": smi("clocks.mem"), "power_limit_w": smi("power.limit"),
            "driver": smi("driver_version")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.perf_counter()
    e = env()
    x = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    t_ramp = time.perf_counter()
    while time.perf_counter() - t_ramp < 1.0:  # ramp the SM clock up from idle before the first timing
        torch.mm(x, x)
        torch.cuda.synchronize()
    del x
    for part in (gemm_bf16, gemm_fp8, sdpa, embedding_bag, streaming):
        part()
        print(f"-- {part.__name__} done at {time.perf_counter() - t0:.1f} s", flush=True)
    e["sm_clock_mhz_after"] = env()["sm_clock_mhz"]
    out = {"date": time.strftime("%Y-%m-%d"), "env": e, "wall_s": time.perf_counter() - t0,
           "timing": "CUDA events, 3 warm-up calls, median of up to 20 repeats (1.5 s cap per case)",
           "rows": ROWS}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)
    print(f"wrote {len(ROWS)} rows to {args.out} in {out['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
