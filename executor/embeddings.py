"""The embedding tables of the single-device model: pooled lookups and sequence token lookups.

Tables of one dim share one buffer (``kernels.embedding.layout.FusedTables``), so that the
Triton table-batched kernels look them all up in one launch; ``kernel`` (auto | triton | torch)
says which lookups run: ``executor.parallelize`` sets it from the Scenario's ``execution``.
Sharded (``executor.sharded_tables``), a module's forwards delegate to its ``sharded`` lookups,
which follow the same choice: the held shards live in buffers of their own (one per shard
width), the data-parallel tables stay whole in the module's (``keep_whole``).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from executor.data import Batch, TableGroup, pooled_table_groups, sequence_table_groups
from kernels.embedding.layout import FusedTables
from scenarios.schema import Embeddings, SequenceGroup


class _FusedTableModule(nn.Module):
    """Tables of one dim share one buffer (``kernels.embedding.layout.FusedTables``), each table's
    weight a view of it, so that the Triton TBE looks them all up in one launch. The views are
    initialised like ``nn.Embedding``'s own (``normal_``, in config order: the same values)."""

    def _make_tables(self, families, groups: list[TableGroup], make, dtype: torch.dtype) -> nn.ModuleDict:
        self.kernel = "auto"  # auto | triton | torch: executor.parallelize sets the run's choice
        # executor.sharded_tables.ShardedLookups when the tables are sharded over sparse_shard ×
        # sparse_replica (the weights are then this rank's shards and the forwards delegate to it)
        self.sharded = None
        self.table_groups = groups
        self.fused = [FusedTables(g.rows, g.dim, dtype=dtype) for g in groups]
        self._cols: dict[torch.device, list[Tensor]] = {}  # a sequence group's output columns, per device
        views = {n: v for g, f in zip(groups, self.fused) for n, v in zip(g.names, f.views())}
        tables = {}
        for fam in families:
            for name in fam.table_names():
                _init_normal(views[name])
                tables[name] = make(fam, views[name])
        return nn.ModuleDict(tables)

    def cast_tables(self, dtype: torch.dtype) -> None:
        """Store the tables in ``dtype`` (the buffer is re-made; the weights point into it again);
        nothing to do where they were built in it (``precision.embeddings``: ``build_model`` does)."""
        if all(f.buffer.dtype == dtype for f in self.fused):
            return
        for g, f in zip(self.table_groups, self.fused):
            f.cast(dtype)
            for name, view in zip(g.names, f.views()):
                self.tables[name].weight = nn.Parameter(view)

    def keep_whole(self, names: list[str]) -> None:
        """Keep only the tables ``names`` in the whole-table buffers: each dim's group re-made with
        just them (their values copied, their output columns renumbered over them), so that the
        old buffers, which held every table, are freed once the other tables' weights are replaced
        (``executor.sharded_tables.shard_modules``: those are sharded)."""
        keep, col, cols = set(names), 0, {}
        for n, t in self.tables.items():
            if n in keep:
                cols[n] = col
                col += t.weight.shape[1]
        groups, fused = [], []
        for g, f in zip(self.table_groups, self.fused):
            kept = [(n, r) for n, r in zip(g.names, g.rows) if n in keep]
            if not kept:
                continue
            g = TableGroup(g.dim, tuple(n for n, _ in kept), tuple(r for _, r in kept),
                           tuple(cols[n] for n, _ in kept) if g.cols else ())  # fmt: skip
            new = FusedTables(g.rows, g.dim, dtype=f.buffer.dtype, device=f.buffer.device)
            for n, view in zip(g.names, new.views()):
                view.copy_(self.tables[n].weight.detach())
                self.tables[n].weight = nn.Parameter(view)
            groups.append(g)
            fused.append(new)
        self.table_groups, self.fused = groups, fused
        self._cols = {}

    def _weights(self, g: TableGroup) -> list[Tensor]:
        return [self.tables[n].weight for n in g.names]

    def fused_buffers(self) -> list[tuple[FusedTables, list[Tensor]]]:
        """Each fused buffer and the weights that must be its views: the whole tables' groups, and
        once sharded the held shards' buffers (``executor.sharded_tables``)."""
        out = [(f, self._weights(g)) for g, f in zip(self.table_groups, self.fused)]
        # the native backend's shards have buffers; TorchRec's tables (torchrec backend) are its own
        return out + getattr(self.sharded, "fused_buffers", list)()

    def use_triton(self, device: torch.device) -> bool:
        """Whether the lookups run on the Triton TBE kernels: ``kernel`` triton, or auto on CUDA, and
        every table still a view of its buffer (``fused_buffers``). One rule, sharded or not: once
        sharded it decides the shard-local lookups and the data-parallel tables' alike
        (``executor.sharded_tables``)."""
        if self.kernel == "torch" or (self.kernel == "auto" and device.type != "cuda"):
            return False
        if all(f.holds(weights) for f, weights in self.fused_buffers()):
            return True
        msg = ("the embedding tables no longer share their fused buffer (moved or cast after build_model?); "
               "build the model on its device with build_model, or use the torch embedding kernel")
        if self.kernel == "triton":
            raise ValueError(msg)
        if not getattr(self, "_warned", False):
            warnings.warn(msg + ": falling back to torch", stacklevel=2)
            self._warned = True
        return False


INIT_CHUNK = 1 << 26  # elements drawn at a time in fp32 for a 16-bit table (256 MB)


@torch.no_grad()
def _init_normal(w: Tensor) -> None:
    """``nn.init.normal_`` as ``nn.Embedding`` does it. A 16-bit table draws its values in fp32 and
    rounds them, ``INIT_CHUNK`` elements at a time, so that a table of 16-bit rows is never held in
    fp32 whole (a 52 GB bf16 table would need 104 GB more). A table within one chunk gets exactly
    the values of an fp32 table cast after."""
    if w.dtype == torch.float32:
        nn.init.normal_(w)
        return
    step = max(1, INIT_CHUNK // max(1, w.shape[1]))
    for a in range(0, w.shape[0], step):
        w[a:a + step].copy_(nn.init.normal_(torch.empty(w[a:a + step].shape, device=w.device)))


def table_dtype(precision) -> torch.dtype:
    """The tables' storage dtype: ``precision.embeddings`` (fp32 without a precision)."""
    return torch.bfloat16 if precision is not None and precision.embeddings == "bf16" else torch.float32


class PooledTables(_FusedTableModule):
    """One ``EmbeddingBag(mode="sum", sparse=True)`` per pooled table; returns ``[B, dim]`` each
    (Triton: one TBE launch per dim, ``kernels.embedding.tbe.pooled_lookup``)."""

    def __init__(self, embeddings: Embeddings, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.family_cfg = list(embeddings.pooled)
        self.tables = self._make_tables(
            embeddings.pooled, pooled_table_groups(embeddings),
            lambda fam, w: nn.EmbeddingBag(fam.rows, fam.dim, mode="sum", sparse=True, include_last_offset=True,
                                           _weight=w), dtype,
        )

    def forward(self, batch: Batch) -> dict[str, Tensor]:
        """``{table: [B, dim]}``."""
        if self.sharded is not None:
            return self.sharded.pooled(batch)
        if not self.use_triton(batch.dense.device):
            return {name: t(*batch.pooled[name]).float() for name, t in self.tables.items()}
        out = {}
        for g, y in zip(self.table_groups, self._grouped(batch)):
            out.update({n: y[:, i] for i, n in enumerate(g.names)})
        return {name: out[name] for name in self.tables}

    def families(self, batch: Batch) -> list[Tensor]:
        """``[B, count, dim]`` per pooled family, in config order. With the Triton lookups a
        family is a ``split`` of its dim group's output (a group holds its families' tables
        consecutively, in config order), whose backward is one ``cat``, rather than a stack of
        per-table selects, whose backward zero-fills and copies once per table."""
        fams = self.family_cfg
        if self.sharded is not None or not self.use_triton(batch.dense.device):
            pooled = self(batch)
            return [torch.stack([pooled[n] for n in fam.table_names()], dim=1) for fam in fams]
        parts = {}
        for g, y in zip(self.table_groups, self._grouped(batch)):
            members = [fam for fam in fams if fam.dim == g.dim]
            parts.update(zip((f.name for f in members), torch.split(y, [f.count for f in members], dim=1)))
        return [parts[fam.name] for fam in fams]

    def _grouped(self, batch: Batch) -> list[Tensor]:
        """One ``[B, tables, dim]`` per dim group (one TBE launch each)."""
        from kernels.embedding.tbe import pooled_lookup

        B = batch.size
        return [pooled_lookup(f, self._weights(g), *batch.pooled_packed(g), B).view(B, len(g.names), g.dim)
                for g, f in zip(self.table_groups, self.fused)]


class SequenceGroupTokens(_FusedTableModule):
    """Per token, one lookup per table; concatenated ``[ΣL_g, D_g]`` → ``Linear(D_g→d)``
    (Triton: one unpooled TBE launch per dim, ``kernels.embedding.tbe.unpooled_lookup``)."""

    def __init__(self, group: SequenceGroup, d: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.name = group.name
        self.tables = self._make_tables(
            group.tables, sequence_table_groups(group), lambda fam, w: nn.Embedding(fam.rows, fam.dim, sparse=True,
                                                                                    _weight=w), dtype,
        )
        self.width = sum(t.embedding_dim for t in self.tables.values())
        self.proj = nn.Linear(self.width, d)

    def cols_on(self, device: torch.device) -> list[Tensor]:
        """Each group's tables' first columns in the concatenated output (int64 on ``device``, cached)."""
        if device not in self._cols:
            self._cols[device] = [torch.tensor(g.cols, dtype=torch.int64, device=device) for g in self.table_groups]
        return self._cols[device]

    def forward(self, batch: Batch) -> Tensor:
        ids = batch.sequences[self.name].ids
        if self.sharded is not None:
            return self.proj(torch.cat(list(self.sharded.sequence(batch).values()), dim=1))
        device = batch.dense.device
        if not self.use_triton(device):
            return self.proj(torch.cat([t(ids[name]).float() for name, t in self.tables.items()], dim=1))
        packed = [batch.sequence_packed(self.name, g) for g in self.table_groups]
        # rows: the packed ids' width, ΣL_g or, in a static-shape batch, ΣL_g rounded up (padding)
        return self.proj(self.grouped_rows(packed, packed[0].shape[1], device))

    def grouped_rows(self, ids: list[Tensor], n: int, device: torch.device) -> Tensor:
        """``[n, Σ dims]`` fp32: every table of ``table_groups`` looked up per token on the Triton
        kernels, one unpooled TBE launch per group (``ids``: each group's ``[tables, n]``), columns
        as ``TableGroup.cols`` place them (the whole module; once sharded, its data-parallel tables)."""
        from kernels.embedding.tbe import unpooled_lookup

        spec = [(f, cols, self._weights(g), i)
                for g, f, cols, i in zip(self.table_groups, self.fused, self.cols_on(device), ids)]  # fmt: skip
        return unpooled_lookup(spec, n, sum(g.dim * len(g.names) for g in self.table_groups))
