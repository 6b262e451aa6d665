"""Bytes and FLOPs of a table-batched embedding lookup, torch-free (the twin imports this).

The *effective* bytes of a lookup count every gathered row once per occurrence (hot rows that
the L2 cache serves count too), the output written once, and the ids and offsets read once:
``ids · dim · elem + out_rows · dim · out_elem + ids · index_elem + offsets · index_elem``.
A pooled sum adds ``(ids - bags) · dim`` FLOPs (none of them matmul FLOPs).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LookupCost:
    rows_bytes: float  # gathered table rows, one per id
    out_bytes: float  # the output, written once
    index_bytes: float  # ids and offsets, read once
    flops: float  # additions of a pooled sum (0 for unpooled)

    @property
    def bytes(self) -> float:
        return self.rows_bytes + self.out_bytes + self.index_bytes


def pooled_cost(ids: float, bags: float, dim: int, *, elem_bytes: int = 4, out_elem_bytes: int = 4,
                index_bytes: int = 8) -> LookupCost:
    """``ids`` ids summed into ``bags`` bags of ``dim`` columns (offsets: ``bags + 1`` entries)."""
    _check(ids=ids, bags=bags, dim=dim)
    return LookupCost(
        rows_bytes=ids * dim * elem_bytes,
        out_bytes=bags * dim * out_elem_bytes,
        index_bytes=(ids + bags + 1) * index_bytes,
        flops=max(ids - bags, 0) * dim,
    )


def unpooled_cost(ids: float, dim: int, *, elem_bytes: int = 4, out_elem_bytes: int = 4,
                  index_bytes: int = 8) -> LookupCost:
    """One output row per id (a jagged sequence lookup)."""
    _check(ids=ids, bags=0, dim=dim)
    return LookupCost(rows_bytes=ids * dim * elem_bytes, out_bytes=ids * dim * out_elem_bytes,
                      index_bytes=ids * index_bytes, flops=0.0)


def backward_bytes(ids: float, unique: float, dim: int, *, grad_elem_bytes: int = 4,
                   index_bytes: int = 8) -> float:
    """The sparse backward's floor: each occurrence reads its output-gradient row, each unique
    row's gradient is written once, ids are read and sorted (read + written twice)."""
    _check(ids=ids, bags=unique, dim=dim)
    return ids * dim * grad_elem_bytes + unique * dim * grad_elem_bytes + 3 * ids * index_bytes


def _check(*, ids: float, bags: float, dim: int) -> None:
    if ids < 0:
        raise ValueError(f"ids = {ids}: must be >= 0")
    if bags < 0:
        raise ValueError(f"bags = {bags}: must be >= 0")
    if dim <= 0:
        raise ValueError(f"dim = {dim}: must be > 0")
