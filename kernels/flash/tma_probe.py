"""Side by side on one GPU: the core's table kernels with pointer loads against its TMA-descriptor
loads (``_tma.py``) and other tiles, at the suite's bench shapes.

    python -m kernels.flash.tma_probe --out $OUT/tma_probe.json

Shapes as ``gpu_check`` (B=1152, H=4, D=128, bf16, lengths uniform in [L/2, L]). "table" is the
core with pointer loads (``FlashOptions(tma="off")``), "default" the core as it runs by default
(TMA where ``tiles.use_tma`` says), the others the core with ``FlashOptions(tiles=..., tma=...)``:
the pointer table's tiles unless named. Every variant's outputs are compared with the table's (max |diff| over max |ref|)
before it is timed
(``do_bench`` median). Padded flash SDPA is timed in the same run for the ratios the issue asks
(JFA causal: causal SDPA; dense K/V: SDPA over 256 keys; their ``x_table`` is the default's time
over SDPA's). Results: one JSON row per
(kind, L, direction, variant), and a table printed at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import torch

from kernels.flash import gpu_check as gc
from kernels.flash import tiles as TT
from kernels.flash.core import attention_bwd, attention_fwd
from kernels.flash.options import FlashOptions, Tiles

# the suite's kinds, and the training step's GDPA (causal silu: gem-h200-1gpu's layer), which gpu_check's
# ``problem`` and ``pairs`` then know (its own sweeps do not run it)
gc.KINDS.setdefault("gdpa_causal", ("silu", True, 0, 0))
KINDS = ("gdpa_silu", "gdpa_causal", "jfa_causal", "densekv_softmax")
OFF = FlashOptions(tma="off")
# forward variants: (tma, forward tiles or None for the pointer table's), through the core. (probe1-2
# also ran the forward capped at 168 / 128 registers, ``maxnreg``, which the core does not take: 0.90-1.15x.)
FWD = {
    "tma": ("on", None),
    "tma_64x64w4s3": ("on", Tiles(64, 64, 4, 3)),
    "tma_128x32w4s3": ("on", Tiles(128, 32, 4, 3)),
    "ptr_128x32w4s3": ("off", Tiles(128, 32, 4, 3)),
    "ptr_64x64w4s3": ("off", Tiles(64, 64, 4, 3)),
}
# backward variants: (tma, dK/dV tiles or None for the table's); the core's dQ kernel stays on pointer
# loads. (A TMA dQ kernel, "tma_dq" / "tma_both" in probe1-2, measured 0.90-1.04x and was removed at 1d2489d.)
BWD = {
    "tma_dkdv": ("on", None),
    "tma_dkdv_128x32w8": ("on", Tiles(128, 32, 8, 3)),
    "tma_dkdv_64x32w8": ("on", Tiles(64, 32, 8, 3)),
    "ptr_dkdv_128x32w8": ("off", Tiles(128, 32, 8, 3)),
}


def _table(args, kw):
    """The pointer table's tiles for this problem."""
    q, _, _, _, _, max_q, max_kv = args
    return TT.config(q, int(max_kv), 0, kw["causal"], kw["weight"], min(max_q, max_kv), OFF)


def fwd_variant(args, kw, name):
    """(o, lse) of forward variant ``name``: the core with these tiles and loads."""
    tma, tiles = FWD[name]
    base = _table(args, kw)
    return attention_fwd(*args, **kw, flash=FlashOptions(tiles=dataclasses.replace(base, fwd=tiles or base.fwd), tma=tma))


def bwd_variant(args, kw, do, o, lse, name):
    """(dq, dk, dv) of backward variant ``name``: the core with these dK/dV tiles and loads."""
    tma, tiles = BWD[name]
    base = _table(args, kw)
    flash = FlashOptions(tiles=dataclasses.replace(base, dkdv=tiles or base.dkdv), tma=tma)
    return attention_bwd(do, *args[:3], o, lse, *args[3:], **kw, flash=flash)


def _err(x, ref):
    """max |x - ref| over max |ref|, on the rows that belong to samples (both sides use all)."""
    return float((x.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


def sdpa_ms(kind, lens):
    _, causal, _, N = gc.KINDS[kind]
    Lmax = max(lens)
    qs = (len(lens), gc.H, Lmax, gc.D)
    ks = (len(lens), gc.H, N, gc.D) if N else qs
    return gc.time_sdpa(qs, ks, causal)


def run(opts):
    rows = []
    t0 = time.time()
    for L in opts.lengths:
        lens = gc.rand_lens(gc.B, L, seed=L)
        for kind in opts.kinds:
            if time.time() - t0 > opts.budget_s:
                return rows
            args, do, kw = gc.problem(kind, lens)
            pairs = gc.pairs(kind, lens)
            fl = 4 * gc.H * gc.D * pairs / 1e9
            o_ref, lse_ref = attention_fwd(*args, **kw, flash=OFF)
            g_ref = attention_bwd(do, *args[:3], o_ref, lse_ref, *args[3:], **kw, flash=OFF)
            base_f = gc.bench(lambda: attention_fwd(*args, **kw, flash=OFF))
            base_b = gc.bench(lambda: attention_bwd(do, *args[:3], o_ref, lse_ref, *args[3:], **kw, flash=OFF))
            rows.append(dict(kind=kind, L=L, dir="fwd", variant="table", ms=base_f, tflops=fl / base_f, x_table=1.0))
            rows.append(dict(kind=kind, L=L, dir="bwd", variant="table", ms=base_b, tflops=2 * fl / base_b, x_table=1.0))
            o, lse = attention_fwd(*args, **kw)
            g = attention_bwd(do, *args[:3], o, lse, *args[3:], **kw)
            ms_f = gc.bench(lambda: attention_fwd(*args, **kw))
            ms_b = gc.bench(lambda: attention_bwd(do, *args[:3], o, lse, *args[3:], **kw))
            rows.append(dict(kind=kind, L=L, dir="fwd", variant="default", ms=ms_f, tflops=fl / ms_f,
                             x_table=base_f / ms_f, err=_err(o, o_ref)))
            rows.append(dict(kind=kind, L=L, dir="bwd", variant="default", ms=ms_b, tflops=2 * fl / ms_b,
                             x_table=base_b / ms_b, err=max(_err(a, b) for a, b in zip(g, g_ref))))
            for name in FWD:
                try:
                    o, _ = fwd_variant(args, kw, name)
                    err = _err(o, o_ref)
                    ms = gc.bench(lambda: fwd_variant(args, kw, name))
                    rows.append(dict(kind=kind, L=L, dir="fwd", variant=name, ms=ms, tflops=fl / ms, x_table=base_f / ms,
                                     err=err))
                except Exception as e:  # noqa: BLE001
                    rows.append(dict(kind=kind, L=L, dir="fwd", variant=name, error=f"{type(e).__name__}: {str(e)[-300:]}"))
            if kind == "densekv_softmax":
                continue
            for name in BWD:
                try:
                    g = bwd_variant(args, kw, do, o_ref, lse_ref, name)
                    err = max(_err(a, b) for a, b in zip(g, g_ref))
                    ms = gc.bench(lambda: bwd_variant(args, kw, do, o_ref, lse_ref, name))
                    rows.append(dict(kind=kind, L=L, dir="bwd", variant=name, ms=ms, tflops=2 * fl / ms,
                                     x_table=base_b / ms, err=err))
                except Exception as e:  # noqa: BLE001
                    rows.append(dict(kind=kind, L=L, dir="bwd", variant=name, error=f"{type(e).__name__}: {str(e)[-300:]}"))
            print(f"{kind} L={L} done ({time.time() - t0:.0f} s)", flush=True)
            _write(opts.out, rows)
    # padded SDPA last: a fault in it (FlashAttention-2's int32 bound on large padded batches) must
    # not cost the rows above
    for L in opts.lengths:
        lens = gc.rand_lens(gc.B, L, seed=L)
        for kind in opts.kinds:
            if kind.startswith("gdpa") or time.time() - t0 > opts.budget_s:
                continue
            fl = 4 * gc.H * gc.D * gc.pairs(kind, lens) / 1e9
            base = {r["dir"]: r["ms"] for r in rows if r["kind"] == kind and r["L"] == L and r["variant"] == "default"}
            try:
                sf, sb = sdpa_ms(kind, lens)
                rows.append(dict(kind=kind, L=L, dir="fwd", variant="sdpa", ms=sf, tflops=fl / sf, x_table=base["fwd"] / sf))
                rows.append(dict(kind=kind, L=L, dir="bwd", variant="sdpa", ms=sb, tflops=2 * fl / sb,
                                 x_table=base["bwd"] / sb))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(kind=kind, L=L, variant="sdpa", error=str(e)[-200:]))
            _write(opts.out, rows)
    return rows


def _write(path, rows):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       triton=__import__("triton").__version__, rows=rows), f, indent=1)
    os.replace(tmp, path)


def table(rows):
    print(f"{'kind':16} {'L':>5} {'dir':4} {'variant':22} {'ms':>8} {'TFLOP/s':>8} {'x table':>8} {'err':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['kind']:16} {r['L']:>5} {r.get('dir', ''):4} {r['variant']:22} ERROR {r['error'][-150:]}")
            continue
        err = f"{r['err']:.1e}" if "err" in r else ""
        print(f"{r['kind']:16} {r['L']:>5} {r['dir']:4} {r['variant']:22} {r['ms']:8.3f} {r['tflops']:8.1f} "
              f"{r['x_table']:8.3f} {err:>8}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "tma_probe.json"))
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=gc.LS)
    ap.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS))
    ap.add_argument("--budget-s", type=float, default=300.0)
    opts = ap.parse_args(argv)
    rows = run(opts)
    _write(opts.out, rows)
    table(rows)


if __name__ == "__main__":
    main()
