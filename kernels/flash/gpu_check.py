"""One device call for the core: correctness at real shapes, then TFLOP/s against padded SDPA.

    python -m kernels.flash.gpu_check               # from the repo root, on a CUDA machine
    python -m kernels.flash.gpu_check --only block  # the block-local path only (~1-2 min):
        # its checks vs float64, then block-64 fwd/bwd timing, FA2 kernels vs block-local
        # (table tiles and a sweep) side by side in one process, L = 256..2048
    [--out DIR (default $OUT)] [--workers 15] [--budget-s 215] [--sdpa]

Phase 1 runs in parallel worker processes (``--worker i n``): each checks a share of the
correctness cases (fwd + bwd vs float64, poisoned outputs) and compiles a share of the timing
kernels, so that Triton's on-disk cache is warm for phase 2. Phase 2 (a process per group,
``--time GROUP``) times fwd and bwd with ``triton.testing.do_bench`` (median) at B=1152, H=4,
D=128, lengths uniform in [L/2, L]; FLOPs count attended (valid) pairs only: 4·H·D per pair
forward, 8·H·D backward. The variants and tiles of each run are ``FlashOptions`` passed to the
core. Everything lands in ``OUT/flash_check.json``; the tables are printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import torch

from kernels.attention.reference import attention_reference
from kernels.flash import tiles as TT
from kernels.flash.core import attention_bwd, attention_fwd
from kernels.flash.options import WEIGHTS, BlockTiles, Config, FlashOptions, Tiles
from kernels.flash.work import work

WORK = "/tmp/flash_check_work"  # per-process results, merged into OUT/flash_check.json
B, H, D = 1152, 4, 128
LS = [256, 512, 1024, 2048]
DEVICE = "cuda"

# Tile variants swept in phase 2 (Tiles: own rows, other rows, warps, stages). Forward variants
# replace the forward tiles, backward ones the dK/dV and dQ tiles; "table" is core's choice.
F = {
    "f128x64w8s3": Tiles(128, 64, 8, 3), "f64x64w4s3": Tiles(64, 64, 4, 3),
    "f64x32w4s3": Tiles(64, 32, 4, 3), "f64x64w4s2": Tiles(64, 64, 4, 2),
    "f64x64w4s1": Tiles(64, 64, 4, 1), "f64x64w8s2": Tiles(64, 64, 8, 2),
}
BW = {  # name -> (dK/dV tiles, dQ tiles)
    "b128x64w8s3": (Tiles(128, 64, 8, 3), Tiles(128, 64, 8, 3)),
    "b128x64w8s3+dq64": (Tiles(128, 64, 8, 3), Tiles(64, 64, 4, 3)),
    "b64x64w8s3": (Tiles(64, 64, 8, 3), Tiles(64, 64, 8, 3)),
    "b128x64w8s2": (Tiles(128, 64, 8, 2), Tiles(128, 64, 8, 2)),
    "b64x64w8s2+dq64w4": (Tiles(64, 64, 8, 2), Tiles(64, 64, 4, 2)),
    "b64x64w4s2": (Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2)),
    "b64x64w8s1": (Tiles(64, 64, 8, 1), Tiles(64, 64, 8, 1)),
}
FWD_SWEEP = ["f128x64w8s3", "f64x64w4s3", "f64x32w4s3", "f64x64w4s2"]
BWD_SWEEP = ["b128x64w8s3", "b128x64w8s3+dq64", "b64x64w8s3", "b128x64w8s2"]
# Block-local tiles (core.BlockTiles: rows, tiles per program, warps, stages) swept by
# --only block; compile_check.py compiles the same set for sm_90 without a GPU. A 128-row
# backward tile needs > 227 KB of shared memory at 2 stages: not in the backward sweep.
BLOCK_TILES = {
    "r128g1w8s2": BlockTiles(128, 1, 8, 2), "r64g1w4s1": BlockTiles(64, 1, 4, 1),
    "r64g4w4s3": BlockTiles(64, 4, 4, 3), "r64g2w8s2": BlockTiles(64, 2, 8, 2),
}
BLOCK_LOCAL_FWD_SWEEP = ["r128g1w8s2", "r64g1w4s1", "r64g4w4s3", "r64g2w8s2"]
BLOCK_LOCAL_BWD_SWEEP = ["r64g1w4s1", "r64g4w4s3", "r64g2w8s2"]
SWEEPS = {  # kind -> (fwd variants, bwd variants)
    "gdpa_silu": (FWD_SWEEP, BWD_SWEEP), "jfa_causal": (FWD_SWEEP, BWD_SWEEP),
    "densekv_softmax": (FWD_SWEEP, BWD_SWEEP),  # block64: the "block" timing group
}


def fwd_cfg(name, base):
    return Config(F[name], base.dkdv, base.dq)


def bwd_cfg(name, base):
    dkdv, dq = BW[name]
    return Config(base.fwd, dkdv, dq)


# ---- inputs ----------------------------------------------------------------------------------------
def offsets(lens, dtype=torch.int64):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=dtype, device=DEVICE)


def rand_lens(n, L, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(L // 2, L + 1, (n,), generator=g).tolist()


KINDS = {  # name -> (weight, causal, block, dense K/V rows per sample or 0)
    "gdpa_silu": ("silu", False, 0, 0),
    "jfa_causal": ("softmax", True, 0, 0),
    "block64": ("softmax", False, 64, 0),
    "densekv_softmax": ("softmax", False, 0, 256),
    "densekv_silu": ("silu", False, 0, 256),
}


def problem(kind, lens, H=H, D=D, dtype=torch.bfloat16, seed=0):
    """Inputs and keyword arguments of one timing/warm-up problem."""
    weight, causal, block, N = KINDS[kind]
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q_off = offsets(lens)
    kv_lens = [N] * len(lens) if N else lens
    kv_off = offsets(kv_lens) if N else q_off
    Tq, Tk = sum(lens), sum(kv_lens)
    mk = lambda T: torch.randn(T, H, D, device=DEVICE, dtype=dtype, generator=g)  # noqa: E731
    q, k, v, do = mk(Tq), mk(Tk), mk(Tk), mk(Tq)
    scale = 1 / math.sqrt(D) if weight == "softmax" else 1 / max(max(kv_lens), 1)
    kw = dict(weight=weight, scale=scale, causal=causal, block=block)
    return (q, k, v, q_off, kv_off, max(lens), max(kv_lens)), do, kw


def pairs(kind, lens):
    weight, causal, block, N = KINDS[kind]
    total = 0
    for L in lens:
        if N:
            total += L * N
        elif block:
            for s in range(0, L, block):
                n = min(block, L - s)
                total += n * (n + 1) // 2 if causal else n * n
        else:
            total += L * (L + 1) // 2 if causal else L * L
    return total


# ---- phase 1: correctness + compile ----------------------------------------------------------------
JAG = [4096, 1, 0, 777, 2048, 130, 1500]


def check_cases():
    c = []
    add = lambda **kw: c.append(kw)  # noqa: E731
    for w in WEIGHTS:
        add(weight=w)
    for w in ["softmax", "silu"]:
        add(weight=w, causal=True)
        add(weight=w, block=64)
        add(weight=w, causal=True, block=64)
        add(weight=w, kv=[256] * len(JAG))  # jagged Q, dense K/V
        add(weight=w, q=[256] * len(JAG))  # dense Q, jagged K/V (one sample of length 0)
        add(weight=w, D=64, causal=w == "softmax")
        add(weight=w, cfg="atomic", causal=w == "softmax")
    js = [1024, 1, 0, 777, 130, 513, 64]  # max length <= tiles.SHORT_CAUSAL
    j5 = [512, 1, 0, 300, 130, 257, 64]  # <= tiles.SHORT_NONCAUSAL
    add(weight="silu", q=j5, kv=j5)
    add(weight="softmax", q=j5, kv=j5)
    add(weight="softmax", causal=True, q=js, kv=js)
    add(weight="silu", q=js, kv=js)
    add(weight="gelu", causal=True, q=js, kv=js)
    add(weight="softmax", q=js, kv=[256] * len(js))
    add(weight="softmax", block=64, q=js, kv=js)
    add(weight="gelu", causal=True)
    add(weight="relu2", block=64)
    add(weight="softmax", block=100)  # not a power of two: every tile masked
    add(weight="softmax", causal=True, off=torch.int32)
    add(weight="softmax", causal=True, dtype=torch.float16)
    add(weight="silu", dtype=torch.float16)
    add(weight="softmax", causal=True, dtype=torch.float32, q=[300, 0, 65, 1], kv=[300, 0, 65, 1])
    add(weight="silu", dtype=torch.float32, q=[200, 77], kv=[200, 77])
    return c


def block_check_cases():
    """The block-local path (``path="local"``: one offsets tensor on both sides, switch on)."""
    js = [1024, 1, 0, 777, 130, 513, 64]
    c = [dict(weight=w, causal=cz, block=64, path="local") for w in ["softmax", "silu"]
         for cz in [False, True]]
    c += [
        dict(weight="softmax", block=128, path="local"),
        dict(weight="softmax", causal=True, block=128, path="local"),
        dict(weight="gelu", causal=True, block=64, D=64, path="local"),
        dict(weight="softmax", block=16, path="local", q=js, kv=js),
        dict(weight="relu2", block=32, path="local", q=js, kv=js),
        dict(weight="softmax", block=64, dtype=torch.float16, path="local"),
        dict(weight="softmax", causal=True, block=64, dtype=torch.float32, q=[300, 0, 65, 1],
             kv=[300, 0, 65, 1], path="local"),
        dict(weight="softmax", block=64, path="generic"),  # the switch off: FA2 kernels
    ]
    for f, b in [("r128g1w8s2", "r64g1w4s1"), ("r64g4w4s3", "r64g4w4s3"),
                 ("r64g2w8s2", "r64g2w8s2"), ("r64g1w4s1", "r64g2w8s2")]:
        c.append(dict(weight="softmax", causal=True, block=64, path="local", tiles=(f, b)))
    return c


def _case_flash(case) -> FlashOptions:
    """The core's options of a check case: atomic-dQ tiles, or the block path (and its tiles)."""
    if case.get("cfg") == "atomic":
        return FlashOptions(tiles=Config(Tiles(128, 64, 8, 3), Tiles(128, 64, 8, 2), Tiles(128, 64, 8, 2), True))
    path, tiles = case.get("path"), case.get("tiles")
    if path is None:
        return FlashOptions()
    if tiles:
        return FlashOptions(block_local=path == "local", block_fwd=BLOCK_TILES[tiles[0]],
                            block_bwd=BLOCK_TILES[tiles[1]])
    return FlashOptions(block_local=path == "local")


def run_check(case):
    weight, causal, block = case["weight"], case.get("causal", False), case.get("block", 0)
    q_lens, kv_lens = case.get("q", JAG), case.get("kv", JAG)
    dtype, Dh, Hh = case.get("dtype", torch.bfloat16), case.get("D", 128), 2
    g = torch.Generator(device=DEVICE).manual_seed(len(json.dumps(str(case))))
    q_off, kv_off = offsets(q_lens, case.get("off", torch.int64)), offsets(kv_lens)
    if case.get("off") is not None:
        kv_off = kv_off.to(case["off"])
    if case.get("path") and q_lens == kv_lens:
        kv_off = q_off  # self attention: one offsets tensor (the block-local path's condition)
    mk = lambda T: torch.randn(T, Hh, Dh, device=DEVICE, generator=g).to(dtype)  # noqa: E731
    q, k, v, do = mk(sum(q_lens)), mk(sum(kv_lens)), mk(sum(kv_lens)), mk(sum(q_lens))
    scale = 1 / math.sqrt(Dh) if weight == "softmax" else 1 / max(max(kv_lens), 1)
    kw = dict(weight=weight, scale=scale, causal=causal, block=block)
    args = (q, k, v, q_off, kv_off, max(q_lens), max(kv_lens))
    launched = {}
    run = dict(flash=_case_flash(case), poison_outputs=True, launched=launched)
    o, lse = attention_fwd(*args, **kw, **run)
    grads = attention_bwd(do, q, k, v, o, lse, *args[3:], **kw, **run)
    _sync()
    kernels = sorted(launched)
    ref_in = [t.double().requires_grad_() for t in (q, k, v)]
    ref = attention_reference(*ref_in, q_off.cpu(), kv_off.cpu(), **kw)
    ref.backward(do.double())
    errs = {}
    for name, x, r in [("o", o, ref), *zip(("dq", "dk", "dv"), grads, (t.grad for t in ref_in))]:
        nan = int(torch.isnan(x).sum())
        err = float((x.double() - r.detach()).norm() / r.detach().norm().clamp_min(1e-30))
        errs[name] = {"rel": err, "nan": nan}
    tol = {torch.bfloat16: 1e-2, torch.float16: 3e-3, torch.float32: 2e-5}[dtype]
    ok = all(e["nan"] == 0 and e["rel"] < tol for e in errs.values())
    if weight == "softmax":
        ok = ok and not bool(torch.isnan(lse).any())
    if case.get("path"):  # the path asked for must be the one that ran
        ok = ok and (("block_bwd" in kernels) == (case["path"] == "local"))
    return {"errs": errs, "ok": ok, "tol": tol, "kernels": kernels}


def warm_jobs(only: str):
    if only == "block":
        return block_warm_jobs()
    jobs = block_warm_jobs() + [{"warm": kind, "cfg": None, "L": L} for kind in KINDS for L in (512, 2048)]
    for kind, (fv, bv) in SWEEPS.items():
        jobs += [{"warm": kind, "cfg": ("fwd", n), "L": 512} for n in fv]
        jobs += [{"warm": kind, "cfg": ("bwd", n), "L": 512} for n in bv]
    return jobs


def block_warm_jobs():
    jobs = [{"warm": "block64", "cfg": ("path", p), "L": 512} for p in ("generic", "local")]
    jobs += [{"warm": "block64", "cfg": ("local_fwd", n), "L": 512} for n in BLOCK_LOCAL_FWD_SWEEP]
    jobs += [{"warm": "block64", "cfg": ("local_bwd", n), "L": 512} for n in BLOCK_LOCAL_BWD_SWEEP]
    return jobs


def _block_flash(which, name) -> FlashOptions:
    if which == "path":
        return FlashOptions(block_local=name == "local")
    if which == "local_fwd":
        return FlashOptions(block_fwd=BLOCK_TILES[name])
    return FlashOptions(block_bwd=BLOCK_TILES[name])


def table_cfg(args, kw):
    """The config the core's table picks for this problem (forward's view)."""
    return TT.config(args[0], int(args[6]), kw["block"], kw["causal"])


def resources(launched: dict):
    """Registers, spills, shared memory and the loads' pipelining (``compile_check.pipelined``)
    of each kernel as this machine's Triton compiled it."""
    from kernels.flash.compile_check import pipelined

    out = {}
    for name, k in launched.items():
        try:
            out[name] = {"regs": k.n_regs, "spills": k.n_spills, "smem": k.metadata.shared,
                         "loads": pipelined(k.asm.get("ttgir", ""))}
        except Exception as e:  # noqa: BLE001
            out[name] = repr(e)[:80]
    return out


def run_warm(job):
    """Compile (into Triton's disk cache) what phase 2 will time: lengths up to job["L"]."""
    args, do, kw = problem(job["warm"], [job["L"], 5, 129])
    flash = FlashOptions()
    if job["cfg"] and job["cfg"][0] in ("path", "local_fwd", "local_bwd"):
        flash = _block_flash(*job["cfg"])
    elif job["cfg"]:
        base = table_cfg(args, kw)
        flash = FlashOptions(tiles=(fwd_cfg if job["cfg"][0] == "fwd" else bwd_cfg)(job["cfg"][1], base))
    launched = {}
    o, lse = attention_fwd(*args, **kw, flash=flash, launched=launched)
    attention_bwd(do, *args[:3], o, lse, *args[3:], **kw, flash=flash, launched=launched)
    _sync()
    return {"ok": True, "res": resources(launched)}


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def all_jobs(only: str):
    cases = block_check_cases() + ([] if only == "block" else check_cases())
    return [{"check": c} for c in cases] + warm_jobs(only)


def worker(i, n, only: str):
    res = []
    for j, job in enumerate(all_jobs(only)):
        if j % n != i:
            continue
        t = time.time()
        try:
            r = run_check(job["check"]) if "check" in job else run_warm(job)
        except Exception as e:  # noqa: BLE001
            r = {"ok": False, "error": f"{type(e).__name__}: {str(e)[-1500:]}"}
        r.update(job=_jsonable(job), t=round(time.time() - t, 1))
        res.append(r)
        with open(f"{WORK}/worker_{i}.json", "w") as f:
            json.dump(res, f)


def _jsonable(job):
    return json.loads(json.dumps(job, default=str))


def _child(opts, *extra: str) -> list[str]:
    """The command line of a worker or timing process: this run's clock, budget and scope."""
    return [sys.executable, "-m", "kernels.flash.gpu_check", *extra, "--t0", str(opts.t0),
            "--budget-s", str(opts.budget_s), "--only", opts.only]


def phase1(opts):
    n_workers = opts.workers
    procs = [subprocess.Popen(_child(opts, "--worker", str(i), str(n_workers))) for i in range(n_workers)]
    deadline = opts.t0 + 105
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.time(), 1))
        except subprocess.TimeoutExpired:
            p.kill()
    res = []
    for i in range(n_workers):
        try:
            res += json.load(open(f"{WORK}/worker_{i}.json"))
        except Exception:  # noqa: BLE001
            pass
    return res


# ---- phase 2: timing -------------------------------------------------------------------------------
def bench(fn):
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def time_core(kind, args, do, kw, flash=FlashOptions(), fwd=True):
    o, lse = attention_fwd(*args, **kw, flash=flash)
    tf = bench(lambda: attention_fwd(*args, **kw, flash=flash)) if fwd else None
    tb = bench(lambda: attention_bwd(do, *args[:3], o, lse, *args[3:], **kw, flash=flash))
    return tf, tb


def time_sdpa(qs, ks, causal):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device=DEVICE).manual_seed(1)
    mk = lambda s: torch.randn(*s, device=DEVICE, dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v = mk(qs).requires_grad_(), mk(ks).requires_grad_(), mk(ks).requires_grad_()
    do = mk(qs)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        tf = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        tb = bench(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
    return tf, tb


def _left(opts):
    return opts.budget_s - (time.time() - opts.t0)


def _record(name, rows):
    with open(f"{WORK}/time_{name}.json", "w") as f:
        json.dump(rows, f, default=str)


def time_kinds(group, opts):
    """Phase 2 in a subprocess per group (a fault kills one group, not the run)."""
    rows = []
    for L in LS:
        lens = rand_lens(B, L, seed=L)
        for kind in GROUPS[group]:
            if _left(opts) < 5:
                return
            args, do, kw = problem(kind, lens)
            p = pairs(kind, lens)
            base = table_cfg(args, kw)
            try:
                tf, tb = time_core(kind, args, do, kw)
                rows.append(dict(kind=kind, L=L, fwd_ms=tf, bwd_ms=tb,
                                 fwd_tflops=4 * H * D * p / tf / 1e9,
                                 bwd_tflops=8 * H * D * p / tb / 1e9, table=str(base)))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(kind=kind, L=L, error=f"{type(e).__name__}: {str(e)[-300:]}"))
            _record(group, rows)
            fv, bv = SWEEPS.get(kind, ([], []))
            for which, name in [("fwd", n) for n in fv] + [("bwd", n) for n in bv]:
                if _left(opts) < 5:
                    return
                try:
                    if which == "fwd":
                        flash = FlashOptions(tiles=fwd_cfg(name, base))
                        t = bench(lambda: attention_fwd(*args, **kw, flash=flash))
                        fl = 4 * H * D * p / t / 1e9
                    else:
                        t = time_core(kind, args, do, kw, FlashOptions(tiles=bwd_cfg(name, base)), fwd=False)[1]
                        fl = 8 * H * D * p / t / 1e9
                    rows.append(dict(sweep=True, kind=kind, L=L, cfg=name, ms=t, tflops=fl))
                except Exception as e:  # noqa: BLE001
                    rows.append(dict(sweep=True, kind=kind, L=L, cfg=name, error=str(e)[-200:]))
                _record(group, rows)


def time_block(group, opts):
    """Block-64 fwd/bwd at the benchmark shape: the FA2 kernels (switch off) and the
    block-local kernels (table tiles, then the sweep), side by side in one process; at L=512
    also how far the two paths' outputs and gradients are apart (bf16)."""
    rows = []
    for L in LS:
        lens = rand_lens(B, L, seed=L)
        if _left(opts) < 5:
            return
        args, do, kw = problem("block64", lens)
        p = pairs("block64", lens)
        runs = [("generic", FlashOptions(block_local=False), True), ("local", FlashOptions(), True)]
        runs += [(f"local fwd {n}", FlashOptions(block_fwd=BLOCK_TILES[n]), "fwd") for n in BLOCK_LOCAL_FWD_SWEEP]
        runs += [(f"local bwd {n}", FlashOptions(block_bwd=BLOCK_TILES[n]), "bwd") for n in BLOCK_LOCAL_BWD_SWEEP]
        for name, flash, which in runs:
            if _left(opts) < 5:
                return
            try:
                o, lse = attention_fwd(*args, **kw, flash=flash)
                tf = bench(lambda: attention_fwd(*args, **kw, flash=flash)) if which in (True, "fwd") else None
                tb = bench(lambda: attention_bwd(do, *args[:3], o, lse, *args[3:], **kw, flash=flash)) \
                    if which in (True, "bwd") else None
                rows.append(dict(block=True, path=name, L=L, fwd_ms=tf, bwd_ms=tb,
                                 fwd_tflops=tf and 4 * H * D * p / tf / 1e9,
                                 bwd_tflops=tb and 8 * H * D * p / tb / 1e9))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(block=True, path=name, L=L, error=f"{type(e).__name__}: "
                                 f"{str(e)[-300:]}"))
            _record(group, rows)
        if L == 512:
            outs = {}
            for name, on in (("generic", False), ("local", True)):
                flash = FlashOptions(block_local=on)
                o, lse = attention_fwd(*args, **kw, flash=flash)
                outs[name] = (o, *attention_bwd(do, *args[:3], o, lse, *args[3:], **kw, flash=flash))
            rel = {n: float((a.float() - b.float()).norm() / b.float().norm())
                   for n, a, b in zip(("o", "dq", "dk", "dv"), outs["local"], outs["generic"])}
            rows.append(dict(block=True, path="local vs generic (rel. diff)", L=L, rel=rel))
            _record(group, rows)
            del outs
        del args, do
        torch.cuda.empty_cache()


def time_baselines(group, opts):
    rows = []
    for L in LS:
        lens = rand_lens(B, L, seed=L)
        if _left(opts) < 5:
            return
        q_off = offsets(lens)
        T = sum(lens)
        wl = bench(lambda: work(q_off, q_off, 128, L, T, reverse=False))
        rows.append(dict(name="work_list", L=L, ms=wl))
        nb = -(-L // 64)
        for name, qs, ks, causal, kind in [
            ("sdpa_causal", (B, H, L, D), (B, H, L, D), True, "jfa_causal"),
            ("sdpa_full", (B, H, L, D), (B, H, L, D), False, "gdpa_silu"),
            ("sdpa_densekv", (B, H, L, D), (B, H, 256, D), False, "densekv_softmax"),
            ("sdpa_blocks", (B * nb, H, 64, D), (B * nb, H, 64, D), False, "block64"),
        ]:
            if _left(opts) < 5:
                return
            try:
                tf, tb = time_sdpa(qs, ks, causal)
                rows.append(dict(name=name, L=L, fwd_ms=tf, bwd_ms=tb,
                                 fwd_tflops_valid=4 * H * D * pairs(kind, lens) / tf / 1e9,
                                 bwd_tflops_valid=8 * H * D * pairs(kind, lens) / tb / 1e9))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(name=name, L=L, error=str(e)[-300:]))
                _record(group, rows)
                raise
            _record(group, rows)
            torch.cuda.empty_cache()


GROUPS = {"gdpa": ["gdpa_silu"], "jfa": ["jfa_causal"],
          "rest": ["densekv_softmax", "densekv_silu"]}  # block64: time_block


def phase2(opts):
    out = {}
    groups = ["block"] if opts.only == "block" else [*GROUPS, "block", *(["sdpa"] if opts.sdpa else [])]
    for group in groups:
        if _left(opts) < 15:
            break
        p = subprocess.run(_child(opts, "--time", group), timeout=max(_left(opts) + 10, 1))
        try:
            out[group] = json.load(open(f"{WORK}/time_{group}.json"))
        except Exception:  # noqa: BLE001
            out[group] = []
        if p.returncode:
            out[group].append(dict(error=f"group {group} exited with {p.returncode}"))
    return out


def report(checks, timing):
    print("\n== resources (regs / spills / smem) of the warm-up launches")
    for r in checks:
        if "warm" in r["job"] and r.get("res"):
            print(r["job"]["warm"], r["job"]["cfg"], r["res"])
    print("\n== correctness (rel. error vs float64; NaN count)")
    for r in checks:
        if "check" in r["job"]:
            job = {k: v for k, v in r["job"]["check"].items() if k not in ("q", "kv")}
            if "q" in r["job"]["check"] or "kv" in r["job"]["check"]:
                job["lens"] = "custom"
            if "errs" in r:
                e = " ".join(f"{k}={v['rel']:.1e}" + (f"(nan{v['nan']})" if v["nan"] else "")
                             for k, v in r["errs"].items())
            else:
                e = ""
            print(("OK  " if r["ok"] else "FAIL"), job, e, f"{r['t']}s")
    fails = [r for r in checks if not r["ok"]]
    print(f"checks: {sum(r['ok'] for r in checks)} ok, {len(fails)} failed")
    for r in fails:
        print("  FAILED", r["job"], r.get("error", "")[-700:])
    print("\n== timing (TFLOP/s count valid pairs only; ms)")
    for group, rows in timing.items():
        for r in rows:
            if "error" in r:
                print(group, r)
            elif r.get("block") and "rel" in r:
                print(f"block64 L={r['L']:5d} {r['path']}: "
                      + " ".join(f"{k}={v:.1e}" for k, v in r["rel"].items()))
            elif r.get("block"):
                f = (f"fwd {r['fwd_tflops']:6.0f} ({r['fwd_ms']:8.3f} ms)" if r["fwd_ms"]
                     else " " * 25)
                b = f"bwd {r['bwd_tflops']:6.0f} ({r['bwd_ms']:8.3f} ms)" if r["bwd_ms"] else ""
                print(f"block64 L={r['L']:5d} {r['path']:22s} {f}  {b}")
            elif r.get("sweep"):
                print(f"sweep {r['kind']:16s} L={r['L']:5d} {r['cfg']:20s} {r['tflops']:6.0f}"
                      f" ({r['ms']:8.3f} ms)")
            elif "name" in r and r["name"] == "work_list":
                print(f"work list (plan) L={r['L']:5d} {r['ms'] * 1e3:.0f} us")
            elif "name" in r:
                print(f"{r['name']:16s} L={r['L']:5d} fwd {r['fwd_tflops_valid']:6.0f} "
                      f"({r['fwd_ms']:8.3f} ms)  bwd {r['bwd_tflops_valid']:6.0f} ({r['bwd_ms']:8.3f} ms)")
            else:
                print(f"{r['kind']:16s} L={r['L']:5d} fwd {r['fwd_tflops']:6.0f} "
                      f"({r['fwd_ms']:8.3f} ms)  bwd {r['bwd_tflops']:6.0f} ({r['bwd_ms']:8.3f} ms)")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", choices=["", "block"], help="block: the block-local part only")
    p.add_argument("--out", default=os.environ.get("OUT") or "/tmp/flash_check", help="folder for flash_check.json")
    p.add_argument("--workers", type=int, default=15, help="phase 1 processes")
    p.add_argument("--budget-s", type=float, default=215.0, help="seconds for the whole run, from --t0")
    p.add_argument("--sdpa", action="store_true", help="also time padded SDPA (the baselines)")
    p.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)  # the parent's start time
    p.add_argument("--worker", nargs=2, type=int, metavar=("I", "N"), help=argparse.SUPPRESS)
    p.add_argument("--time", metavar="GROUP", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    opts.t0 = time.time() if opts.t0 is None else opts.t0
    return opts


def main(argv=None):
    opts = parse(argv)
    if opts.worker:
        return worker(*opts.worker, opts.only)
    if opts.time:
        return {"sdpa": time_baselines, "block": time_block}.get(opts.time, time_kinds)(opts.time, opts)
    os.makedirs(opts.out, exist_ok=True)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    import triton

    info = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    print(info, flush=True)
    checks = phase1(opts)
    print(f"phase 1 done at {time.time() - opts.t0:.0f} s", flush=True)
    timing = phase2(opts)
    json.dump(dict(info=info, checks=checks, timing=timing),
              open(f"{opts.out}/flash_check.json", "w"), indent=1, default=str)
    report(checks, timing)
    print(f"total {time.time() - opts.t0:.0f} s")


if __name__ == "__main__":
    main()
