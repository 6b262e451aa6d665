"""How long planning takes, as ratios to one ``simulate`` of the same scenario timed beside it
(issue 26: these machines are noisy, a ratio measured side by side is not).

    python -m twin.bench_plan [--parts plan,forecast-1gpu,forecast-4k] [--out bench_plan.json]

Parts, each with its target (issue 26):
- ``plan``: ``plan(gem-h100-4k, gpus=4096)`` over the full space, the CLI's default budget:
  ≤ 25× one simulate;
- ``forecast-1gpu``: ``forecast(gem-h200-1gpu)`` with the CLI's defaults (a year's rows in
  parallel, one process per CPU): ≤ 50×;
- ``forecast-4k``: ``forecast(gem-h100-4k, years=3)`` over the default roadmap: ≤ 150×.
Per part: simulates of the scenario before and after it (each the median of ``--repeats`` cold
runs: load + simulate as the first call of a fresh process, what one ``gemtwin simulate`` does
past the interpreter's start), the part once; the ratio divides by the mean of the two.
Wall time (``time.perf_counter``) around library calls, no process start-up. ``--cap-s`` ends a
part that runs past it (it then reports "over", with the time it had used).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import statistics
import time
from pathlib import Path

TARGETS = {"plan": 25.0, "forecast-1gpu": 50.0, "forecast-4k": 150.0}
SCENARIO = {"plan": "gem-h100-4k", "forecast-1gpu": "gem-h200-1gpu", "forecast-4k": "gem-h100-4k"}


def _one_simulate(name: str, q) -> None:
    import scenarios
    from twin.simulate import simulate

    t0 = time.perf_counter()
    simulate(scenarios.load(name))
    q.put(time.perf_counter() - t0)


def _simulate_s(name: str, repeats: int) -> float:
    """Median of ``repeats`` cold simulates (load + simulate, the first in a fresh process, as one
    ``gemtwin simulate`` runs it: a repeat in the same process hits the twin's caches, 10x faster
    for gem-h200-1gpu)."""
    ctx = mp.get_context("spawn")
    times = []
    for _ in range(repeats):
        q = ctx.Queue()
        p = ctx.Process(target=_one_simulate, args=(name, q))
        p.start()
        times.append(q.get())
        p.join()
    return statistics.median(times)


def _run(part: str, q) -> None:
    import scenarios
    from twin.forecast import forecast
    from twin.planner import DEFAULT_BUDGET, plan

    s = scenarios.load(SCENARIO[part])
    t0 = time.perf_counter()
    if part == "plan":
        r = plan(s, gpus=4096, budget=DEFAULT_BUDGET)
        info = {"simulated": r.counts.simulated, "best": r.best.candidate.label() if r.best else None}
    else:
        r = forecast(s, years=3)
        info = {"rows": len(r.rows)}
    q.put((time.perf_counter() - t0, info))


def measure(part: str, *, repeats: int = 3, cap_s: float = 1800.0) -> dict:
    before = _simulate_s(SCENARIO[part], repeats)
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_run, args=(part, q))
    t0 = time.perf_counter()
    p.start()
    p.join(cap_s)
    over = p.is_alive()
    if over:
        p.terminate()
        p.join()
        wall, info = time.perf_counter() - t0, {}
    else:
        wall, info = q.get()
    after = _simulate_s(SCENARIO[part], repeats)
    sim = (before + after) / 2
    ratio = wall / sim
    return {"part": part, "scenario": SCENARIO[part], "wall_s": wall, "simulate_s": sim,
            "simulate_before_s": before, "simulate_after_s": after, "ratio": ratio, "target": TARGETS[part],
            "over_cap": over, "met": (not over) and ratio <= TARGETS[part], **info}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="plan,forecast-1gpu,forecast-4k")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cap-s", type=float, default=1800.0, help="end a part that runs longer (reported as over)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    parts = [p for p in a.parts.split(",") if p]
    bad = [p for p in parts if p not in TARGETS]
    if bad:
        ap.error(f"--parts: unknown {', '.join(bad)}; use {', '.join(TARGETS)}")
    rows = []
    for part in parts:
        r = measure(part, repeats=a.repeats, cap_s=a.cap_s)
        rows.append(r)
        state = "over the cap" if r["over_cap"] else ("met" if r["met"] else "missed")
        print(f"{part:14s} {r['scenario']:14s} {r['wall_s']:8.1f} s = {r['ratio']:7.0f} x one simulate "
              f"({r['simulate_s']:.3f} s)   target <= {r['target']:.0f}x: {state}", flush=True)
    if a.out:
        from twin.runrecord import write_json_atomic

        write_json_atomic(a.out, {"machine": platform.platform(), "python": platform.python_version(),
                                  "cpus": __import__("os").cpu_count(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
