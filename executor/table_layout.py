"""Where each element of a sharded embedding table lives (the layout maths of
``executor.sharded_tables``; no process group, no collective): every table a grid of row classes
× column blocks over the ``sparse_shard`` ranks, its shards' rows dealt again over the
``sparse_replica`` ranks under ``fully_sharded``; with hot rows (``scenarios.placement.hot_rows``)
the first rows on every rank whole, the grid over the others. ``sharded_tables.md`` draws it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from scenarios.placement import family_field, hot_rows, table_owners, table_plan
from scenarios.schema import Scenario


def grid_factors(S: int) -> tuple[int, int]:
    """``(a, b)``: a grid-wise table over ``S`` shards has ``a`` row classes and ``b`` column blocks,
    ``b`` the largest divisor of ``S`` not above ``sqrt(S)`` (4 → 2 × 2, 8 → 4 × 2; a prime ``S``
    has ``b`` = 1, so its grid is row-wise): the columns split no finer than the rows."""
    b = max(d for d in range(1, math.isqrt(S) + 1) if S % d == 0)
    return S // b, b


@dataclass(frozen=True)
class TableLayout:
    """Where one table's elements live. Row ``r`` is in row class ``r % a`` at shard-local row
    ``r // a`` (round-robin: our ids are not hashed and the low ids are the hot ones, so dealing
    rows spreads the hot ids evenly over the shards); columns are ``b`` contiguous blocks, the
    first ``dim % b`` one wider. ``grid[i][j]`` is the ``sparse_shard`` rank holding row class
    ``i`` and column block ``j``. Under ``fully_sharded`` each shard's local rows are dealt again
    over the ``replicas``: local row ``l`` on replica ``l % replicas`` at row ``l // replicas``.

    Hot rows (``hot`` > 0, row- and table-wise only): rows ``[0, hot)`` are on every rank whole, the
    first rows of its weight; the grid deals the other (cold) rows as above, cold row ``c = r - hot``
    in row class ``c % a`` at shard-local row ``c // a``, stored after the hot rows."""

    name: str
    rows: int
    dim: int
    kind: str  # table | row | column | grid | data
    a: int = 1
    b: int = 1
    grid: tuple[tuple[int, ...], ...] = ()
    replicas: int = 1
    hot: int = 0

    @property
    def routed(self) -> bool:
        return self.kind != "data"

    @property
    def cold(self) -> int:
        """The rows the grid deals (the rest are hot)."""
        return self.rows - self.hot

    def cols(self, j: int) -> tuple[int, int]:
        """Column block ``j``'s ``[c0, c1)``."""
        base, extra = divmod(self.dim, self.b)
        c0 = j * base + min(j, extra)
        return c0, c0 + base + (j < extra)

    def blocks(self) -> list[int]:
        """The column blocks that hold columns (a block is empty when ``dim < b``)."""
        return [j for j in range(self.b) if self.cols(j)[1] > self.cols(j)[0]]

    def place(self, shard: int) -> tuple[int, int] | None:
        """``(row class, column block)`` that ``shard`` holds, or None (it holds nothing)."""
        for i, row in enumerate(self.grid):
            for j, s in enumerate(row):
                if s == shard and j in self.blocks():
                    return i, j
        return None

    def held(self, shard: int, replica: int) -> tuple[Tensor, int, int]:
        """``(global rows, c0, c1)`` of the elements rank (``shard``, ``replica``) stores, rows in
        the order of its local rows: the hot rows, then its cold rows (``replica`` is ignored when
        the shard is not split)."""
        hot = torch.arange(self.hot, dtype=torch.int64)
        where = self.place(shard)
        if where is None:
            return hot, 0, self.dim
        i, j = where
        local = torch.arange(len(range(i, self.cold, self.a)), dtype=torch.int64)
        local = local[replica % self.replicas :: self.replicas]
        return torch.cat([hot, self.hot + i + local * self.a]), *self.cols(j)

    def route(self, ids: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Per nonempty column block: ``(destination shard, shard-local cold row)`` of each id, all
        cold (``>= hot``: the caller looks the hot ones up itself)."""
        shard_of = torch.tensor(self.grid, dtype=torch.int64, device=ids.device)  # [a, b]
        cold = ids - self.hot
        cls, local = cold % self.a, cold // self.a
        return [(shard_of[:, j][cls], local) for j in self.blocks()]


def table_layouts(s: Scenario) -> dict[str, TableLayout]:
    """Every table's layout, from the twin's plan (``table_plan``, ``table_owners``, ``hot_rows``).
    Hot rows need a row- or table-wise family here (a column block cannot hold whole rows): else a
    one-line ``ValueError`` naming the field and the fix."""
    p = s.parallelism
    S, R = p.sparse_shard, p.sparse_replica if p.sparse_strategy == "fully_sharded" else 1
    plan, owners, hot = table_plan(s), table_owners(s), hot_rows(s)
    out = {}
    for fam in s.model.embeddings.families():
        kind = plan[fam.name]
        if fam.name in hot and kind in ("column", "grid"):
            raise ValueError(
                f"{family_field(s, fam.name)}.hot_rows ({fam.hot_rows}) needs row- or table-wise sharding in the "
                f"native backend, not {kind}-wise (a column shard holds no whole row): set "
                f"parallelism.table_sharding.{fam.name} to row or table, or hot_rows to 0")
        a, b = {"table": (1, 1), "row": (S, 1), "column": (1, S), "grid": grid_factors(S), "data": (1, 1)}[kind]
        for name in fam.table_names():
            if kind == "data":
                grid = ()
            elif kind == "table":
                grid = ((owners[name],),)
            else:
                grid = tuple(tuple(i * b + j for j in range(b)) for i in range(a))
            out[name] = TableLayout(name, fam.rows, fam.dim, kind, a, b, grid, R, hot.get(fam.name, 0))
    return out


