"""Per-kernel device time of a ``gemtwin train --trace`` profiler trace (Chrome JSON, .gz or not).

Sums every GPU event (kernels, memcpy, memset) by name over the trace and divides by the
profiled steps (the RunRecord's ``profiled_steps``, or ``--steps``), so the rows read as
milliseconds and launches per step; the op-class split of the RunRecord says *which* layer of
the model a kernel belongs to, this says which kernel it is.

    python3 executor/bench/trace_kernels.py OUT/s9.trace.json.gz [--record OUT/s9.json] [--top 60]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def kernel_table(trace: dict, steps: int) -> list[tuple[str, float, float]]:
    """``[(name, ms per step, launches per step)]``, longest first."""
    total, calls = defaultdict(float), defaultdict(int)
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            total[e["name"]] += float(e.get("dur", 0.0)) * 1e-3  # trace durations are in µs
            calls[e["name"]] += 1
    rows = [(n, t / steps, calls[n] / steps) for n, t in total.items()]
    return sorted(rows, key=lambda r: -r[1])


def main(argv=None) -> list[tuple[str, float, float]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--record", help="the run's RunRecord JSON (for profiled_steps)")
    p.add_argument("--steps", type=int, default=0, help="profiled steps (default: from --record, else 1)")
    p.add_argument("--top", type=int, default=60)
    args = p.parse_args(argv)
    path = Path(args.trace)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    steps = args.steps or (json.loads(Path(args.record).read_text())["profiled_steps"] if args.record else 1)
    rows = kernel_table(trace, max(steps, 1))
    busy = sum(r[1] for r in rows)
    print(f"{path.name}: {len(rows)} kernels, {busy:.2f} ms of GPU events per step over {steps} profiled steps")
    print(f"{'ms/step':>8} {'share':>6} {'calls':>6}  kernel")
    for name, ms, n in rows[: args.top]:
        print(f"{ms:8.3f} {ms / busy:6.1%} {n:6.1f}  {name[:110]}")
    return rows


if __name__ == "__main__":
    main()
