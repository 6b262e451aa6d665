"""One memo for pure functions of a scenario's objects, which a planner or a sweep calls for
thousands of layouts that share them (torch-free).

``memo(table, owners, key, make)`` returns ``make()`` once per ``key`` and ``owners``: the owners
(the model, an op list) are keyed by identity, because hashing them by value costs what the call
saves, and are kept alive with their entry, so that no other object can take their id while it
is cached. A key that cannot be hashed (a section holding a dict) is not cached; a table past
``cap`` entries starts again empty. Callers must not change what it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


def memo(table: dict, owners: tuple, key: Hashable, make: Callable[[], T], *, cap: int = 4096) -> T:
    full = (*map(id, owners), key)
    try:
        hit = table.get(full)
    except TypeError:
        return make()
    if hit is None:  # (a hit's owners are these very objects: its entry keeps them alive, ids and all)
        if len(table) > cap:
            table.clear()
        hit = table[full] = (owners, make())
    return hit[1]


__all__ = ["memo"]
