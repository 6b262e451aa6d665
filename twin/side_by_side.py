"""Independent pure computations run side by side in forked processes (torch-free).

``side_by_side(calls)`` returns ``[call() for call in calls]``: the first runs here, each other one
in a child process forked for it, which sends back its pickled result (or exception) and exits.
A child is a copy of this process, so it computes the very numbers this process would; whatever
it caches is lost with it. Worth it for calls of a tenth of a second and more (a fork and its
result's trip cost a few milliseconds) whose results are small: the planner simulates a deep
model's two shallow copies (``twin.fold``) side by side, so that a forecast's row uses a CPU its
neighbour has left idle.

Where ``os.fork`` is missing, or only one CPU is ours, the calls run here in turn.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def side_by_side(calls: Sequence[Callable[[], T]]) -> list[T]:
    """``[call() for call in calls]``, the calls after the first each in a forked child (module
    docstring); a call's exception is raised here, the first one's in order."""
    if len(calls) < 2 or not hasattr(os, "fork") or _cpus() < 2:
        return [call() for call in calls]
    children = [_fork(call) for call in calls[1:]]
    try:
        first = calls[0]()
    finally:
        rest = [_join(*child) for child in children]
    out = [first]
    for ok, value in rest:
        if not ok:
            raise value
        out.append(value)
    return out


def _fork(call: Callable[[], T]) -> tuple[int, int]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send, exit without running the parent's clean-up
        status = 0
        try:
            os.close(read)
            try:
                data = pickle.dumps((True, call()), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException as e:  # noqa: BLE001 - sent back and raised in the parent
                data = pickle.dumps((False, e), protocol=pickle.HIGHEST_PROTOCOL)
            view = memoryview(data)
            while view:
                view = view[os.write(write, view):]
        except BaseException:  # noqa: BLE001 - the parent sees no result and says so
            status = 1
        finally:
            os._exit(status)
    os.close(write)
    return pid, read


def _join(pid: int, read: int) -> tuple[bool, object]:
    chunks = []
    with os.fdopen(read, "rb") as f:
        while chunk := f.read(1 << 20):
            chunks.append(chunk)
    os.waitpid(pid, 0)
    if not chunks:
        return False, RuntimeError(f"side_by_side: child process {pid} ended without a result")
    return pickle.loads(b"".join(chunks))
