"""Depth folding's error against the full simulation (``twin.fold``): random valid layouts of the
planner's space on the bundled GEM scenarios, each made deep (``--depth`` layers per stack) and
simulated in full (``simulate(s, imbalance=False)``, what the search ranks) and by folding, side
by side; the bundled GEM scenarios as given, made deep, with rank imbalance too.

    python -m twin.bench_fold [--layouts 120] [--depth 64] [--pairs 8,16 4,8] [--seed 0]
                              [--out twin/data/fold_error.json]

Prints, per depth pair (the two shallow depths the line is drawn through) and scenario, the
largest relative error of the step, of the memory per rank and of any part of the breakdown (over
the step), and the time of one folded simulation against one full one. Writes every row to
``--out`` (atomic).
"""

from __future__ import annotations

import argparse
import random
import time

import scenarios
from twin.bench_estimate import space
from twin.fold import at_depth, depth, fold_depths, simulate_folded
from twin.plan_space import apply
from twin.runrecord import write_json_atomic
from twin.simulate import simulate

# (scenario, GPUs), as twin.bench_estimate: the planner's targets and a few smaller counts
CASES = [("gem-h100-4k", 4096), ("gem-h100-4k", 512), ("gem-b200-8k", 1024), ("gem-gb200-nvl72", 576),
         ("gem-h200-2gpu", 2), ("gem-h200-1gpu", 1), ("debug-cpu-5d", 8)]  # fmt: skip


def _errors(full, folded) -> dict:
    bd = max(abs(folded.breakdown_s[k] - full.breakdown_s.get(k, 0.0)) for k in folded.breakdown_s)
    return {"step_error": folded.step_time_s / full.step_time_s - 1.0,
            "memory_error": folded.memory_total_bytes / full.memory_total_bytes - 1.0,
            "breakdown_error": bd / full.step_time_s,
            "fits_agree": folded.memory_fits == full.memory_fits}  # fmt: skip


def _row(name: str, sc, what: str, pairs, *, imbalance: bool = False) -> dict:
    t0 = time.perf_counter()
    full = simulate(sc, imbalance=imbalance)
    row = {"scenario": name, "gpus": sc.hardware.num_gpus, "layers": depth(sc), "layout": what,
           "imbalance": imbalance, "full_step_s": full.step_time_s, "full_s": time.perf_counter() - t0}  # fmt: skip
    for pair in pairs:
        a, b = fold_depths(sc) if pair == "auto" else pair
        if a < sc.model.cross.num_layers:  # a model needs a stage for each cross layer
            continue
        t0 = time.perf_counter()
        folded = simulate_folded(sc, imbalance=imbalance, depths=(a, b))
        row[_key(pair)] = {"depths": [a, b], **_errors(full, folded), "folded_s": time.perf_counter() - t0}
    return row


def run(layouts: int, layers: int, pairs, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for name in scenarios.bundled():
        s = scenarios.load(name)
        if depth(s) is None:
            continue
        deep = at_depth(s, layers)
        rows.append(_row(name, deep, "as given", pairs, imbalance=True))
    per_case = max(1, layouts // len(CASES))
    for name, gpus in CASES:
        deep = at_depth(scenarios.load(name), layers)
        cands, gpu, net, gb = space(deep, gpus)
        for c in rng.sample(cands, min(per_case, len(cands))):
            sc = apply(deep, c, gpus=gpus, gpu=gpu, network=net, global_batch=gb)
            rows.append(_row(name, sc, c.label(), pairs))
    return rows


def _key(pair) -> str:
    return pair if pair == "auto" else f"{pair[0]},{pair[1]}"


def summarize(rows: list[dict], pairs) -> list[dict]:
    out = []
    for pair in pairs:
        k = _key(pair)
        for name in dict.fromkeys((r["scenario"], r["gpus"]) for r in rows):
            rs = [r for r in rows if (r["scenario"], r["gpus"]) == name and k in r]
            if not rs:
                continue
            out.append({"pair": k, "scenario": name[0], "gpus": name[1], "rows": len(rs),
                        "max_step_error": max(abs(r[k]["step_error"]) for r in rs),
                        "max_memory_error": max(abs(r[k]["memory_error"]) for r in rs),
                        "max_breakdown_error": max(r[k]["breakdown_error"] for r in rs),
                        "fits_disagree": sum(not r[k]["fits_agree"] for r in rs),
                        "speedup": sum(r["full_s"] for r in rs) / sum(r[k]["folded_s"] for r in rs)})  # fmt: skip
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", type=int, default=120)
    ap.add_argument("--depth", type=int, default=64, help="layers per stack of the deep models")
    ap.add_argument("--pairs", nargs="+", default=["auto"],
                    help="shallow depth pairs to check: auto (twin.fold.fold_depths, what the planner uses) "
                    "or A,B, e.g. auto 8,16")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write every row here (JSON)")
    a = ap.parse_args(argv)
    try:
        pairs = [p if p == "auto" else tuple(int(x) for x in p.split(",")) for p in a.pairs]
    except ValueError:
        ap.error(f"--pairs {' '.join(a.pairs)}: each is auto or two depths A,B, e.g. --pairs auto 8,16")
    for p in pairs:
        if p != "auto" and (len(p) != 2 or not 0 < p[0] < p[1] < a.depth):
            ap.error(f"--pairs {p}: each pair must be two depths A,B with 0 < A < B < --depth ({a.depth})")
    t0 = time.perf_counter()
    rows = run(a.layouts, a.depth, pairs, a.seed)
    summary = summarize(rows, pairs)
    print(f"{'pair':>6} {'scenario':<18} {'GPUs':>5} {'rows':>4} {'step err':>9} {'memory err':>10} "
          f"{'breakdown err':>13} {'fit differs':>11} {'speed-up':>8}")  # fmt: skip
    for r in summary:
        print(f"{r['pair']:>6} {r['scenario']:<18} {r['gpus']:>5} {r['rows']:>4} {r['max_step_error']:>9.1e} "
              f"{r['max_memory_error']:>10.1e} {r['max_breakdown_error']:>13.1e} {r['fits_disagree']:>11} "
              f"{r['speedup']:>7.1f}x")  # fmt: skip
    print(f"{len(rows)} layouts at {a.depth} layers per stack in {time.perf_counter() - t0:.0f} s")
    if a.out:
        write_json_atomic(a.out, {"depth": a.depth, "pairs": [_key(p) for p in pairs], "seed": a.seed,
                                  "summary": summary, "rows": rows})  # fmt: skip
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
