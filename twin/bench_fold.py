"""Folding's error against the full simulation (``twin.fold``): random valid layouts of the
planner's space on the bundled scenarios, each made deep (``--depth`` layers per stack, GEM models)
and simulated in full (``simulate(s, imbalance=False)``, what the search ranks) and folded (along
depth, and along micro-batches where a layout has at least six), side by side; and the bundled
scenarios as given, made deep, with rank imbalance.

    python -m twin.bench_fold [--layouts 140] [--depth 64] [--seed 0] [--out twin/data/fold_error.json]

Prints, per scenario and GPU count, the largest relative error of the step, of its no-contention
lower bound (what the planner prunes on), of the memory per rank and of any part of the breakdown
(over the step), how many layouts folded along micro-batches, how many have a step bound by the host's issue time
(CUDA without graphs; folded on its own line), and the time of the full simulations against the
folded ones. Writes every row to ``--out`` (atomic).
"""

from __future__ import annotations

import argparse
import random
import time

import scenarios
from twin.bench_estimate import space
from twin.estimate import class_graphs, lower_bound_parts, lower_bound_s
from twin.fold import at_depth, depth, fold_of, fold_result
from twin.plan_space import apply
from twin.runrecord import write_json_atomic
from twin.simulate import simulate

# (scenario, GPUs), as twin.bench_estimate: the planner's targets and a few smaller counts
CASES = [("gem-h100-4k", 4096), ("gem-h100-4k", 512), ("gem-b200-8k", 1024), ("gem-gb200-nvl72", 576),
         ("gem-h200-2gpu", 2), ("gem-h200-1gpu", 1), ("dlrm-dcnv2", 64), ("debug-cpu-5d", 8)]  # fmt: skip


def _row(name: str, sc, what: str, *, imbalance: bool = False) -> dict | None:
    fold = fold_of(sc)
    if not fold:
        return None
    t0 = time.perf_counter()
    full = simulate(sc, imbalance=imbalance)
    lb = lower_bound_s(class_graphs(sc))
    t1 = time.perf_counter()
    copies = fold.copies(sc)
    folded = fold_result(sc, [simulate(c, imbalance=imbalance) for c in copies], fold)
    parts = [lower_bound_parts(class_graphs(c)) for c in copies]
    lb_folded = max(fold.combine([p[0] for p in parts]), fold.combine([p[1] for p in parts]))
    t2 = time.perf_counter()
    bd = max(abs(folded.breakdown_s[k] - full.breakdown_s.get(k, 0.0)) for k in folded.breakdown_s)
    return {"scenario": name, "gpus": sc.hardware.num_gpus, "layers": fold.layers, "micro_batches": fold.accum,
            "layout": what, "imbalance": imbalance, "full_step_s": full.step_time_s, "host_bound": full.step_time_s <= full.host_s,
            "step_error": folded.step_time_s / full.step_time_s - 1.0, "lower_bound_error": lb_folded / lb - 1.0,
            "memory_error": folded.memory_total_bytes / full.memory_total_bytes - 1.0,
            "breakdown_error": bd / full.step_time_s, "fits_agree": folded.memory_fits == full.memory_fits,
            "full_s": t1 - t0, "folded_s": t2 - t1}  # fmt: skip


def _deep(s, layers: int):
    return at_depth(s, layers) if depth(s) is not None else s


def run(layouts: int, layers: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = [_row(name, _deep(scenarios.load(name), layers), "as given", imbalance=True)
            for name in scenarios.bundled()]  # fmt: skip
    per_case = max(1, layouts // len(CASES))
    for name, gpus in CASES:
        deep = _deep(scenarios.load(name), layers)
        cands, gpu, net, gb = space(deep, gpus)
        for c in rng.sample(cands, min(per_case, len(cands))):
            rows.append(_row(name, apply(deep, c, gpus=gpus, gpu=gpu, network=net, global_batch=gb), c.label()))
    return [r for r in rows if r is not None]


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for name in dict.fromkeys((r["scenario"], r["gpus"]) for r in rows):
        rs = [r for r in rows if (r["scenario"], r["gpus"]) == name]
        out.append({"scenario": name[0], "gpus": name[1], "rows": len(rs), "host_bound": sum(r["host_bound"] for r in rs),
                    "by_micro_batches": sum(r["micro_batches"] is not None for r in rs),
                    "max_step_error": max(abs(r["step_error"]) for r in rs),
                    "max_lower_bound_error": max(abs(r["lower_bound_error"]) for r in rs),
                    "max_memory_error": max(abs(r["memory_error"]) for r in rs),
                    "max_breakdown_error": max(r["breakdown_error"] for r in rs),
                    "fits_disagree": sum(not r["fits_agree"] for r in rs),
                    "speedup": sum(r["full_s"] for r in rs) / sum(r["folded_s"] for r in rs)})  # fmt: skip
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", type=int, default=140)
    ap.add_argument("--depth", type=int, default=64, help="layers per stack of the deep GEM models")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write every row here (JSON)")
    a = ap.parse_args(argv)
    if a.depth < 1 or a.layouts < 1:
        ap.error(f"--depth {a.depth} and --layouts {a.layouts} must be positive, e.g. --depth 64 --layouts 140")
    t0 = time.perf_counter()
    rows = run(a.layouts, a.depth, a.seed)
    summary = summarize(rows)
    print(f"{'scenario':<18} {'GPUs':>5} {'rows':>4} {'host':>4} {'by mb':>5} {'step err':>9} {'bound err':>9} "
          f"{'memory err':>10} {'breakdown err':>13} {'fit differs':>11} {'speed-up':>8}")  # fmt: skip
    for r in summary:
        print(f"{r['scenario']:<18} {r['gpus']:>5} {r['rows']:>4} {r['host_bound']:>4} {r['by_micro_batches']:>5} "
              f"{r['max_step_error']:>9.1e} {r['max_lower_bound_error']:>9.1e} {r['max_memory_error']:>10.1e} "
              f"{r['max_breakdown_error']:>13.1e} {r['fits_disagree']:>11} {r['speedup']:>7.1f}x")  # fmt: skip
    worst = max(rows, key=lambda r: abs(r["step_error"]))
    print(f"{len(rows)} folded layouts ({a.depth} layers per stack; {sum(r['host_bound'] for r in rows)} whose step is "
          f"the host's issue time) in {time.perf_counter() - t0:.0f} s; largest step error "
          f"{abs(worst['step_error']):.1e} ({worst['scenario']} {worst['layout']})")  # fmt: skip
    if a.out:
        write_json_atomic(a.out, {"depth": a.depth, "seed": a.seed, "summary": summary, "rows": rows})
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
