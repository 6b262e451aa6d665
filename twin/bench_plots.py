"""How ``plot_timeline``'s cost grows with the spans it draws, measured side by side in one run.

    python -m twin.bench_plots [--layers 3,100,1000] [--repeats 3]

Each size is a synthetic timeline of ``layers`` layers (per layer and phase, fwd and bwd: a gemm
and a norm on compute and a collective on one axis; then an all-reduce and the optimizer):
``6 × layers + 2`` spans. Each plot is drawn and rendered to PNG (in a temporary folder) ``repeats``
times; the best time is reported with its ratio to the smallest size's. Spans share one bar
collection per (stream, colour), so the time should grow far slower than the spans do:
``tests/twin/test_plots.py`` checks the collections, this reports what they buy.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from twin.engine import Span, Timeline
from twin.plots import plot_timeline

DEFAULT_LAYERS = (3, 100, 1_000)


def synthetic_timeline(layers: int) -> Timeline:
    """``6 × layers + 2`` spans on three streams: compute, comm.dense_shard, comm.dense_replicate."""
    spans, t = [], 0.0
    for phase, kind in (("fwd", "all_gather"), ("bwd", "reduce_scatter")):
        for i in range(layers):
            spans.append(Span(f"l{i}.gemm.{phase}", "compute", t, t + 2e-3, "gemm", phase))
            spans.append(Span(f"l{i}.norm.{phase}", "compute", t + 2e-3, t + 2.5e-3, "norm", phase))
            spans.append(Span(f"l{i}.{kind}", "comm.dense_shard", t, t + 1e-3, kind, phase,
                              axis="dense_shard"))  # fmt: skip
            t += 2.5e-3
    spans.append(Span("grads.all_reduce", "comm.dense_replicate", t, t + 4e-3, "all_reduce", "bwd",
                      axis="dense_replicate"))  # fmt: skip
    spans.append(Span("opt", "compute", t + 4e-3, t + 5e-3, "optimizer", "opt"))
    return Timeline.from_spans(spans)


def run_bench(layers: tuple[int, ...] = DEFAULT_LAYERS, *, repeats: int = 3) -> list[dict]:
    """One row per size: spans, best seconds per plot, and both ratios to the smallest size."""
    if repeats < 1 or not layers or min(layers) < 1:
        raise ValueError(f"--layers ({layers}) must be >= 1 each and --repeats ({repeats}) >= 1")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for n in sorted(layers):
            timeline = synthetic_timeline(n)
            best_s = min(_time_plot(timeline, Path(folder) / f"t{n}.png") for _ in range(repeats))
            rows.append({"layers": n, "spans": len(timeline.spans), "best_s": best_s})
    for row in rows:
        row["time_ratio"] = row["best_s"] / rows[0]["best_s"]
        row["span_ratio"] = row["spans"] / rows[0]["spans"]
    return rows


def _time_plot(timeline: Timeline, path: Path) -> float:
    t0 = time.perf_counter()
    plot_timeline(timeline, path)
    return time.perf_counter() - t0


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'spans':>7}  {'s per plot':>10}  {'time ratio':>10}  {'span ratio':>10}"]
    lines += [f"{r['spans']:>7,}  {r['best_s']:>10.3f}  {r['time_ratio']:>9.1f}x  {r['span_ratio']:>9.0f}x"
              for r in rows]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default=",".join(map(str, DEFAULT_LAYERS)),
                        help="comma-separated layer counts (6 spans each)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    layers = tuple(int(x) for x in args.layers.split(",") if x.strip())
    print(format_rows(run_bench(layers, repeats=args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
