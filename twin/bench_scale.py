"""How the twin's cost grows with the cluster: time ``simulate(scenarios.load(...))`` at 8 to
100,000 GPUs on one core (issue 4, "scale by symmetry").

    python -m twin.bench_scale [--sizes 8,512,4096,16384,100000] [--repeats 3] [--out bench.json]

Each size rescales the scenario consistently: dense_shard 8 × dense_replicate N/8, expert 8,
sparse_shard = the largest divisor of N up to 1,024 × sparse_replica N/sparse_shard,
global_batch = micro_batch × N (one micro-batch per GPU). The network stays the scenario's when
it holds N GPUs; otherwise it is the smallest bundled preset that does (by ``max_gpus``). The GPU
stays the scenario's, so only the scale changes.

Per size: one warm-up run, then ``repeats`` timed runs; wall time is the median, measured around
load + simulate (what a user waits for), with simulate alone and the process's CPU time
(robust when other work shares the core) alongside. The process is pinned to
one core where the OS allows it. Targets (issue 4): ≤ 0.5 s at 4,096 GPUs, ≤ 2 s at 100,000,
and t(largest) / t(smallest) ≤ 4.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import scenarios
from hwmodels.network import get_network, list_networks
from twin.runrecord import write_json_atomic
from twin.simulate import simulate

DEFAULT_SCENARIO = "gem-h100-4k"
DEFAULT_SIZES_GPUS = (8, 512, 4_096, 16_384, 100_000)
DENSE_SHARD = 8
EXPERT = 8
MAX_SPARSE_SHARD = 1_024
TARGET_WALL_S = {4_096: 0.5, 100_000: 2.0}
TARGET_RATIO = 4.0


def choose_network(num_gpus: int, current: str) -> str:
    """``current`` if it holds ``num_gpus``, else the smallest bundled preset that does."""
    if get_network(current).max_gpus >= num_gpus:
        return current
    fits = sorted((get_network(n).max_gpus, n) for n in list_networks())
    for max_gpus, name in fits:
        if max_gpus >= num_gpus:
            return name
    raise ValueError(
        f"no network preset holds {num_gpus} GPUs (largest: {fits[-1][1]}, {fits[-1][0]}); "
        "pick a smaller size"
    )


def overrides_for(num_gpus: int, scenario: str = DEFAULT_SCENARIO) -> list[str]:
    """``--set`` overrides that rescale ``scenario`` to ``num_gpus`` and keep it valid."""
    if num_gpus < DENSE_SHARD or num_gpus % DENSE_SHARD:
        raise ValueError(f"--sizes: {num_gpus} GPUs must be a multiple of {DENSE_SHARD}")
    base = scenarios.load(scenario)
    sparse_shard = max(d for d in range(1, min(num_gpus, MAX_SPARSE_SHARD) + 1) if num_gpus % d == 0)
    return [
        f"hardware.num_gpus={num_gpus}",
        f"hardware.network={choose_network(num_gpus, base.hardware.network)}",
        f"parallelism.dense_shard={DENSE_SHARD}",
        f"parallelism.dense_replicate={num_gpus // DENSE_SHARD}",
        f"parallelism.expert={EXPERT}",
        f"parallelism.sparse_shard={sparse_shard}",
        f"parallelism.sparse_replica={num_gpus // sparse_shard}",
        f"training.global_batch={base.training.micro_batch * num_gpus}",
    ]


def bench_point(
    num_gpus: int, *, scenario: str = DEFAULT_SCENARIO, repeats: int = 3, warmups: int = 1
) -> dict:
    """Time load + simulate of ``scenario`` rescaled to ``num_gpus``; medians over ``repeats``."""
    sets = overrides_for(num_gpus, scenario)
    wall_s: list[float] = []
    simulate_s: list[float] = []
    cpu_s: list[float] = []
    for i in range(warmups + repeats):
        c0 = time.process_time()
        t0 = time.perf_counter()
        s = scenarios.load(scenario, sets)
        t1 = time.perf_counter()
        result = simulate(s)
        t2 = time.perf_counter()
        c2 = time.process_time()
        if i >= warmups:
            cpu_s.append(c2 - c0)
            wall_s.append(t2 - t0)
            simulate_s.append(t2 - t1)
    return {
        "num_gpus": num_gpus,
        "network": s.hardware.network,
        "gpu": s.hardware.gpu,
        "overrides": sets,
        "wall_s": statistics.median(wall_s),
        "wall_s_runs": wall_s,
        "simulate_s": statistics.median(simulate_s),
        "cpu_s": statistics.median(cpu_s),  # this process's CPU time: robust to a busy machine
        "num_ops": result.num_ops,
        "step_time_s": result.step_time_s,
        "mfu": result.mfu,
    }


def run_bench(
    sizes_gpus: tuple[int, ...] = DEFAULT_SIZES_GPUS,
    *,
    scenario: str = DEFAULT_SCENARIO,
    repeats: int = 3,
    warmups: int = 1,
) -> dict:
    """Every size in turn; the document ``--out`` writes."""
    if repeats < 1 or warmups < 0:
        raise ValueError(f"--repeats ({repeats}) must be >= 1 and warm-ups ({warmups}) >= 0")
    if not sizes_gpus:
        raise ValueError("--sizes: give at least one GPU count")
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else None
    core = min(allowed) if allowed else None
    try:
        if allowed:
            os.sched_setaffinity(0, {core})  # one core; restored below
        points = [
            bench_point(n, scenario=scenario, repeats=repeats, warmups=warmups)
            for n in sizes_gpus
        ]
    finally:
        if allowed:
            os.sched_setaffinity(0, allowed)
    by_size = {p["num_gpus"]: p for p in points}
    smallest, largest = by_size[min(by_size)], by_size[max(by_size)]
    ratio = largest["wall_s"] / smallest["wall_s"]
    targets = [
        {"what": f"wall_s at {n:,} GPUs", "target": limit, "value": by_size[n]["wall_s"],
         "met": by_size[n]["wall_s"] <= limit}
        for n, limit in TARGET_WALL_S.items() if n in by_size
    ]  # fmt: skip
    if len(by_size) > 1:
        targets.append(
            {"what": f"wall_s ratio {largest['num_gpus']:,} / {smallest['num_gpus']:,} GPUs",
             "target": TARGET_RATIO, "value": ratio, "met": ratio <= TARGET_RATIO}
        )  # fmt: skip
    return {
        "scenario": scenario,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "machine": platform.platform(),
        "pinned_core": core,
        "repeats": repeats,
        "warmups": warmups,
        "timed": "scenarios.load + twin.simulate.simulate, median wall seconds",
        "points": points,
        "ratio_largest_to_smallest": ratio,
        "targets": targets,
    }


def format_table(doc: dict) -> str:
    lines = [
        f"{'GPUs':>8}  {'network':<16} {'wall s':>8} {'sim s':>8} {'cpu s':>8} {'ops':>6}"
        f" {'step ms':>9}",
    ]
    for p in doc["points"]:
        lines.append(
            f"{p['num_gpus']:>8,}  {p['network']:<16} {p['wall_s']:>8.3f} {p['simulate_s']:>8.3f}"
            f" {p['cpu_s']:>8.3f} {p['num_ops']:>6} {p['step_time_s'] * 1e3:>9.1f}"
        )
    first, last = doc["points"][0]["num_gpus"], doc["points"][-1]["num_gpus"]
    lines.append(f"ratio t({last:,}) / t({first:,}) = {doc['ratio_largest_to_smallest']:.2f}")
    for t in doc["targets"]:
        mark = "met" if t["met"] else "MISSED"
        lines.append(f"target {t['what']} <= {t['target']}: {t['value']:.3f} {mark}")
    return "\n".join(lines)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sizes '{text}' must be GPU counts separated by commas, e.g. 8,512,4096"
        ) from None
    return tuple(sorted(set(sizes)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m twin.bench_scale", description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default=DEFAULT_SCENARIO)
    ap.add_argument("--sizes", type=_sizes, default=DEFAULT_SIZES_GPUS, help="GPU counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per size (median)")
    ap.add_argument("--warmups", type=int, default=1, help="untimed runs per size first")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = ap.parse_args(argv)
    try:
        doc = run_bench(args.sizes, scenario=args.scenario, repeats=args.repeats, warmups=args.warmups)
        print(format_table(doc))
        if args.out is not None:
            if args.out.is_dir():
                raise ValueError(f"--out {args.out} is a folder; give a file name")
            write_json_atomic(args.out, doc)
            print(f"wrote {args.out}")
    except ValueError as e:  # ScenarioError is a ValueError
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
