"""Collective cost query speed (issue 3 part 6): python -m hwmodels.bench.collective_speed

Cold = every call a new (kind, size, group) so the memo misses (full algorithm search); warm =
the twin's pattern, the same few collectives asked again and again (memo hit).
"""

from __future__ import annotations

import itertools
import time

from hwmodels.collectives import COLLECTIVE_KINDS, _MEMO, collective_cost
from hwmodels.network import get_network


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
    for k, v in bench().items():
        print(f"{k}: {v:.2f}")
