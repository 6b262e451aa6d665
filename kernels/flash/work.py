"""Work lists: which (sample, tile) each program of a launch takes, longest sample first.

A list costs an argsort, a cumsum and a plan kernel (``_kernels._plan_kernel``); a training step
calls the core ~30 times (each layer's forward, dK/dV and dQ kernels) over one or two offsets
tensors, so lists are kept in a ``WorkCache`` and reused. No cache lives in a module: the
caller owns it, and the ops (``kernels/attention/op.py``) use the one that an offsets tensor
carries (``WorkCache.of``), so it lives and dies with the batch's offsets.

An entry is used only for the very tensors (weak references) at the very versions
(``_version``: every in-place write bumps it) it was built from. Lists built during a CUDA graph
capture serve only launches captured after them (the graph rebuilds them on every replay), and
lists built outside a capture never serve a captured launch (the graph would replay a fixed list
while the offsets change). ``WorkCache.scope()`` empties a cache on entry and exit (a cache that
one caller keeps across several captures of the same offsets tensors).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

import torch
from torch import Tensor

from kernels.flash import _kernels as K

Work = tuple[int, Tensor]  # (n_items, plan [n_items, 8] int32): records of ``_plan_kernel``


class WorkCache:
    """Work lists already built, keyed by the offsets tensors, their versions and the launch."""

    _ATTR = "_gemtwin_work_cache"

    def __init__(self, max_entries: int = 64):
        self.max_entries = max_entries
        self._entries: dict[tuple, tuple] = {}

    @classmethod
    def of(cls, offsets: Tensor) -> WorkCache | None:
        """The cache that ``offsets`` carries (made on first use); None for an inference tensor,
        which has no version counter to tell a rewrite."""
        if offsets.is_inference():
            return None
        cache = getattr(offsets, cls._ATTR, None)
        if cache is None:
            cache = cls()
            setattr(offsets, cls._ATTR, cache)
        return cache

    def __len__(self) -> int:
        return len(self._entries)

    def __reduce__(self):  # a copied or pickled offsets tensor carries an empty cache
        return (WorkCache, (self.max_entries,))

    def __deepcopy__(self, memo) -> WorkCache:
        return WorkCache(self.max_entries)

    def clear(self) -> None:
        self._entries.clear()

    @contextlib.contextmanager
    def scope(self) -> Iterator[WorkCache]:
        """Empty on entry and on exit: lists built inside are shared inside and forgotten after."""
        self.clear()
        try:
            yield self
        finally:
            self.clear()

    def get(self, own_off: Tensor, other_off: Tensor, tile: int, max_len: int, total: int,
            reverse: bool) -> Work | None:
        """``work(...)``'s list, from the cache when these tensors at these versions made one."""
        if own_off.is_inference() or other_off.is_inference():  # (no version counter)
            return build_work(own_off, other_off, tile, max_len, total, reverse)
        capturing = own_off.is_cuda and torch.cuda.is_current_stream_capturing()
        key = (own_off.data_ptr(), other_off.data_ptr(), own_off._version, other_off._version,
               own_off.numel(), other_off.numel(), tile, max_len, total, reverse, capturing)
        hit = self._entries.get(key)
        if hit is not None and hit[0]() is own_off and hit[1]() is other_off:
            return hit[2]
        work = build_work(own_off, other_off, tile, max_len, total, reverse)
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (weakref.ref(own_off), weakref.ref(other_off), work)
        return work


def work(own_off: Tensor, other_off: Tensor, tile: int, max_len: int, total: int, reverse: bool,
         cache: WorkCache | None = None) -> Work | None:
    """Work list over tiles of ``tile`` rows of each sample's own side, ordered by the other
    side's length (the cost of a tile), descending (records: see ``_plan_kernel``). ``reverse``:
    a sample's last tile first (causal: the last query tiles are the heaviest). No host sync:
    the grid is sized by a bound from ``max_len`` and the row count; programs past the last
    item exit at once. None when there is no item. ``cache``: reuse lists (else build)."""
    if cache is None:
        return build_work(own_off, other_off, tile, max_len, total, reverse)
    return cache.get(own_off, other_off, tile, max_len, total, reverse)


def build_work(own_off: Tensor, other_off: Tensor, tile: int, max_len: int, total: int,
               reverse: bool) -> Work | None:
    B = own_off.numel() - 1
    n_items = min(B * -(-max_len // tile), (total + B * (tile - 1)) // tile)
    if n_items <= 0:
        return None
    own_len = own_off[1:] - own_off[:-1]
    key_len = own_len if other_off is own_off else other_off[1:] - other_off[:-1]
    order = torch.argsort(key_len, descending=True, stable=True)
    ntiles = torch.div(own_len.index_select(0, order) + (tile - 1), tile, rounding_mode="floor")
    ends = torch.cumsum(ntiles, 0)
    plan = torch.empty((n_items, 8), dtype=torch.int32, device=own_off.device)
    BLOCK = 256
    K._plan_kernel[(-(-n_items // BLOCK),)](
        plan, ends, order, ntiles, own_off, other_off, n_items, B, B.bit_length() + 1,
        REVERSE=reverse, BLOCK=BLOCK, num_warps=4,
    )
    return n_items, plan
