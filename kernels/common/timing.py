"""The benches' timer of GPU work as a training step runs it: captured once, replayed.

``replay_ms(fn)`` captures ``fn`` as a CUDA graph (after a warm-up call on a side stream) and
times its replays with ``triton.testing.do_bench`` (median): the kernels' time with no host time
between launches, as a replayed training step (``executor/graphs.py``) runs them.
"""

from __future__ import annotations

from typing import Callable

import torch


def replay_ms(fn: Callable[[], object], *, rep: int = 150) -> float:
    """Median ms of ``fn``'s graph replays (``rep`` ms of them, after 25 ms of warm-up)."""
    import triton

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=25, rep=rep, return_mode="median")
