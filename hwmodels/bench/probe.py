"""``gemtwin hw probe``'s measuring half: this machine's GEMM rate, copy bandwidth and gloo collectives.

Imports torch (nothing in hwmodels imports this file; twin/cli.py does, inside the command). The
timers are hwmodels/bench/cpu_profile.py's (``time_mm``, ``time_copy``, ``gloo_sweep``); unlike that
campaign (the fastest call of several passes), a probe keeps each case's MEDIAN call: it measures
the machine as it is now, in one pass, inside ``budget_s``. hwmodels/profile.py turns the result
into a profile (``build_profile``) and fits the collectives' alpha/beta.
"""

from __future__ import annotations

import os
import platform
import time
from datetime import UTC, datetime

import torch

from hwmodels.bench.cpu_profile import _lscpu, _mem_total_bytes, gloo_sweep, time_copy, time_mm

GEMM_SIZES = {"fp32": (128, 256, 512, 1024), "bf16": (128, 256)}  # squares; bf16 is ~60x slower without AMX
COPY_ELEMS = (1 << 20, 1 << 24, 1 << 25)  # fp32: 4 MiB (cache), 64 and 128 MiB (DRAM: >= 2 x a 32 MiB L3)
# measuring order: the first two (both kinds at each) already fix a line; later ones refine it
GLOO_SIZES = (4, 1 << 20, 65536, 4 << 20, 4096, 262144, 16 << 20)
GLOO_REPS = {4: 60, 4096: 60, 65536: 60, 262144: 30, 1 << 20: 30, 4 << 20: 24, 16 << 20: 15}  # medians: the deadline cuts
SPAWN_S = 10.0  # assumption: starting the ranks (each imports torch) and joining them, on 2 loaded cores


def env() -> dict:
    lscpu = _lscpu()
    return {"host": platform.node(), "time_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "torch": str(torch.__version__), "threads": torch.get_num_threads(), "cores": os.cpu_count() or 1,
            "mem_total_bytes": _mem_total_bytes(), "cpu_model": lscpu.get("Model name", "CPU"),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def gemm_rows(case_s: float) -> list[dict]:
    rows = []
    for dtype, sizes in GEMM_SIZES.items():
        for n in sizes:
            t, flops, _ = time_mm(n, n, n, dtype, budget_s=case_s)
            rows.append({"dtype": dtype, "m": n, "k": n, "n": n, "time_s": t["time_s"], "median_s": t["median_s"],
                         "calls": t["calls"], "flops_per_s": flops / t["median_s"]})
    return rows


def copy_rows(case_s: float) -> list[dict]:
    rows = []
    for n in COPY_ELEMS:
        t = time_copy(n, budget_s=case_s)
        rows.append({"elems": n, "bytes": 8 * n, "time_s": t["time_s"], "median_s": t["median_s"],
                     "calls": t["calls"], "Bps": 8 * n / t["median_s"]})
    return rows


def collective_rows(ranks: int, sweep_s: float) -> dict[str, list[dict]]:
    """all_reduce and all_to_all at ``GLOO_SIZES``, size by size, until ``sweep_s`` after the ranks
    start (at least two sizes, for the fit)."""
    kinds = ("all_reduce", "all_to_all")
    plan = {"kinds": kinds, "sizes": GLOO_SIZES, "max_bytes": max(GLOO_SIZES), "reps": GLOO_REPS, "by_size": True,
            "quiet": True, "deadline_s": max(sweep_s, 0.0), "min_cases": 2 * len(kinds)}
    rows = gloo_sweep(ranks, plan)
    return {k: [{f: r[f] for f in ("msg_bytes", "time_s", "median_s", "calls")} for r in rows if r["kind"] == k]
            for k in kinds}


def measure(*, ranks: int = 2, budget_s: float = 50.0) -> dict:
    """Every measurement of a probe, in about ``budget_s`` seconds: ~20% GEMMs, ~10% copies, the rest
    (less the ranks' start-up, ``SPAWN_S``) gloo collectives between ``ranks`` local processes."""
    if ranks < 2:
        raise ValueError(f"--ranks ({ranks}) must be >= 2: the collectives run between local processes")
    if budget_s <= 0:
        raise ValueError(f"--budget-s ({budget_s}) must be > 0")
    t0 = time.perf_counter()
    e = env()
    n_gemm = sum(map(len, GEMM_SIZES.values()))
    gemm = gemm_rows(0.2 * budget_s / n_gemm)
    copy = copy_rows(0.1 * budget_s / len(COPY_ELEMS))
    left = budget_s - (time.perf_counter() - t0)
    coll = collective_rows(ranks, left - SPAWN_S)
    return {"env": e, "ranks": ranks, "budget_s": budget_s, "wall_s": round(time.perf_counter() - t0, 2),
            "statistic": "median call of each case (perf_counter around one call after a warm-up; collectives: "
                         "after a barrier, the max over ranks of each rank's median)",
            "gemm": gemm, "copy": copy, "collectives": coll}
