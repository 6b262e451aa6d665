"""The fast estimator's error against the engine (issue 26): every bundled scenario as given, and
random valid layouts of the planner's space, each simulated (``simulate(s, imbalance=False)``,
what the search ranks) and estimated (``twin.estimate.estimate``) side by side.

    python -m twin.bench_estimate [--layouts 300] [--seed 0] [--out twin/data/estimate_error.json]

Prints one row per bundled scenario and a summary per (scenario, GPUs) of the random layouts:
the largest and the 95th-percentile absolute error on the step, among the estimates the search
trusts (``Estimate.trusted``), how many were not trusted (the search simulates those), and the
time of one estimate against one simulate. Writes every row to ``--out`` (atomic).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import scenarios
from twin.runrecord import write_json_atomic
from twin.estimate import estimate
from twin.plan_space import (
    CHECKPOINTING, Candidate, _comm_variants, apply, dense_shards, experts, micro_batches, per_gpu_batch,
    precisions, sparse_shards,
)
from twin.planner import _resolve
from twin.simulate import simulate

# (scenario, GPUs): the planner's targets and a few smaller counts; the layouts are drawn evenly over these
CASES = [("gem-h100-4k", 4096), ("gem-h100-4k", 512), ("gem-b200-8k", 1024), ("gem-gb200-nvl72", 576),
         ("gem-h200-2gpu", 2), ("dlrm-dcnv2", 64), ("debug-cpu-5d", 4)]  # fmt: skip


def space(s, gpus: int) -> tuple[list[Candidate], str, str, int]:
    """Every candidate of the planner's space for ``gpus`` (``twin.planner``'s axes), the GPU,
    the network and the global batch."""
    gpu, net, domain = _resolve(s, gpus, None, None)
    per_gpu = per_gpu_batch(s.training.global_batch, gpus)
    out = [Candidate(m, ck, pr, e, ss, d, st, n)
           for m in micro_batches(per_gpu) for ck in CHECKPOINTING for pr in precisions(gpu)
           for e in experts(s, gpus) for ss in sparse_shards(gpus, domain)
           for d, st, n in _comm_variants(gpus, ss, dense_shards(gpus, domain))]  # fmt: skip
    return out, gpu, net, per_gpu * gpus


def _row(name: str, sc, what: str) -> dict:
    t0 = time.perf_counter()
    r = simulate(sc, imbalance=False)
    t1 = time.perf_counter()
    e = estimate(sc)
    t2 = time.perf_counter()
    return {"scenario": name, "gpus": sc.hardware.num_gpus, "layout": what, "des_step_s": r.step_time_s,
            "estimate_step_s": e.step_time_s, "error": e.step_time_s / r.step_time_s - 1.0, "trusted": e.trusted,
            "simulate_s": t1 - t0, "estimate_s": t2 - t1}  # fmt: skip


def run(layouts: int, seed: int) -> dict:
    rng = random.Random(seed)
    bundled = [_row(n, scenarios.load(n), "as given") for n in scenarios.bundled()]
    rows = []
    per_case = max(1, layouts // len(CASES))
    for name, gpus in CASES:
        s = scenarios.load(name)
        cands, gpu, net, gb = space(s, gpus)
        for c in rng.sample(cands, min(per_case, len(cands))):
            rows.append(_row(name, apply(s, c, gpus=gpus, gpu=gpu, network=net, global_batch=gb), c.label()))
    return {"bundled": bundled, "layouts": rows, "summary": summarize(bundled + rows), "seed": seed}


def summarize(rows: list[dict]) -> dict:
    trusted = [abs(r["error"]) for r in rows if r["trusted"]]
    q = sorted(trusted)
    return {"rows": len(rows), "trusted": len(trusted), "not_trusted": len(rows) - len(trusted),
            "max_abs_error": max(q, default=0.0), "p95_abs_error": q[int(0.95 * (len(q) - 1))] if q else 0.0,
            "mean_abs_error": statistics.fmean(q) if q else 0.0,
            "simulate_s_total": sum(r["simulate_s"] for r in rows),
            "estimate_s_total": sum(r["estimate_s"] for r in rows)}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    res = run(a.layouts, a.seed)
    print(f"{'scenario':22s} {'GPUs':>5s} {'engine ms':>10s} {'estimate ms':>12s} {'error':>8s}  trusted")
    for r in res["bundled"]:
        print(f"{r['scenario']:22s} {r['gpus']:5d} {r['des_step_s'] * 1e3:10.3f} {r['estimate_step_s'] * 1e3:12.3f} "
              f"{r['error']:+8.2%}  {'yes' if r['trusted'] else 'no (simulated)'}")
    print(f"\nrandom layouts ({len(res['layouts'])}, seed {a.seed}):")
    print(f"{'scenario':22s} {'GPUs':>5s} {'layouts':>7s} {'max |err|':>9s} {'p95 |err|':>9s} {'not trusted':>11s} "
          f"{'est/sim time':>12s}")
    for name, gpus in CASES:
        rr = [r for r in res["layouts"] if (r["scenario"], r["gpus"]) == (name, gpus)]
        sm = summarize(rr)
        print(f"{name:22s} {gpus:5d} {len(rr):7d} {sm['max_abs_error']:9.2%} {sm['p95_abs_error']:9.2%} "
              f"{sm['not_trusted']:11d} {sm['estimate_s_total'] / max(sm['simulate_s_total'], 1e-9):12.2f}")
    sm = res["summary"]
    print(f"\nall trusted estimates ({sm['trusted']} of {sm['rows']}): max |error| {sm['max_abs_error']:.2%}, "
          f"p95 {sm['p95_abs_error']:.2%}, mean {sm['mean_abs_error']:.3%}; not trusted: {sm['not_trusted']}")
    if a.out:
        print("wrote", write_json_atomic(a.out, res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
