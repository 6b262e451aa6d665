"""Fit the Hopper ``norm`` efficiency curve (``efficiency.yaml``) to the norms the executor runs.

The CUDA executor compiles the model (Inductor), so its LayerNorms are Inductor's fused Triton
kernels (``triton_per_fused__to_copy_native_layer_norm_*`` forward, ``..._native_layer_norm_backward_*``
backward), not torch's eager ``layer_norm``. They were measured on the lent H200 by
``executor/bench/ffn_bench.py`` (``FFN_BENCH``): the sequence layer's FFN half at gem-h200-1gpu's
shape, ``S + ffn2(gelu(ffn1(LN(S))))`` on ``S [196,608, 512]`` bf16 under autocast, compiled as the
executor compiles it, each kernel's device time from the profiler. Every variant of that bench
without max-autotune ran the same two norm kernels: their median is one forward and one backward row.

The twin counts a norm's bytes as ``twin/flops.py`` does (forward: read x, write y; backward: read x
and dy, write dx). The fit keeps ``x_half_bytes`` (elementwise's: the rows are at one size) and sets
``eff_max`` by minimax relative error over the two rows, launch time 5 µs. Torch's eager
``layer_norm`` (the kernel sweep's rows) is printed beside it: the eager executor's norms
(``compile: false``, the reference executor) keep the rate of those rows through ``execution.yaml``
``eager_norm``, the ratio of the two efficiencies::

    python -m hwmodels.bench.fit_norm
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from hwmodels.gpus import get_gpu
from hwmodels.kernels import memory_curve

ROOT = Path(__file__).resolve().parents[2]
FFN_BENCH = ROOT / "hwmodels/data/runs/h200-2026-11-30-executor/s16-ffn-bench.json"
SWEEP = ROOT / "hwmodels/data/measured/h200_kernel_sweep_2026-11-30.json"
LAUNCH_S = 5e-6
ELEM = 2  # bf16


def rows() -> list[tuple[str, float, float]]:
    """(label, twin bytes, measured seconds) of the compiled norm's forward and backward."""
    bench = json.loads(FFN_BENCH.read_text())
    T, d = bench["shape"]["tokens"], bench["shape"]["d"]
    fwd, bwd = [], []
    for name, v in bench["variants"].items():
        if name.startswith("max_autotune"):
            continue
        for k, ms in v["kernels_ms"].items():
            if "layer_norm" in k:
                (bwd if "backward" in k else fwd).append(ms * 1e-3)
    b = ELEM * T * d
    return [(f"compiled LN fwd [{T}, {d}] (median of {len(fwd)})", 2 * b, statistics.median(fwd)),
            (f"compiled LN bwd [{T}, {d}] (median of {len(bwd)})", 3 * b, statistics.median(bwd))]


def fit(data: list[tuple[str, float, float]], bw: float, x_half: float) -> tuple[float, float]:
    """``eff_max`` minimizing the largest relative error of ``(bytes + x_half) / (bw eff) + launch``."""
    best = (1.0, float("inf"))
    for i in range(300, 1001):
        eff = i / 1000
        err = max(abs(((b + x_half) / (bw * eff) + LAUNCH_S) / t - 1) for _, b, t in data)
        if err < best[1]:
            best = (eff, err)
    return best


def eager_rows() -> list[tuple[str, float, float]]:
    """Torch's eager ``layer_norm`` rows of the kernel sweep (label, bytes as the sweep counts them, s)."""
    sweep = json.loads(SWEEP.read_text())
    return [(r["name"], r["bytes"], r["time_s"]) for r in sweep["rows"]
            if r["name"].startswith("layer_norm") and "time_s" in r]


def main() -> None:
    gpu = get_gpu("h200")
    bw = gpu.hbm_bw_Bps
    x_half = memory_curve(gpu, "elementwise")[1]
    data = rows()
    eff, err = fit(data, bw, x_half)
    print(f"norm (compiled, Inductor): memory eff_max {eff:.3f} x_half_bytes {x_half:.3g}; max err {err:.1%} "
          f"over {len(data)} rows ({FFN_BENCH.relative_to(ROOT)})")
    for label, b, t in data:
        pred = (b + x_half) / (bw * eff) + LAUNCH_S
        print(f"    {label:44s} measured {t * 1e3:7.3f} ms  model {pred * 1e3:7.3f} ms  {pred / t - 1:+6.1%}"
              f"  ({b / t / 1e12:.2f} TB/s of the twin's bytes)")
    eager = eager_rows()
    print(f"torch eager layer_norm ({SWEEP.relative_to(ROOT)}): the twin's eager norms (execution.yaml eager_norm)")
    for label, b, t in eager:
        print(f"    {label:44s} measured {t * 1e3:7.3f} ms  {b / t / 1e12:.2f} TB/s = {b / t / bw:.3f} of the HBM rate")


if __name__ == "__main__":
    main()
