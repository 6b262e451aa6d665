"""One GPU call: the fused bias + GELU kernels (``bias_gelu.py``) against what Inductor runs now,
checked against the fp32 reference, then timed side by side.

    python3 -m kernels.ffn.bench_bias_gelu --out $OUT     # one H200, under a minute
    env -u TRITON_INTERPRET python3 -m kernels.ffn.bench_bias_gelu --compile-only
                                  # CPU: compile every config for sm_90, registers, spills, SASS

Shape: the executor's sequence FFN, ``h0, dA [196608, 2048]`` bf16, ``b [2048]`` fp32 (autocast
keeps the Parameter in fp32). Bytes per element (E = T·H), each input read once and each output
written once, the least the function must move:

1. Check every config of ``FWD_CONFIGS`` / ``BWD_CONFIGS``: ``a`` and ``dH`` against the fp32
   reference rounded to bf16 (max abs diff; counts beyond 1 bf16 ulp, and beyond 1 ulp + 1e-6,
   which must be 0), ``db`` against the reference's fp32 column sums (bound: 1e-5 of the column's
   ``Σ|dH|``).
2. Time (``triton.testing.do_bench`` medians, L2 flushed; copy, ours, then Inductor, as ``--budget-s``
   skips from the end):
   - ``copy``: ``torch.empty_like(h0).copy_(h0)``, 4 B/elem, the copy-rate ceiling;
   - Inductor forward ``gelu(h0 + b)`` (bias cast to bf16 as autocast's linear does) and
     ``gelu(h)`` alone (the executor has the bias in the GEMM epilogue): 4 B/elem;
   - Inductor backward as the executor runs it: ``dh = gelu_backward(dA, h)``, the recompute
     ``a = gelu(h)`` for ffn2's weight gradient, and ``dh.sum(0)``: 8 B/elem (reads h, dA; writes
     dh, a; a separate column sum reads dh once more, not counted); and without the recompute,
     6 B/elem;
   - ours: ``bias_gelu_fwd`` per config (4 B/elem) and ``bias_gelu_bwd`` per config (6 B/elem plus
     the fp32 partials written and summed), each the whole wrapper call.
3. ``bias_gelu`` under ``torch.compile`` (Inductor, ``fullgraph=True``), forward and backward,
   equal to the eager op (the custom op traces on CUDA), if the time budget allows.

The JSON (``bench_bias_gelu.json``) is rewritten after every step; exit 1 if a check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from kernels.common.bench import Clock, run_steps, sm90_report
from kernels.ffn import bias_gelu as bg


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    e = torch.frexp(x.float().abs().clamp_min(2.0**-126))[1]
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), e - 8)


def _vs_bf16(got: torch.Tensor, ref: torch.Tensor) -> dict:
    """``got`` against the fp32 reference ``ref`` rounded to ``got``'s dtype. Tolerance: 1 bf16 ulp
    plus 1e-6 absolute (for x < -4, ``1 + erf(x/√2)`` cancels in fp32, in torch as here)."""
    rr = ref.to(got.dtype)
    err = (got.float() - rr.float()).abs()
    ulp = _bf16_ulp(rr)
    return {"max_abs_diff": float(err.max()), "beyond_1ulp": int((err > ulp).sum()),
            "beyond_tol": int((err > ulp + 1e-6).sum()), "max_abs_diff_vs_fp32": float((got.float() - ref).abs().max())}


def check(res, h0, b, da, say) -> bool:
    a_ref = bg.bias_gelu_fwd_ref(h0.float(), b)  # fp32 in, fp32 out: the unrounded reference
    rows = []
    for name in bg.FWD_CONFIGS:
        row = {"kind": "fwd", "config": name, **_vs_bf16(bg.bias_gelu_fwd(h0, b, config=name), a_ref)}
        row["ok"] = row["beyond_tol"] == 0
        rows.append(row)
    del a_ref
    dh_ref, db_ref = bg.bias_gelu_bwd_ref(da.float(), h0, b)  # fp32 dA: dH unrounded
    db_bound = 1e-5 * dh_ref.abs().sum(0) + 1e-6
    for name in bg.BWD_CONFIGS:
        dh, db = bg.bias_gelu_bwd(da, h0, b, config=name)
        row = {"kind": "bwd", "config": name, **_vs_bf16(dh, dh_ref)}
        db_err = (db - db_ref).abs()
        row.update(db_max_abs_diff=float(db_err.max()), db_max_over_bound=float((db_err / db_bound).max()))
        row["ok"] = row["beyond_tol"] == 0 and row["db_max_over_bound"] <= 1 and db.dtype == b.dtype
        rows.append(row)
        del dh, db
    res["check"] = rows
    res["all_ok"] = all(r["ok"] for r in rows)
    bad = [r for r in rows if not r["ok"]]
    say(f"check: {len(rows)} cases, {len(bad)} not ok" + (f": {bad}" if bad else "")
        + f"; worst dh/a diff {max(r['max_abs_diff'] for r in rows):.3g}")
    return res["all_ok"]


def timing(res, h0, b, da, deadline: float, say) -> None:
    from triton.testing import do_bench

    E, H = h0.numel(), h0.shape[1]
    b16 = b.to(h0.dtype)
    h = (h0 + b16).contiguous()  # Inductor's input: the GEMM epilogue already added the bias

    def ind_bwd(da, h):
        dh = torch.ops.aten.gelu_backward(da, h)
        return dh, F.gelu(h), dh.sum(0)

    def ind_bwd_no_recompute(da, h):
        dh = torch.ops.aten.gelu_backward(da, h)
        return dh, dh.sum(0)

    fwd_bias = torch.compile(lambda h0, b: F.gelu(h0 + b), fullgraph=True, dynamic=False)
    fwd = torch.compile(lambda h: F.gelu(h), fullgraph=True, dynamic=False)
    bwd = torch.compile(ind_bwd, fullgraph=True, dynamic=False)
    bwd_nr = torch.compile(ind_bwd_no_recompute, fullgraph=True, dynamic=False)
    # (name, bytes, fn), most wanted first: the budget skips from the end
    entries = [("copy", 4 * E, lambda: torch.empty_like(h0).copy_(h0))]
    entries += [(f"ours fwd {n}", 4 * E, lambda n=n: bg.bias_gelu_fwd(h0, b, config=n)) for n in bg.FWD_CONFIGS]
    for n, c in bg.BWD_CONFIGS.items():
        parts = -(-h0.shape[0] // (c["BLOCK_T"] * c["ROWS_PER_PROGRAM"]))
        entries.append((f"ours bwd {n}", 6 * E + 8 * parts * H, lambda n=n: bg.bias_gelu_bwd(da, h0, b, config=n)))
    entries += [
        ("inductor fwd gelu(h)", 4 * E, lambda: fwd(h)),
        ("inductor bwd dh + recompute a + dh.sum(0)", 8 * E, lambda: bwd(da, h)),
        ("inductor fwd gelu(h0 + b)", 4 * E, lambda: fwd_bias(h0, b16)),
        ("inductor bwd dh + dh.sum(0)", 6 * E, lambda: bwd_nr(da, h)),
    ]
    rows = []
    res["timing"] = rows
    for name, nbytes, fn in entries:
        if time.time() > deadline:
            rows.append({"name": name, "skipped": "budget"})
            continue
        try:
            ms = do_bench(fn, warmup=10, rep=50, return_mode="median")
            rows.append({"name": name, "ms": ms, "bytes": nbytes, "GBps": nbytes / ms * 1e-6})
        except Exception:  # noqa: BLE001
            rows.append({"name": name, "error": traceback.format_exc()[-800:]})
        say(rows[-1])


def compiled_op(res, h0, b, da, deadline: float, say) -> None:
    """``bias_gelu`` in an Inductor graph, forward and backward, against the eager op."""
    if time.time() > deadline:
        res["compiled_op"] = {"skipped": "budget"}
        return

    def grads(fn):
        h, c = h0.detach().requires_grad_(), b.detach().requires_grad_()
        a = fn(h, c)
        a.backward(da)
        return a, h.grad, c.grad

    got = grads(torch.compile(bg.bias_gelu, fullgraph=True))
    ref = grads(bg.bias_gelu)
    res["compiled_op"] = {"equal": [bool(torch.equal(g, r)) for g, r in zip(got, ref, strict=True)]}
    say(f"compiled bias_gelu (a, dh0, db) equal to eager: {res['compiled_op']['equal']}")


def table(res) -> str:
    rows = [r for r in res.get("timing", []) if "ms" in r]
    if not rows:
        return "(no timing)"
    copy = next((r["ms"] for r in rows if r["name"] == "copy"), None)
    lines = ["| what | ms | GB/s | × copy time |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['ms']:.3f} | {r['GBps']:.0f} | {r['ms'] / copy:.2f} |" if copy else
                     f"| {r['name']} | {r['ms']:.3f} | {r['GBps']:.0f} | |")
    best = {k: min((r for r in rows if r["name"].startswith(f"ours {k} ")), key=lambda r: r["ms"], default=None)
            for k in ("fwd", "bwd")}
    now = {r["name"]: r["ms"] for r in rows}
    if all(best.values()) and "inductor fwd gelu(h)" in now and "inductor bwd dh + recompute a + dh.sum(0)" in now:
        before = now["inductor fwd gelu(h)"] + now["inductor bwd dh + recompute a + dh.sum(0)"]
        after = best["fwd"]["ms"] + best["bwd"]["ms"]
        lines.append(f"\nper layer: Inductor fwd gelu(h) + bwd {before:.3f} ms; {best['fwd']['name']} + "
                     f"{best['bwd']['name']} {after:.3f} ms")
    return "\n".join(lines)


def compile_only() -> int:
    """Every config compiled for sm_90 without a GPU (bf16 h0/dA/a/dH, fp32 b; H = 2048 known
    divisible by 16, as Triton specializes it at launch), with ``kernels.common.bench.sm90_report``'s
    registers, spills and SASS counts."""
    if bg._INTERPRETED:
        print("compile-only: unset TRITON_INTERPRET (the interpreter replaces the compiler)")
        return 2
    types = {"h_ptr": "*bf16", "a_ptr": "*bf16", "da_ptr": "*bf16", "dh_ptr": "*bf16", "b_ptr": "*fp32",
             "part_ptr": "*fp32", "T": "i32", "H": "i32"}
    ok = True
    for kind, table_, fn in (("fwd", bg.FWD_CONFIGS, bg._bias_gelu_fwd_kernel), ("bwd", bg.BWD_CONFIGS, bg._bias_gelu_bwd_kernel)):
        for name, cfg in table_.items():
            consts = {"FAST_ERF": True} | {k: v for k, v in cfg.items() if k != "num_warps"}  # bf16: fast erf
            sig = {arg: "constexpr" if arg in consts else types[arg] for arg in fn.arg_names}
            attrs = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(fn.arg_names)
                     if arg.endswith("_ptr") or arg == "H"}
            elems = cfg["BLOCK_T"] * cfg["BLOCK_H"]  # per tile (a backward program loops over tiles)
            ok &= sm90_report(f"{kind} {name}", fn, sig, consts, attrs, cfg["num_warps"], elems,
                              f"/tmp/bench_bias_gelu_{kind}_{name}")
    return 0 if ok else 1


def main(argv=None) -> int:
    clock = Clock()  # the budget counts from this call, not from the import (the tests import early)
    say = clock.say
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--T", type=int, default=196608)
    p.add_argument("--H", type=int, default=2048)
    p.add_argument("--budget-s", type=float, default=55.0, help="start no timing or step past this (s)")
    p.add_argument("--compile-only", action="store_true", help="compile every config for sm_90 (no GPU) and stop")
    a = p.parse_args(argv)
    if a.compile_only:
        return compile_only()
    if not torch.cuda.is_available():
        print("bench_bias_gelu: no CUDA device; run it on a GPU: python3 -m kernels.ffn.bench_bias_gelu --out $OUT")
        return 2
    if bg._INTERPRETED:
        print("bench_bias_gelu: TRITON_INTERPRET=1 is set; unset it to time the compiled kernels")
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = clock.start + a.budget_s
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "T": a.T, "H": a.H, "dtypes": {"h0": "bfloat16", "da": "bfloat16", "b": "float32"},
           "fwd_configs": bg.FWD_CONFIGS, "bwd_configs": bg.BWD_CONFIGS, "default": bg.DEFAULT}
    say({k: res[k] for k in ("device", "torch", "triton", "T", "H")})
    g = torch.Generator(device="cuda").manual_seed(0)
    h0 = torch.randn(a.T, a.H, device="cuda", generator=g).mul_(1.5).to(torch.bfloat16)
    da = torch.randn(a.T, a.H, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(a.H, device="cuda", generator=g).mul_(0.5)
    steps = [("check", lambda: check(res, h0, b, da, say)), ("time", lambda: timing(res, h0, b, da, deadline, say)),
             ("compiled_op", lambda: compiled_op(res, h0, b, da, deadline, say))]
    run_steps(steps, res, out, "bench_bias_gelu", say, after=torch.cuda.empty_cache)
    md = table(res)
    (out / "bench_bias_gelu.md").write_text(md + "\n")
    print(md, flush=True)
    say("done")
    return 0 if res.get("all_ok") and not res.get("errors") else 1


if __name__ == "__main__":
    sys.exit(main())
