"""The fused row-wise Adagrad of the embedding backward (``tbe.RowwiseAdagradInBackward``) at a
scenario's shapes: rows unchunked (each row's occurrences summed by one program, as before
2026-11-30's chunking) against rows split into chunks of ``chunk`` occurrences, and a few launch
shapes (gather rows per iteration, warps, programs per SM), timed side by side in one run.

With Zipf-skewed ids a few rows take a large share of a batch's lookups (gem-h200-1gpu's
history: the hottest item row ~16k of ~198k ids, every action row thousands), and one program
summing such a row serially sets the kernel's time. For every table group of the scenario
(pooled groups, sequence groups), at the scenario's micro-batch, ids drawn as
``executor/data.py`` draws them: each variant's result on the touched rows (weights and Adagrad
state) is checked against the unchunked one, then timed as a CUDA graph's replays
(``triton.testing.do_bench`` median; the update runs in place, so rows keep moving, which does
not change its cost). Writes
``$OUT/sparse_update_bench.json`` and prints a table.

    python3 executor/bench/sparse_update_bench.py [--scenario gem-h200-1gpu] [--chunks 64,128,256,512,1024]
    python3 executor/bench/sparse_update_bench.py --cpu-smoke   # debug-cpu, tiny, TRITON_INTERPRET=1
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


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="gem-h200-1gpu")
    p.add_argument("--chunks", default="64,128,256,512,1024", help="comma-separated chunk sizes to time")
    p.add_argument("--batch", type=int, default=0, help="micro-batch (default: the scenario's)")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for sparse_update_bench.json")
    p.add_argument("--cpu-smoke", action="store_true", help="debug-cpu at its own batch under TRITON_INTERPRET=1")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    import scenarios
    from executor.data import SyntheticData, pooled_table_groups, sequence_table_groups
    from kernels.embedding import tbe
    from kernels.embedding.layout import FusedTables

    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device; run with --cpu-smoke on a CPU")
    s = scenarios.load("debug-cpu" if args.cpu_smoke else args.scenario)
    chunks = [int(c) for c in args.chunks.split(",")]
    if any(c < 1 for c in chunks):
        raise SystemExit(f"error: --chunks {args.chunks}: every chunk must be a positive integer")
    B = args.batch or s.training.micro_batch
    batch = SyntheticData(s, 0).batch(B)
    batch.validate(s.model)
    batch = batch.pack(s.model).to(dev)
    torch.manual_seed(0)
    cases = []  # (name, fused, rows, obase, grad_out)
    emb = s.model.embeddings
    for g in pooled_table_groups(emb):
        f = FusedTables(g.rows, g.dim, device=dev)
        f.buffer.normal_()
        indices, offsets = batch.pooled_packed(g)
        _, rows, obase = tbe.pooled_forward(f.buffer, f.row_starts_on(dev), indices, offsets, B, save=True)
        cases.append((f"pooled dim {g.dim} x{len(g.names)}", f, rows, obase,
                      torch.randn(B, len(g.names) * g.dim, device=dev)))
    for sg in emb.sequences:
        for g in sequence_table_groups(sg):
            f = FusedTables(g.rows, g.dim, device=dev)
            f.buffer.normal_()
            ids = batch.sequence_packed(sg.name, g)
            N = ids.shape[1]
            out = torch.empty(N, len(g.names) * g.dim, device=dev)
            cols = torch.arange(len(g.names), device=dev) * g.dim
            rows, obase = tbe.unpooled_forward(f.buffer, f.row_starts_on(dev), cols, ids, out, save=True)
            cases.append((f"sequence '{sg.name}' dim {g.dim} x{len(g.names)}", f, rows, obase,
                          torch.randn(N, out.shape[1], device=dev)))

    result = {"scenario": s.name, "batch": B, "device": _device_info(torch, dev), "cases": []}
    for name, f, rows, obase, gout in cases:
        n = rows.numel()
        touched, counts = torch.unique(rows[rows >= 0], return_counts=True)
        row = dict(case=name, ids=n, touched_rows=int(touched.numel()), hottest_row_ids=int(counts.max()),
                   seconds={}, max_rel_diff={})
        # unchunked: a chunk longer than any row's run of occurrences
        variants = {"unchunked": dict(chunk=n + 1)} | {f"chunk {c}": dict(chunk=c) for c in chunks}
        if not args.cpu_smoke:  # launch shapes at the default chunk
            variants |= {f"chunk {tbe.DEFAULT_CHUNK} bn{bn} w{w} p{p}": dict(block_n=bn, num_warps=w, programs_per_sm=p)
                         for bn, w, p in [(16, 4, 8), (16, 4, 32), (8, 2, 32), (32, 4, 16), (64, 8, 4)]}
        w0 = f.buffer.index_select(0, touched)  # only touched rows change: compare and restore those
        ref = None
        for key, kw in variants.items():
            up = tbe.RowwiseAdagradInBackward(f, lr=0.05, **kw)
            f.buffer.index_copy_(0, touched, w0)
            up.apply(f.buffer, gout, rows, obase, f.dim)
            got = (f.buffer.index_select(0, touched), up.state.index_select(0, touched))
            if ref is None:
                ref = got
            row["max_rel_diff"][key] = max(_rel(torch, got[0], ref[0]), _rel(torch, got[1], ref[1]))
            row["seconds"][key] = _time(torch, dev, lambda: up.apply(f.buffer, gout, rows, obase, f.dim))
            del up
        f.buffer.index_copy_(0, touched, w0)
        base = row["seconds"]["unchunked"]
        row["speedup_vs_per_row"] = {k: base / t for k, t in row["seconds"].items()}
        row["correct"] = all(d < 1e-5 for d in row["max_rel_diff"].values())
        result["cases"].append(row)
        print(f"{name}: {n} ids, {row['touched_rows']} rows, hottest {row['hottest_row_ids']} ids; "
              + ", ".join(f"{k} {t * 1e6:.1f} us" for k, t in row["seconds"].items())
              + f"; max rel diff {max(row['max_rel_diff'].values()):.1e} {'ok' if row['correct'] else 'WRONG'}",
              flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sparse_update_bench.json").write_text(json.dumps(result, indent=1) + "\n")
    if not all(r["correct"] for r in result["cases"]):
        print("error: a chunk size changed the update (see 'WRONG' above)")
        raise SystemExit(1)
    return result


def _rel(torch, a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _time(torch, dev, fn) -> float:
    """Seconds of ``fn``: on CUDA a captured graph's replays (as the training step runs it, no
    host time between its ~15 kernels), ``do_bench`` median."""
    if dev.type == "cuda":
        from kernels.common.timing import replay_ms

        return replay_ms(fn, rep=200) * 1e-3
    start = time.perf_counter()  # the CPU smoke checks the logic, not the speed
    fn()
    return time.perf_counter() - start


def _device_info(torch, dev) -> dict:
    info = {"device": dev.type, "torch": torch.__version__}
    if dev.type == "cuda":
        import triton

        info |= {"name": torch.cuda.get_device_name(dev), "triton": triton.__version__}
    return info


if __name__ == "__main__":
    main()
