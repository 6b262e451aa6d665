"""Storage and id layouts of a table-batched lookup (torch only, no Triton).

``FusedTables``: the tables of one group (same dim, same dtype) live in one contiguous buffer
``[Σ rows, dim]``; each table is a view (so a per-table ``nn.Parameter`` aliases it, and its
optimizer updates land in the buffer). The kernel reads the buffer with per-table row starts.

``pack_bags``: per-table ``(values, offsets)`` → one ``indices`` vector (table 0's ids first)
and table-major ``offsets [T·B + 1]`` into it: bag ``t·B + b`` is
``indices[offsets[t·B+b] : offsets[t·B+b+1]]`` (FBGEMM's TBE layout).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class FusedTables:
    """``rows`` tables of ``dim`` columns in one buffer; ``views()`` are the per-table tables."""

    def __init__(self, rows: Sequence[int], dim: int, *, dtype=torch.float32, device=None):
        if not rows or any(r <= 0 for r in rows):
            raise ValueError(f"rows = {list(rows)}: every table needs at least one row")
        self.rows, self.dim = [int(r) for r in rows], int(dim)
        self.row_starts = [0]
        for r in self.rows:
            self.row_starts.append(self.row_starts[-1] + r)
        self.buffer = torch.empty(self.row_starts[-1], dim, dtype=dtype, device=device)
        self._row_starts_dev: dict = {}
        # an optimizer the lookups' backward applies itself (``tbe.RowwiseAdagradInBackward``), or None
        self.in_backward = None

    def views(self) -> list[Tensor]:
        return [self.buffer[a:b] for a, b in zip(self.row_starts[:-1], self.row_starts[1:])]

    def cast(self, dtype: torch.dtype) -> None:
        """Re-make the buffer in ``dtype`` (callers re-point their views with ``views()``)."""
        self.buffer = self.buffer.to(dtype)
        self._row_starts_dev.clear()

    def row_starts_on(self, device: torch.device) -> Tensor:
        """``row_starts[:-1]`` as an int64 tensor on ``device`` (cached)."""
        t = self._row_starts_dev.get(device)
        if t is None:
            t = torch.tensor(self.row_starts[:-1], dtype=torch.int64, device=device)
            self._row_starts_dev[device] = t
        return t

    def bounds_on(self, device: torch.device) -> Tensor:
        """All ``row_starts`` (``T+1`` entries, the last = total rows) as int64 on ``device`` (cached)."""
        key = ("bounds", device)
        t = self._row_starts_dev.get(key)
        if t is None:
            t = torch.tensor(self.row_starts, dtype=torch.int64, device=device)
            self._row_starts_dev[key] = t
        return t

    def holds(self, tables: Sequence[Tensor]) -> bool:
        """Whether ``tables`` are still this buffer's views (``Module.to`` etc. may have copied them)."""
        if len(tables) != len(self.rows):
            return False
        base = self.buffer.data_ptr()
        row_bytes = self.dim * self.buffer.element_size()
        return all(
            w.dtype == self.buffer.dtype and w.device == self.buffer.device
            and w.data_ptr() == base + a * row_bytes and tuple(w.shape) == (r, self.dim)
            for w, a, r in zip(tables, self.row_starts, self.rows)
        )


def pack_bags(bags: Sequence[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Per-table ``(values, offsets [B+1])`` (same B) → ``(indices, offsets [T·B+1])`` int64."""
    if not bags:
        raise ValueError("pack_bags: no tables; pass at least one (values, offsets)")
    B = len(bags[0][1]) - 1
    parts, offs, base = [], [], 0
    for t, (values, offsets) in enumerate(bags):
        if len(offsets) != B + 1:
            raise ValueError(f"table {t}: offsets have {len(offsets)} entries, expected B+1 = {B + 1}")
        parts.append(values.to(torch.int64))
        offs.append(offsets[:-1].to(torch.int64) + base)
        base += len(values)
    offs.append(torch.full((1,), base, dtype=torch.int64, device=bags[0][1].device))
    return torch.cat(parts), torch.cat(offs)


def stack_ids(ids: Sequence[Tensor]) -> Tensor:
    """One id per token per table → ``[T, N]`` int64."""
    return torch.stack([i.to(torch.int64) for i in ids])
