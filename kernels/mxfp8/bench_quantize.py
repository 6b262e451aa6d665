"""One GPU call: check every MXFP8 quantize variant bit-exact, then time them against the
2026-11-30 kernel and a torch copy of the same bytes (issue 6: quantize >= 3.4 TB/s on one H200).

    python3 -m kernels.mxfp8.bench_quantize --out $OUT [--budget-s 110]   # GPU, about 60-90 s
    python3 -m kernels.mxfp8.bench_quantize --smoke --out /tmp/q            # CPU, Triton interpreter
    env -u TRITON_INTERPRET python3 -m kernels.mxfp8.bench_quantize --compile-only
                                     # CPU: compile every variant for sm_90, SASS counts, registers

1. Check: every variant of ``quantize.VARIANTS`` on every layout it serves (dim=0/1 of row-major
   bf16), E4M3, hardware cast, against ``quantize_ref`` at odd shapes (masked paths), NaN/Inf and
   all-zero blocks, magnitudes 1e-30..1e30, and a 4096² (unmasked paths); the defaults also with
   E5M2, fp32 input and the soft cast. Before each call, buffers of the output sizes are filled
   with 0xAA and freed (the caching allocator most likely reuses them for the outputs).
2. Time: ``triton.testing.do_bench`` medians at 16384², 8192², 65536×2048 bf16, for dim=1 and
   dim=0, every variant of the layout plus the old kernel (``tile_*``), and ``y.copy_(x)`` of the
   same tensor (read 2 B + write 2 B per element) as the ceiling in the same run. Bytes counted
   for quantize: 2 read + 1 written + 1/32 scale per element.

``--budget-s``: steps stop being started once that much wall time has gone (the JSON keeps what
finished, ``skipped`` lists the rest); the JSON is rewritten (temp + rename) after every step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from kernels.common.bench import Clock, run_steps, sm90_report, timer, write_json
from kernels.mxfp8.quantize import DEFAULT, FAMILY, VARIANTS, quantize
from kernels.mxfp8.reference import quantize_ref

SHAPES = [(16384, 16384), (8192, 8192), (65536, 2048)]
KIND_OF_DIM = {1: "rows", 0: "cols"}  # for a row-major x


def variants_for(kind: str, only: set[str] | None = None) -> list[str]:
    """Variants that serve a layout: its own family, then the old kernel; ``only`` (--variants):
    just these (and the layout's default)."""
    own = [v for v, c in VARIANTS.items() if FAMILY[c["kernel"]] == kind]
    vs = own + [v for v, c in VARIANTS.items() if c["kernel"] == "tile"]
    return [v for v in vs if only is None or v in only or v == DEFAULT[kind]]


def nbytes(shape) -> float:
    n = shape[0] * shape[1]
    return n * 2 + n * 1 + n / 32


def _input(shape, g, dev, weird=True):
    x = torch.randn(shape, generator=g).to(dev)
    if weird:
        x = x * torch.logspace(-30, 30, shape[1]).to(dev)[None, :]
        x[: min(3, shape[0]), :32] = 0  # all-zero blocks
        if shape[0] > 9 and shape[1] > 40:
            x[5, 7] = float("nan")
            x[9, 40 % shape[1]] = float("inf")
            x[shape[0] - 1, shape[1] - 1] = float("-inf")
    return x.to(torch.bfloat16)


def _poison(x, dim):
    """Fill and free buffers of the output sizes, so that the caching allocator most likely hands
    them to the next ``quantize`` (0xAA, not a previous variant's correct output, where a kernel
    fails to write)."""
    rows, n = x.shape[::-1] if dim == 0 else x.shape
    n32 = -(-n // 32) * 32
    torch.full((rows, n32), 0xAA, dtype=torch.uint8, device=x.device)
    torch.full((rows, n32 // 32), 0xAA, dtype=torch.uint8, device=x.device)


def _same(x, dim, elem, variant, soft):
    _poison(x, dim)
    d, s = quantize(x, dim, elem, variant=variant, soft_cast=soft)
    dr, sr = quantize_ref(x, dim, elem)
    return bool(torch.equal(s.cpu(), sr.cpu()) and torch.equal(d.view(torch.uint8).cpu(), dr.view(torch.uint8).cpu()))


def check(res, dev, odd, big, deadline, only, say):
    """Bit-exactness of every variant (E4M3, hardware cast) at ``odd`` (masked paths, NaN/Inf,
    zero blocks) and ``big`` (unmasked); the defaults also with E5M2, the soft cast and fp32
    input. Stops at ``deadline`` (the rest is listed as unchecked). Returns the set of variant
    names that failed anywhere."""
    g = torch.Generator().manual_seed(0)
    rows = []
    unchecked = []
    for shape, x in [(odd, _input(odd, g, dev)), (big, _input(big, g, dev, weird=False))]:
        for dim in (1, 0):
            kind = KIND_OF_DIM[dim]
            cases = [(v, "e4m3", None, torch.bfloat16) for v in variants_for(kind, only)]
            cases += [(DEFAULT[kind], "e5m2", None, torch.bfloat16), (DEFAULT[kind], "e4m3", True, torch.bfloat16),
                      (DEFAULT[kind], "e4m3", None, torch.float32)]
            for v, elem, soft, dtype in cases:
                case = {"shape": list(shape), "dim": dim, "variant": v, "elem": elem, "soft_cast": bool(soft),
                        "dtype": str(dtype).replace("torch.", "")}
                if time.time() > deadline:
                    unchecked.append(case)
                    continue
                try:
                    case["bit_exact"] = _same(x.to(dtype), dim, elem, v, soft)
                except Exception as e:  # noqa: BLE001
                    case["bit_exact"], case["error"] = False, repr(e)[:300]
                rows.append(case)
    res["check"] = rows
    res["unchecked"] = unchecked
    res["all_bit_exact"] = all(r["bit_exact"] for r in rows) and not unchecked
    bad = [r for r in rows if not r["bit_exact"]]
    say(f"check: {len(rows)} cases, {len(bad)} not bit-exact, {len(unchecked)} unchecked (budget)"
        + (f"; FAILED: {bad}" if bad else ""))
    res["failed_variants"] = sorted({r["variant"] for r in bad})
    return set(res["failed_variants"])


def time_shape(res, shape, dev, deadline, only):
    med = timer(dev)
    x = torch.randn(shape, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    out = {"shape": list(shape), "bytes": nbytes(shape)}
    t = med(lambda: y.copy_(x))
    out["copy_s"] = t
    out["copy_TBps"] = 4 * x.numel() / t / 1e12
    del y
    for dim in (1, 0):
        rows = []
        checked = {r["variant"] for r in res.get("check", []) if r["dim"] == dim}
        failed = {r["variant"] for r in res.get("check", []) if r["dim"] == dim and not r["bit_exact"]}
        for v in variants_for(KIND_OF_DIM[dim], only):
            if time.time() > deadline:
                rows.append({"variant": v, "skipped": "budget"})
                continue
            if v in failed:
                rows.append({"variant": v, "skipped": "not bit-exact"})
                continue
            try:
                t = med(lambda: quantize(x, dim, variant=v))
                rows.append({"variant": v, "time_s": t, "TBps": out["bytes"] / t / 1e12,
                             "of_copy": out["bytes"] / t / 1e12 / out["copy_TBps"], "checked": v in checked})
            except Exception as e:  # noqa: BLE001
                rows.append({"variant": v, "error": repr(e)[:300]})
        out[f"dim{dim}"] = rows
    res.setdefault("timing", []).append(out)
    return out


def table(res) -> str:
    lines = ["| shape | dim | variant | TB/s | of copy | ms |", "|---|---|---|---|---|---|"]
    for t in res.get("timing", []):
        s = "x".join(map(str, t["shape"]))
        lines.append(f"| {s} | - | torch copy (4 B/elem) | {t['copy_TBps']:.3f} | 1.00 | {t['copy_s'] * 1e3:.3f} |")
        for dim in (1, 0):
            rows = [r for r in t.get(f"dim{dim}", []) if "TBps" in r]
            best = max((r["TBps"] for r in rows), default=None)
            for r in sorted(rows, key=lambda r: -r["TBps"]):
                mark = " **best**" if r["TBps"] == best else ""
                mark += " (default)" if r["variant"] == DEFAULT[KIND_OF_DIM[dim]] else ""
                lines.append(f"| {s} | {dim} | {r['variant']}{mark} | {r['TBps']:.3f} | {r['of_copy']:.2f} | "
                             f"{r['time_s'] * 1e3:.3f} |")
            for r in t.get(f"dim{dim}", []):
                if "TBps" not in r:
                    lines.append(f"| {s} | {dim} | {r['variant']} | {r.get('error', r.get('skipped'))} | | |")
    return "\n".join(lines)


def compile_only() -> int:
    """Compile every variant for sm_90 (no GPU), print registers, spills, shared memory and SASS
    instructions per element (bf16 input, E4M3, hardware cast, the unmasked specialisation)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile-only: unset TRITON_INTERPRET (the interpreter replaces the compiler)")
        return 2
    from kernels.mxfp8 import quantize as Q

    fmt = dict(EMAX=8, E5M2=False, MBITS=3, EMIN=-6, BIAS=7, SUB_UP=512.0)
    fails = 0
    todo = [(v, c, None) for v, c in VARIANTS.items() if c["kernel"] != "tile"]
    todo += [(v, c, d) for d in (1, 0) for v, c in VARIANTS.items() if c["kernel"] == "tile"]
    for v, c, tile_dim in todo:
        k, w = c["kernel"], c["num_warps"]
        cast = 1 if c.get("cast", "asm") == "asm" else 0
        ints16 = ()
        ones = ()
        if k == "tile":  # the old kernel: dim=1 (s_col == 1) and dim=0 (s_row == 1) of a row-major x
            fn, consts, elems = Q._quantize_kernel, dict(fmt, SOFT_CAST=False, BR=c["BR"], G=c["G"]), c["BR"] * c["G"] * 32
            ints16 = ("rows", "n", "n32", "s_row" if tile_dim == 1 else "s_col")
            ones = ("s_col",) if tile_dim == 1 else ("s_row",)
            v = f"{v} (dim={tile_dim})"
        elif k in ("rows", "rows4"):
            fn = Q._quantize_rows_kernel if k == "rows" else Q._quantize_rows4_kernel
            consts = dict(fmt, NB=c["NB"], FLAT=True, **(dict(SOFT_CAST=False) if k == "rows" else dict(CAST=cast, EVEN=True)))
            elems, ints16 = c["NB"] * 32, ("nblocks", "nb", "n", "s_row")
        else:
            fn = Q._quantize_cols_kernel if k == "cols" else Q._quantize_cols4_kernel
            consts = dict(fmt, G=c["G"], BC=c["BC"], **(dict(SOFT_CAST=False) if k == "cols" else
                                                         dict(CAST=cast, VEC=c["VEC"], EVEN=True)))
            elems, ints16 = c["G"] * 32 * c["BC"], ("K", "C", "n32", "s_k")
        sig, attrs = {}, {}
        for i, name in enumerate(fn.arg_names):
            if name in consts:
                sig[name] = "constexpr"
            elif name in ones:
                sig[name], consts[name] = "constexpr", 1
            elif name.endswith("_ptr"):
                sig[name] = {"x_ptr": "*bf16", "q_ptr": "*i32" if k in ("rows4", "cols4") else "*u8"}.get(name, "*u8")
            else:
                sig[name] = "i32"
            if name.endswith("_ptr") or name in ints16:
                attrs[(i,)] = [["tt.divisibility", 16]]
        fails += not sm90_report(v, fn, sig, consts, attrs, w, elems, f"/tmp/bench_quantize_{v.split()[0]}")
    print(f"{fails} failed")
    return 1 if fails else 0


def main(argv=None) -> int:
    clock = Clock()  # the budget counts from this call, not from the import (the tests import early)
    say = clock.say
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--budget-s", type=float, default=110.0, help="start no step after this much wall time")
    p.add_argument("--smoke", action="store_true", help="CPU / interpreter: tiny shapes, no do_bench")
    p.add_argument("--compile-only", action="store_true", help="compile every variant for sm_90 (no GPU) and stop")
    p.add_argument("--variants", default="", help="comma-separated VARIANTS keys to bench (default: all)")
    a = p.parse_args(argv)
    only = set(a.variants.split(",")) if a.variants else None
    if only:
        unknown = only - set(VARIANTS)
        if unknown:
            print(f"bench_quantize: --variants {','.join(sorted(unknown))} unknown; use keys of quantize.VARIANTS")
            return 2
    if a.compile_only:
        return compile_only()
    dev = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    if dev == "cpu" and not a.smoke:
        print("bench_quantize: no CUDA device; use --smoke (interpreter) or --compile-only")
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = clock.start + a.budget_s
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)",
           "default": DEFAULT, "variants": VARIANTS, "budget_s": a.budget_s, "skipped": []}
    try:
        import triton

        res["triton"] = triton.__version__
    except ImportError:
        pass
    say({k: res[k] for k in ("torch", "device")})
    if a.smoke:
        odd, big, shapes = (12, 40), (32, 64), [(32, 64)]
    else:
        odd, big, shapes = (130, 1000), (4096, 4096), SHAPES
    check_deadline = clock.start + 0.55 * a.budget_s  # the timings keep the rest
    steps = [("check", lambda: check(res, dev, odd, big, check_deadline, only, say))]
    steps += [(f"time {s}", (lambda s=s: say(_summary(time_shape(res, s, dev, deadline, only))))) for s in shapes]
    run_steps(steps, res, out, "bench_quantize", say, deadline=deadline)
    res["wall_s"] = clock.elapsed()
    write_json(out, "bench_quantize", res)
    md = table(res)
    (out / "bench_quantize.md").write_text(md + "\n")
    print(md, flush=True)
    say("done")
    return 0 if res.get("all_bit_exact") and not res.get("errors") else 1


def _summary(t) -> str:
    s = f"{t['shape']}: copy {t['copy_TBps']:.3f} TB/s"
    for dim in (1, 0):
        rows = [r for r in t[f"dim{dim}"] if "TBps" in r]
        if rows:
            b = max(rows, key=lambda r: r["TBps"])
            old = max((r["TBps"] for r in rows if r["variant"].startswith("tile")), default=float("nan"))
            s += f"; dim={dim} best {b['TBps']:.3f} ({b['variant']}), old {old:.3f}"
    return s


if __name__ == "__main__":
    sys.exit(main())
