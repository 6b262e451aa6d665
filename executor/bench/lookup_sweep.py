"""A sweep of pooled multi-hot lookups on one GPU: our Triton TBE (kernels/embedding), forward and
backward with the fused row-wise Adagrad update, the path a DLRM step runs.

One case = ``tables`` tables of ``rows`` rows and ``dim`` columns in one fused buffer, ``batch``
bags per table of exactly ``pooling`` ids each, ids Zipf-drawn with exponent ``skew``
(``executor.data.zipf_ids``, lowest ids hottest, as the executor's data draws them). The cases
vary one knob at a time around a base (8 tables × 1 M rows × dim 128, pooling 8, batch 8,192,
fp32, skew 1.05): pooling factor, dim, table count, batch, rows (which decides how much the L2
serves), skew and the table dtype.

For each case: forward time (``triton.testing.do_bench`` median, rotating over id draws) and
forward-with-save + backward-with-update time, as wall time (``do_bench``) and as the profiler's
device time (``*_kernels_s``: the kernels alone, without the eager launches' host gaps); the effective bytes of each
(``kernels.embedding.cost``: rows gathered once per id, output written, ids/offsets read; the
backward's floor ``backward_bytes`` plus the rows and Adagrad state read and written), the
unique rows touched (what the L2 and the update see). Correctness first: the forward output
against a float64 reference on the first draw. Writes ``$OUT/lookup_sweep.json`` and prints a table.
``--cpu-smoke`` runs three tiny cases on the CPU under TRITON_INTERPRET=1 (timings meaningless).

    python3 executor/bench/lookup_sweep.py [--out DIR] [--rotate 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BASE = dict(tables=8, rows=1_000_000, dim=128, pooling=8, batch=8192, dtype="fp32", skew=1.05)
VARY = {
    "pooling": [1, 2, 4, 16, 32, 100],
    "dim": [32, 64, 256],
    "tables": [1, 2, 26, 64],
    "batch": [1024, 2048, 4096, 16384, 32768],
    "rows": [1000, 100_000, 10_000_000],
    "skew": [0.0, 1.2],
    "dtype": ["bf16"],
}
# two-knob corners that the one-at-a-time cases miss: small pooling at large batch, big dims
# with many tables, bf16 with heavy pooling
CORNERS = [
    dict(pooling=1, batch=32768), dict(pooling=1, tables=26), dict(pooling=100, dtype="bf16"),
    dict(dim=256, tables=26), dict(dim=32, pooling=32), dict(rows=1000, pooling=32),
]


def cases() -> list[dict]:
    out = [dict(BASE)]
    for k, vals in VARY.items():
        out += [dict(BASE, **{k: v}) for v in vals]
    out += [dict(BASE, **c) for c in CORNERS]
    return out


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for lookup_sweep.json")
    p.add_argument("--rotate", type=int, default=3, help="id draws to rotate over while timing")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny cases on the CPU under TRITON_INTERPRET=1")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import numpy as np
    import torch

    from executor.data import zipf_ids
    from kernels.embedding import cost, tbe
    from kernels.embedding.layout import FusedTables

    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device; run with --cpu-smoke on a CPU")
    todo = ([dict(BASE, rows=50, tables=2, batch=4, dim=16, pooling=p) for p in (1, 3)]
            + [dict(BASE, rows=50, tables=2, batch=4, dim=16, pooling=2, dtype="bf16")]) if args.cpu_smoke else cases()
    rows_out, t_start = [], time.time()
    result = {"device": _device_info(torch, dev), "base": BASE, "cases": rows_out}
    for c in todo:
        T, R, D, P, B = c["tables"], c["rows"], c["dim"], c["pooling"], c["batch"]
        dt = torch.float32 if c["dtype"] == "fp32" else torch.bfloat16
        f = FusedTables([R] * T, D, device=dev)
        f.buffer.normal_()
        if dt != torch.float32:
            f.cast(dt)
        rs = f.row_starts_on(dev)
        upd = tbe.RowwiseAdagradInBackward(f, lr=1e-3)
        rng = np.random.default_rng(0)
        draws = []
        for _ in range(max(args.rotate, 1)):
            ids = np.concatenate([zipf_ids(rng, B * P, R, c["skew"]) for _ in range(T)])
            draws.append((torch.from_numpy(ids).to(dev), torch.arange(0, T * B * P + 1, P, device=dev)))
        uniq = float(np.mean([sum(int(torch.unique(d[0][t * B * P:(t + 1) * B * P]).numel()) for t in range(T))
                              for d in draws]))
        out, _, _ = tbe.pooled_forward(f.buffer, rs, *draws[0], B)
        ref = f.buffer.double()[(draws[0][0].view(T, B, P) + rs.view(T, 1, 1))].sum(2).permute(1, 0, 2).reshape(B, T * D)
        err = float((out.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-30))
        ok = bool(torch.isfinite(out).all()) and err < (1e-5 if dt == torch.float32 else 1e-2)
        e = f.buffer.element_size()
        n = T * B * P
        fc = cost.pooled_cost(n, T * B, D, elem_bytes=e)
        # backward: the output gradient per occurrence + the sort, then each touched row read and
        # written with its Adagrad state (fp32 per row)
        bwd_bytes = cost.backward_bytes(n, uniq, D) + uniq * (2 * D * e + 8)
        grad = torch.randn(B, T * D, device=dev)

        def fwd(i):
            tbe.pooled_forward(f.buffer, rs, *draws[i], B)

        def fwd_bwd(i):
            o, grow, obase = tbe.pooled_forward(f.buffer, rs, *draws[i], B, save=True)
            upd.apply(f.buffer, grad, grow, obase, D)

        t_f = _time(torch, dev, fwd, len(draws))
        t_fb = _time(torch, dev, fwd_bwd, len(draws))
        k_f, k_fb = _kernel_s(torch, dev, fwd, len(draws)), _kernel_s(torch, dev, fwd_bwd, len(draws))
        row = dict(c, ids=n, bags=T * B, unique_rows=uniq, fwd_bytes=fc.bytes, bwd_bytes=bwd_bytes,
                   rel_err=err, correct=ok, fwd_s=t_f, fwd_bwd_s=t_fb, bwd_s=max(t_fb - t_f, 0.0),
                   fwd_kernels_s=k_f, fwd_bwd_kernels_s=k_fb,
                   bwd_kernels_s=None if k_f is None else max(k_fb - k_f, 0.0),
                   fwd_tb_s=fc.bytes / t_f / 1e12 if t_f else None)
        rows_out.append(row)
        kern = "" if k_f is None else f" (kernels {k_f * 1e3:.4f} / {row['bwd_kernels_s'] * 1e3:.4f} ms)"
        print(f"T{T:<3} R{R:<9} D{D:<4} P{P:<4} B{B:<6} {c['dtype']} s{c['skew']}: fwd {t_f * 1e3:8.4f} ms "
              f"({row['fwd_tb_s'] or 0:.2f} TB/s eff)  bwd {row['bwd_s'] * 1e3:8.4f} ms{kern}  uniq {uniq:,.0f} "
              f"{'ok' if ok else 'WRONG'}", flush=True)
        del f, upd, draws, out, ref
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    result["wall_s"] = time.time() - t_start
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "lookup_sweep.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.rename(out_dir / "lookup_sweep.json")
    if not all(r["correct"] for r in rows_out):
        raise SystemExit("error: a correctness check failed (see 'WRONG' above)")
    return result


def _time(torch, dev, fn, n_draws: int) -> float:
    if dev.type != "cuda":
        t0 = time.perf_counter()
        fn(0)
        return time.perf_counter() - t0
    import triton.testing

    k = [0]

    def call():
        fn(k[0] % n_draws)
        k[0] += 1

    return float(triton.testing.do_bench(call, warmup=10, rep=40, return_mode="median")) * 1e-3


def _kernel_s(torch, dev, fn, n_draws: int, reps: int = 6) -> float | None:
    """Device time of one call: the profiler's kernels, memsets and copies summed over ``reps``
    calls, over ``reps``. The wall time (``_time``) of an eager call also holds the host's launch
    gaps; a step replayed from a CUDA graph has only this."""
    if dev.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    for i in range(2):
        fn(i % n_draws)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            fn(i % n_draws)
        torch.cuda.synchronize()
    us = sum(getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0)
             for e in prof.key_averages())
    return us * 1e-6 / reps


def _device_info(torch, dev) -> dict:
    import triton

    info = {"device": dev.type, "torch": torch.__version__, "triton": triton.__version__}
    if dev.type == "cuda":
        info["name"] = torch.cuda.get_device_name(dev)
    return info


if __name__ == "__main__":
    main()
