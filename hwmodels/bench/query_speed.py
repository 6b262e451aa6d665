"""Cost query speed (issue 3 part 6): python -m hwmodels.bench.query_speed

Kernel: one ``kernel_cost(kind=...)`` per call, kinds and sizes varying. Collective: cold =
every call a new (kind, size, group) so the memo misses (full algorithm search); warm = the
twin's pattern, the same few collectives asked again and again (memo hit). Best of 3 runs.
"""

from __future__ import annotations

import itertools
import time

from hwmodels.collectives import COLLECTIVE_KINDS, _MEMO, collective_cost
from hwmodels.gpus import get_gpu
from hwmodels.kernels import KERNEL_KINDS, kernel_cost
from hwmodels.network import get_network


def kernel_bench(n_calls: int = 200_000) -> float:
    gpu, kinds = get_gpu("h200"), list(KERNEL_KINDS)
    t0 = time.perf_counter()
    for i in range(n_calls):
        kernel_cost(kind=kinds[i % len(kinds)], flops=1e9 + i, bytes=1e6 + i, gpu=gpu, dtype="bf16")
    return (time.perf_counter() - t0) / n_calls


def bench(n_calls: int = 200_000) -> dict[str, float]:
    net = get_network("h100-roce-3tier")
    groups = [(8, 1), (16, 1), (64, 1), (8, 16), (256, 1), (4096, 1)]
    combos = list(itertools.product(COLLECTIVE_KINDS, groups))
    _MEMO.clear()
    t0 = time.perf_counter()
    for i in range(n_calls):  # distinct sizes: always a memo miss
        kind, (n, s) = combos[i % len(combos)]
        collective_cost(kind=kind, msg_bytes=1000 + i, group_size=n, network=net, stride=s)
    cold = (time.perf_counter() - t0) / n_calls
    _MEMO.clear()
    t0 = time.perf_counter()
    for i in range(n_calls):
        kind, (n, s) = combos[i % len(combos)]
        collective_cost(kind=kind, msg_bytes=16 << 20, group_size=n, network=net, stride=s)
    warm = (time.perf_counter() - t0) / n_calls
    return {"cold_us_per_call": cold * 1e6, "warm_us_per_call": warm * 1e6}


if __name__ == "__main__":
    coll = [bench(50_000) for _ in range(3)]
    rows = {
        "kernel_cost (kind=...)": min(kernel_bench(100_000) for _ in range(3)) * 1e6,
        "collective_cost, cold (memo miss)": min(c["cold_us_per_call"] for c in coll),
        "collective_cost, warm (memo hit)": min(c["warm_us_per_call"] for c in coll),
    }
    for name, us in rows.items():
        print(f"{name:36s} {us:6.2f} µs per call")
