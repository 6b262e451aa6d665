"""Are the planner's bounds bounds? (``twin.plan_bounds``): random valid layouts of the planner's
space on the bundled scenarios, each priced by the planner's bound (the key's bound plus the
variant's extra, ``Bounds.bound_s + Bounds.variant_extra_s``) and simulated (``simulate(s,
imbalance=False)``, what the search ranks), side by side. A bound above its simulated step would
let the search prune a layout better than the one it returns.

    python -m twin.bench_bounds [--layouts 200] [--seed 0] [--depth N] [--out twin/data/bound_safety.json]

``--depth N``: the GEM scenarios made N layers deep per stack (``twin.fold.at_depth``), their
bounds drawn from the two shallow copies the planner folds them from (``FoldedBounds``), against
the deep model's own simulation.

Prints, per scenario and GPU count, the largest and the median bound / step (at most 1 is safe;
the closer to 1, the more the search prunes without simulating) and the compute-only bound's
median for comparison. Writes every row to ``--out`` (atomic). Exit status 1 when a bound exceeds
its step.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import scenarios
from twin.bench_estimate import CASES, space
from twin.fold import at_depth, depth, depth_fold
from twin.plan_bounds import Bounds, FoldedBounds
from twin.plan_space import apply, experts
from twin.runrecord import write_json_atomic
from twin.simulate import simulate

EXTRA_CASES = [("gem-b200-8k", 8192), ("gem-gb200-nvl72", 4608)]  # where the bound went wrong before


def run(layouts: int, seed: int, layers: int | None = None) -> list[dict]:
    rng = random.Random(seed)
    cases = CASES + EXTRA_CASES
    per_case = max(1, layouts // len(cases))
    rows = []
    for name, gpus in cases:
        s = scenarios.load(name)
        if layers is not None:
            if depth(s) is None:
                continue
            s = at_depth(s, layers)
        cands, gpu, net, gb = space(s, gpus)
        fold = depth_fold(s)
        if fold:
            b = FoldedBounds([Bounds(x, gpus, gpu, net, experts(s, gpus)) for x in fold.copies(s)], fold)
        else:
            b = Bounds(s, gpus, gpu, net, experts(s, gpus))
        for c in rng.sample(cands, min(per_case, len(cands))):
            t0 = time.perf_counter()
            bound = max(b.bound_s(c, gb // gpus) + b.variant_extra_s(c), b.floor_s(c, gb // gpus),
                        b.stream_floor_s(c, gb // gpus))
            compute = b.compute_bound_s(c, gb // gpus)
            t1 = time.perf_counter()
            step = simulate(apply(s, c, gpus=gpus, gpu=gpu, network=net, global_batch=gb),
                            imbalance=False).step_time_s  # fmt: skip
            rows.append({"scenario": name, "gpus": gpus, "layers": depth(s), "folded": bool(fold),
                         "layout": c.label(), "step_s": step, "bound_s": bound,
                         "compute_bound_s": compute, "ratio": bound / step, "bound_time_s": t1 - t0,
                         "simulate_s": time.perf_counter() - t1})  # fmt: skip
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for case in dict.fromkeys((r["scenario"], r["gpus"]) for r in rows):
        rs = [r for r in rows if (r["scenario"], r["gpus"]) == case]
        out.append({"scenario": case[0], "gpus": case[1], "rows": len(rs),
                    "max_ratio": max(r["ratio"] for r in rs),
                    "median_ratio": statistics.median(r["ratio"] for r in rs),
                    "median_compute_ratio": statistics.median(r["compute_bound_s"] / r["step_s"] for r in rs)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--depth", type=int, help="make the GEM scenarios this many layers deep per stack, bounds folded")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    rows = run(a.layouts, a.seed, a.depth)
    print(f"{'scenario':18s} {'GPUs':>6s} {'rows':>4s} {'max bound/step':>14s} {'median':>7s} {'compute':>8s}")
    for r in summarize(rows):
        print(f"{r['scenario']:18s} {r['gpus']:6d} {r['rows']:4d} {r['max_ratio']:14.4f} {r['median_ratio']:7.3f} "
              f"{r['median_compute_ratio']:8.3f}")
    worst = max(rows, key=lambda r: r["ratio"])
    print(f"worst: {worst['ratio']:.6f} ({worst['scenario']} at {worst['gpus']} GPUs, {worst['layout']})")
    if a.out:
        write_json_atomic(a.out, {"seed": a.seed, "depth": a.depth, "summary": summarize(rows), "rows": rows})
    return 1 if worst["ratio"] > 1 + 1e-9 else 0


if __name__ == "__main__":
    raise SystemExit(main())
