"""The measured threshold table: does a Linear of shape (M, K, N) train faster in blockwise fp8?

``python -m kernels.fp8block.bench`` times a Linear's forward + backward (CUDA-graph replays,
quantization included) in bf16 and as ``Fp8BlockLinear`` over a grid of rows ``M`` (tokens of a
micro-batch), ``in_features`` ``K`` and ``out_features`` ``N``, side by side on one H200; the run is
committed as ``hwmodels/data/measured/fp8_block_h200_2026-12-04.json``. ``ratio(m, k, n)`` is the
measured bf16 / fp8 time, interpolated linearly in ``log2`` of each dim between grid points, held
at the grid's upper edges (larger matmuls favour fp8 more: a conservative hold) and scaled down in
proportion below its lower edges (an assumption, not measured: a smaller matmul's fp8 path is
dominated by its fixed quantize and launch costs, so its time stops shrinking with the work while
bf16's keeps shrinking); ``pays`` says whether a layer gains from fp8 (ratio > 1).

Both sides read this one table: ``precision.mlp: auto`` in the executor (each layer decides at
its first forward, from the rows it sees: ``kernels.fp8block.linear``) and the twin (each GEMM op
from its ``m, k, n``: ``twin.flops``, priced as its bf16 time over the ratio: ``twin.workload``).
Torch-free.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from functools import lru_cache
from pathlib import Path

from kernels.fp8block import eligible

TABLE = Path(__file__).resolve().parents[2] / "hwmodels" / "data" / "measured" / "fp8_block_h200_2026-12-04.json"
HOPPER = ("h100", "h200", "gh200")  # cuBLASLt's 1x128 / 128x128 block-scaled GEMM: sm_90 only


@lru_cache(maxsize=4)
def _grid(path: str) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...], dict]:
    rows = json.loads(Path(path).read_text())["table"]
    ms, ks, ns = (tuple(sorted({float(r[a]) for r in rows})) for a in ("m", "k", "n"))
    return ms, ks, ns, {(float(r["m"]), float(r["k"]), float(r["n"])): float(r["ratio"]) for r in rows}


def _bracket(axis: tuple[float, ...], x: float) -> tuple[float, float, float]:
    """(lo, hi, weight of hi) for ``x`` on a sorted grid, in log2, clamped to its ends."""
    if x <= axis[0]:
        return axis[0], axis[0], 0.0
    if x >= axis[-1]:
        return axis[-1], axis[-1], 0.0
    i = bisect_right(axis, x)
    lo, hi = axis[i - 1], axis[i]
    return lo, hi, (math.log2(x) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))


def ratio(m: float, k: float, n: float, path: Path = TABLE) -> float:
    """Measured bf16 time / blockwise-fp8 time of a Linear's forward + backward at ``(m, k, n)``."""
    ms, ks, ns, vals = _grid(str(path))
    (m0, m1, wm), (k0, k1, wk), (n0, n1, wn) = _bracket(ms, m), _bracket(ks, k), _bracket(ns, n)
    out = 0.0
    for mm, a in ((m0, 1 - wm), (m1, wm)):
        for kk, b in ((k0, 1 - wk), (k1, wk)):
            for nn, c in ((n0, 1 - wn), (n1, wn)):
                if a * b * c:
                    out += a * b * c * vals[(mm, kk, nn)]
    for x, axis in ((m, ms), (k, ks), (n, ns)):  # below the grid: in proportion (module docstring)
        out *= min(1.0, x / axis[0])
    return out


def pays(m: float, k: float, n: float, path: Path = TABLE) -> bool:
    """Whether a Linear ``k -> n`` over ``m`` rows runs faster in blockwise fp8 (both widths
    multiples of 128, and a measured ratio above 1)."""
    return eligible(int(k), int(n)) and ratio(m, k, n, path) > 1.0


def check_gpu(gpu: str, what: str) -> None:
    """One-line error for blockwise fp8 off Hopper."""
    if gpu not in HOPPER:
        raise ValueError(f"{what} = 'fp8_block' needs a Hopper GPU (cuBLASLt's block-scaled fp8 GEMM is sm_90 "
                         f"only); {gpu!r} is not one: use mxfp8 on Blackwell, bf16 elsewhere")


__all__ = ["HOPPER", "TABLE", "check_gpu", "pays", "ratio"]
