"""One GPU call: the fused fake quantizers (``fake_quantize.py``) against the PyTorch chain they
replace in ``gdpa_mxfp8(triton=True)``, checked equal, then timed, at the GDPA shape.

    python3 -m kernels.mxfp8.bench_fake_quantize --out $OUT            # GPU, about 30-60 s
    python3 -m kernels.mxfp8.bench_fake_quantize --smoke --out /tmp/fq # CPU, Triton interpreter
    env -u TRITON_INTERPRET python3 -m kernels.mxfp8.bench_fake_quantize --compile-only
                                     # CPU: compile every variant for sm_90, SASS counts, registers

Shape: q, k, v ``[196608, 4, 128]`` bf16, ``offsets`` of 256 samples with lengths uniform in
[512, 1024] (seeded; redrawn until they fit, the rest of the rows is padding). Inputs: randn
times a per-column magnitude 1e-30..1e30, zero rows, one NaN and one Inf.

1. Check (``torch.equal``, NaN positions apart): every variant of ``LAST_VARIANTS`` on q against
   ``gdpa.fake_quantize_last_ref(q).to(bf16)``, every ``KEYS_VARIANTS`` on v against
   ``gdpa.fake_quantize_keys_ref(v, offsets)``; the defaults also with E5M2 and fp32 input.
2. Time (``triton.testing.do_bench`` medians): each variant, ``y.copy_(x)`` of the same tensor
   (the same bytes: read 2 B + write 2 B per element) as the ceiling, the old chain per tensor,
   and q+k+v together, old vs fused (what ``gdpa_mxfp8(triton=True)`` runs before the kernels).
3. ``gdpa_mxfp8(triton=True)`` forward at the shape (causal SiLU, ``max_len`` 1024), fused path.

The JSON (``bench_fake_quantize.json``) is rewritten after every step; exit 1 if any check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from kernels.common.bench import Clock, run_steps, sm90_report, timer
from kernels.mxfp8.fake_quantize import (
    DEFAULT,
    KEYS_VARIANTS,
    LAST_VARIANTS,
    fake_quantize_keys_triton,
    fake_quantize_last_triton,
)
from kernels.mxfp8.gdpa import fake_quantize_keys_ref, fake_quantize_last_ref



def make_offsets(T: int, B: int, lo: int, hi: int, seed: int = 0) -> torch.Tensor:
    """``B`` lengths uniform in ``[lo, hi]``, redrawn until their sum is at most ``T``."""
    g = torch.Generator().manual_seed(seed)
    while True:
        lens = torch.randint(lo, hi + 1, (B,), generator=g)
        if int(lens.sum()) <= T:
            return torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])


def make_input(shape, dev, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    C = shape[1] * shape[2]
    x = torch.randn(shape, generator=g) * torch.logspace(-30, 30, C).view(shape[1:])
    x[:3] = 0  # all-zero blocks, both orientations
    x[40, 1, 5] = float("nan")
    x[77, -1, -1] = float("inf")
    return x.to(dev, torch.bfloat16)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, NaN where NaN (``torch.equal`` is false on NaN)."""
    na, nb = a.isnan(), b.isnan()
    return a.dtype == b.dtype and torch.equal(na, nb) and torch.equal(a.masked_fill(na, 0), b.masked_fill(nb, 0))


def check(res, q, v, offsets, say) -> bool:
    rows = []
    ref_q = {e: fake_quantize_last_ref(q, e).to(q.dtype) for e in ("e4m3", "e5m2")}
    ref_v = {e: fake_quantize_keys_ref(v, offsets, e) for e in ("e4m3", "e5m2")}
    cases = [("last", name, "e4m3", q.dtype) for name in LAST_VARIANTS]
    cases += [("keys", name, "e4m3", v.dtype) for name in KEYS_VARIANTS]
    cases += [(kind, DEFAULT[kind], "e5m2", torch.bfloat16) for kind in ("last", "keys")]
    cases += [(kind, DEFAULT[kind], "e4m3", torch.float32) for kind in ("last", "keys")]
    for kind, name, elem, dtype in cases:
        case = {"kind": kind, "variant": name, "elem": elem, "dtype": str(dtype).replace("torch.", "")}
        try:
            if kind == "last":
                x = q.to(dtype)
                ref = ref_q[elem] if dtype == q.dtype else fake_quantize_last_ref(x, elem)
                got = fake_quantize_last_triton(x, elem, variant=name)
            else:
                x = v.to(dtype)
                ref = ref_v[elem] if dtype == v.dtype else fake_quantize_keys_ref(x, offsets, elem)
                got = fake_quantize_keys_triton(x, offsets, elem, variant=name)
            case["equal"] = same(got, ref)
        except Exception as e:  # noqa: BLE001
            case["equal"], case["error"] = False, repr(e)[:300]
        rows.append(case)
        del x
    res["check"] = rows
    res["all_equal"] = all(r["equal"] for r in rows)
    bad = [r for r in rows if not r["equal"]]
    say(f"check: {len(rows)} cases, {len(bad)} not equal" + (f": {bad}" if bad else ""))
    return res["all_equal"]


def timing(res, q, k, v, offsets, dev, say) -> None:
    med = timer(dev)
    nbytes = 4 * q.numel()  # read 2 B + write 2 B per element
    y = torch.empty_like(q)
    out = {"bytes": nbytes, "copy_s": med(lambda: y.copy_(q))}
    del y
    for kind, table, fn in (("last", LAST_VARIANTS, lambda name: fake_quantize_last_triton(q, variant=name)),
                            ("keys", KEYS_VARIANTS, lambda name: fake_quantize_keys_triton(v, offsets, variant=name))):
        out[kind] = {name: med(lambda name=name: fn(name)) for name in table}
    out["old_last_s"] = med(lambda: fake_quantize_last_ref(q).to(q.dtype))
    out["old_keys_s"] = med(lambda: fake_quantize_keys_ref(v, offsets))

    def old():
        [fake_quantize_last_ref(t).to(t.dtype) for t in (q, k)]
        fake_quantize_keys_ref(v, offsets)

    def new():
        [fake_quantize_last_triton(t) for t in (q, k)]
        fake_quantize_keys_triton(v, offsets)

    out["old_qkv_s"], out["fused_qkv_s"] = med(old), med(new)
    res["timing"] = out
    say(f"copy {out['copy_s'] * 1e3:.3f} ms ({nbytes / out['copy_s'] / 1e12:.2f} TB/s); "
        f"q,k,v: old {out['old_qkv_s'] * 1e3:.3f} ms, fused {out['fused_qkv_s'] * 1e3:.3f} ms")


def gdpa_forward(res, q, k, v, offsets, dev, say) -> None:
    from kernels.mxfp8.gdpa import gdpa_mxfp8

    med = timer(dev)
    res["gdpa_fwd_s"] = med(lambda: gdpa_mxfp8(q, k, v, offsets, causal=True, activation="silu", max_len=1024,
                                              triton=True))
    say(f"gdpa_mxfp8(triton=True) forward: {res['gdpa_fwd_s'] * 1e3:.3f} ms")


def table(res) -> str:
    t = res.get("timing")
    if not t:
        return "(no timing)"
    ms, bw = (lambda s: f"{s * 1e3:.3f}"), (lambda s: f"{t['bytes'] / s / 1e12:.2f}")
    lines = ["| what | ms | TB/s (4 B/elem) |", "|---|---|---|", f"| torch copy | {ms(t['copy_s'])} | {bw(t['copy_s'])} |"]
    for kind in ("last", "keys"):
        lines.append(f"| old {kind} (PyTorch chain) | {ms(t[f'old_{kind}_s'])} | {bw(t[f'old_{kind}_s'])} |")
        for name, s in sorted(t[kind].items(), key=lambda kv: kv[1]):
            mark = " (default)" if name == DEFAULT[kind] else ""
            lines.append(f"| fused {kind} {name}{mark} | {ms(s)} | {bw(s)} |")
    lines.append(f"| q,k,v old | {ms(t['old_qkv_s'])} | |")
    lines.append(f"| q,k,v fused (defaults) | {ms(t['fused_qkv_s'])} | |")
    if "gdpa_fwd_s" in res:
        lines.append(f"| gdpa_mxfp8(triton=True) forward | {ms(res['gdpa_fwd_s'])} | |")
    return "\n".join(lines)


def compile_only() -> int:
    """Every variant compiled for sm_90 without a GPU (bf16 in and out, E4M3, hardware cast; the
    unmasked ``last`` specialisation), with ``kernels.common.bench.sm90_report``'s counts."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile-only: unset TRITON_INTERPRET (the interpreter replaces the compiler)")
        return 2
    from kernels.mxfp8 import fake_quantize as F

    fmt = dict(EMAX=8, E5M2=False, SOFT_CAST=False, MBITS=3, EMIN=-6)
    ok = True
    for kind, table_, fn in (("last", LAST_VARIANTS, F._fake_quantize_last_kernel),
                             ("keys", KEYS_VARIANTS, F._fake_quantize_keys_kernel)):
        for name, cfg in table_.items():
            if kind == "last":
                consts = dict(fmt, NB=cfg["NB"], FLAT=True, EVEN=True)
                elems, ints16 = cfg["NB"] * 32, ("nblocks", "nb", "n")
            else:
                consts = dict(fmt, C=512, BC=cfg["BC"], VEC=cfg["VEC"])  # C = H·D at the GDPA shape
                elems, ints16 = cfg["BC"] * 32, ()  # one block per program (about the average)
            sig, attrs = {}, {}
            for i, arg in enumerate(fn.arg_names):
                if arg in consts:
                    sig[arg] = "constexpr"
                else:
                    sig[arg] = {"x_ptr": "*bf16", "y_ptr": "*bf16", "off_ptr": "*i64"}.get(arg, "i32")
                if arg.endswith("_ptr") or arg in ints16:
                    attrs[(i,)] = [["tt.divisibility", 16]]
            ok &= sm90_report(f"{kind} {name}", fn, sig, consts, attrs, cfg["num_warps"], elems,
                              f"/tmp/bench_fake_quantize_{kind}_{name}")
    return 0 if ok else 1


def main(argv=None) -> int:
    say = Clock().say
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--smoke", action="store_true", help="CPU / interpreter: a tiny shape, no do_bench")
    p.add_argument("--compile-only", action="store_true", help="compile every variant for sm_90 (no GPU) and stop")
    a = p.parse_args(argv)
    if a.compile_only:
        return compile_only()
    dev = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    if dev == "cpu" and not a.smoke:
        print("bench_fake_quantize: no CUDA device; use --smoke (interpreter) or --compile-only")
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    T, B, lo, hi = (196608, 256, 512, 1024) if dev == "cuda" else (300, 6, 0, 70)
    shape = (T, 4, 128) if dev == "cuda" else (T, 2, 48)
    offsets = make_offsets(T, B, lo, hi).to(dev)
    res = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)", "torch": torch.__version__,
           "shape": list(shape), "samples": B, "lengths": [lo, hi], "rows_in_samples": int(offsets[-1]),
           "default": DEFAULT}
    say({k: res[k] for k in ("device", "shape", "rows_in_samples")})
    q, k, v = (make_input(shape, dev, seed) for seed in (1, 2, 3))
    steps = [("check", lambda: check(res, q, v, offsets, say)), ("time", lambda: timing(res, q, k, v, offsets, dev, say))]
    if dev == "cuda":
        steps.append(("gdpa", lambda: gdpa_forward(res, *(torch.randn(shape, device=dev, dtype=torch.bfloat16)
                                                          for _ in range(3)), offsets, dev, say)))
    run_steps(steps, res, out, "bench_fake_quantize", say)
    md = table(res)
    (out / "bench_fake_quantize.md").write_text(md + "\n")
    print(md, flush=True)
    return 0 if res.get("all_equal") and not res.get("errors") else 1


if __name__ == "__main__":
    sys.exit(main())
