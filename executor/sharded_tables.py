"""2D embedding parallelism, ``native`` backend: the tables sharded over ``sparse_shard`` and their
shards either split again (``fully_sharded``) or replicated (``replicated_sync``) over
``sparse_replica``. How the data moves is in ``sharded_tables.md`` beside this file.

The plan is the twin's (``executor.table_layout``): ``scenarios.placement.table_plan`` (each family's sharding) and
``table_owners`` (the shard of each table-wise table), read as they are, never re-derived, so the
twin prices the layout that runs. Every table is a grid of ``a`` row classes × ``b`` column blocks
(``TableLayout``): table-wise 1 × 1 on its owner, row-wise S × 1, column-wise 1 × S, grid a × b;
data-parallel tables are not routed at all (every rank looks them up whole and ``ReplicatedGrads``
averages their gradients over the world).

Per micro-batch and table module (the pooled tables, or one sequence group): one counts
all-to-all (the split sizes, read on the host: the one sync), one all-to-all of (local row,
bag or token) pairs to the shards holding them, the local lookups, and one autograd all-to-all of
the outputs back (its backward sends the output gradients the other way). Under
``fully_sharded`` with ``sparse_replica`` > 1 the shard's rows are dealt again over the replicas,
and before the local lookups the touched rows are fetched from their replica owners (a counts
all-to-all, a request all-to-all and an autograd all-to-all of the rows, whose backward returns
each row's gradient to its owner: reduce-scatter semantics).

The local lookups follow the module's kernel choice (``_FusedTableModule.use_triton``: ``kernel``
triton, or auto on CUDA). Each rank's held shards live in one ``FusedTables`` buffer per shard
width (``ShardedLookups.lay_out``; a column or grid shard is narrower than its table), so that the
Triton TBE kernels look up all of a width's shards in one launch: pooled, ``pooled_lookup`` of the
partial sums per (source, bag); sequence, ``unpooled_lookup`` of one row per token (the tables'
counts differ, so the shorter are padded with id -1). Their gradients are sparse per shard, as
torch's are. Under ``fully_sharded`` with ``sparse_replica`` > 1 the owners' gathers of the
requested rows run on the Triton unpooled kernel too; the lookups into the fetched rows stay
torch (``F.embedding_bag`` / ``F.embedding`` on a dense autograd tensor, not a table: its dense
gradient flows back through the rows' all-to-all). Data-parallel tables stay whole in the
module's buffers (``keep_whole``) and are looked up as on one process. Otherwise everything is
torch (``F.embedding_bag`` / ``F.embedding`` with sparse gradients).

Hot rows (``TableFamily.hot_rows``, row- and table-wise tables): every rank holds rows ``[0, hot)``
of such a table whole, first in its weight, looks its batch's hot ids up there and routes only the
cold ones; the hot rows' gradients are all-reduced over every rank (``executor.hot_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence

from executor.comm_profile import comm_region
from executor.data import TableGroup
from executor.embeddings import PooledTables
from executor.hot_rows import HotGrads, hot_bag_sums, with_hot_rows
from executor.table_layout import TableLayout, table_layouts
from kernels.embedding.layout import FusedTables, pack_bags, stack_ids
from scenarios.schema import Scenario
from scenarios.vocab import CommGroup


SHARD, REPLICA = str(CommGroup.SPARSE_SHARD), str(CommGroup.SPARSE_REPLICA)  # the profiler's axis names


# ---- the process groups of one rank -----------------------------------------------------------
@dataclass(frozen=True)
class Place:
    """This rank on the sparse view: its shard (rank in ``sparse_shard``), its replica (rank in
    ``sparse_replica``), both groups and their sizes, and the strategy."""

    shard: int
    replica: int
    shard_group: object
    replica_group: object
    S: int
    R: int
    world: int
    strategy: str
    sync_interval: int
    comm: str = "fp32"  # precision.comm: the dtype the lookups' outputs (and their gradients) travel in

    @classmethod
    def of(cls, s: Scenario, mesh) -> Place:
        ss, sr = mesh["sparse_shard"], mesh["sparse_replica"]
        p = s.parallelism
        return cls(ss.get_local_rank(), sr.get_local_rank(), ss.get_group(), sr.get_group(), ss.size(), sr.size(),
                   mesh.world.size(), p.sparse_strategy, p.sparse_sync_interval, s.precision.comm)  # fmt: skip

    @property
    def split_replicas(self) -> bool:
        """Whether a shard's rows are dealt over the replicas (fully_sharded, R > 1)."""
        return self.strategy == "fully_sharded" and self.R > 1


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` whose backward is the all-to-all of the gradients the other way
    (``torch.distributed.nn.functional``'s, deprecated in torch 2.13, does the same)."""

    @staticmethod
    def forward(ctx, values: Tensor, send: list[int], recv: list[int], group, axis: str) -> Tensor:
        ctx.send, ctx.recv, ctx.group, ctx.axis = send, recv, group, axis
        return _a2a(values, send, recv, group, axis, grad=False)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _a2a(grad.contiguous(), ctx.recv, ctx.send, ctx.group, ctx.axis, grad=False), None, None, None, None


def _a2a(values: Tensor, send: list[int], recv: list[int], group, axis: str, *, grad: bool) -> Tensor:
    """``all_to_all_single`` along dim 0 of ``values``, ``send[p]`` rows to peer ``p`` and
    ``recv[p]`` from it (differentiable when ``grad``), profiled as mesh axis ``axis``."""
    if grad and torch.is_grad_enabled():
        return _AllToAll.apply(values, send, recv, group, axis)
    out = values.new_empty((sum(recv), *values.shape[1:]))
    with comm_region(axis):
        dist.all_to_all_single(out, values.contiguous(), recv, send, group=group)
    return out


def _exchange_counts(counts: Tensor, group, axis: str) -> tuple[list[list[int]], list[list[int]]]:
    """``counts [peers, k]`` sent row ``p`` to peer ``p``; (what I send, what I receive) on the host
    (the micro-batch's host sync: the split sizes of the all-to-alls that follow)."""
    recv = torch.empty_like(counts)
    with comm_region(axis):
        dist.all_to_all_single(recv, counts.contiguous(), group=group)
    return counts.tolist(), recv.tolist()


def _anchor(ref: Tensor) -> Tensor:
    """An empty leaf that wants a gradient: appended to a buffer a rank sends, it makes every
    rank's all-to-all part of the autograd graph (so every rank runs its backward, the peers'
    collective), also a rank that sends nothing."""
    return torch.zeros(0, dtype=torch.float32, device=ref.device, requires_grad=torch.is_grad_enabled())


# ---- the lookups of one table module ----------------------------------------------------------
@dataclass
class Routed:
    """One micro-batch's ids of one table module, routed (``ShardedLookups.route``)."""

    payload: Tensor  # [n, 2] int64: (shard-local row, bag or token), sorted by (shard, table)
    meta: Tensor  # [S, T + 1] int64: ids per (shard, table), and the output rows
    n_out: int


@dataclass
class Inbound:
    """The ids sent (``ShardedLookups.dispatch``): the counts both ways, the receive buffer, and
    the all-to-all's work while it is in flight."""

    routed: Routed
    sent: list[list[int]]
    got: list[list[int]]
    recv: Tensor
    work: object = None


class ShardedLookups:
    """The sharded lookups of one table module (``embeddings.PooledTables`` or a
    ``SequenceGroupTokens``): the module's ``tables[name].weight`` are this rank's shards."""

    def __init__(self, module: nn.Module, layouts: dict[str, TableLayout], place: Place):
        self.module, self.place = module, place
        self.layouts = {n: layouts[n] for n in module.tables}
        self.routed = [n for n, L in self.layouts.items() if L.routed]
        self.held = [n for n in self.routed if self.layouts[n].place(place.shard) is not None]
        self.is_pooled = isinstance(module, PooledTables)  # sums per bag; else a sequence group, per token
        self.pending: dict[int, tuple[object, Inbound]] = {}  # id(batch) -> (batch, its ids in flight)
        # the held shards (with rows) by width, each group's in one buffer (``lay_out``)
        self.groups: list[TableGroup] = []
        self.fused: list[FusedTables] = []

    def weight(self, name: str) -> Tensor:
        return self.module.tables[name].weight

    @torch.no_grad()
    def lay_out(self) -> None:
        """This rank's shards as the module's weights, sliced from the whole tables: the held ones
        in one ``FusedTables`` buffer per shard width (``c1 - c0``), in ``held`` order, each weight
        a view of its buffer (as ``_FusedTableModule`` keeps the whole tables), so that the Triton
        TBE looks up a width's shards in one launch. A table this rank holds nothing of, or no row
        of (more row classes or replicas than rows), gets a weight of its own, empty."""
        pl, shards = self.place, {}
        for n in self.routed:
            rows, c0, c1 = self.layouts[n].held(pl.shard, pl.replica)
            whole = self.weight(n).detach()
            shards[n] = whole[rows.to(whole.device)][:, c0:c1]
        widths: dict[int, list[str]] = {}
        for n in self.held:
            if len(shards[n]):
                widths.setdefault(shards[n].shape[1], []).append(n)
        for width, names in widths.items():
            g = TableGroup(width, tuple(names), tuple(len(shards[n]) for n in names))
            f = FusedTables(g.rows, width, dtype=shards[names[0]].dtype, device=shards[names[0]].device)
            for n, view in zip(names, f.views()):
                view.copy_(shards[n])
                self.module.tables[n].weight = nn.Parameter(view)
            self.groups.append(g)
            self.fused.append(f)
        laid = {n for g in self.groups for n in g.names}
        for n in self.routed:
            if n not in laid:
                self.module.tables[n].weight = nn.Parameter(shards[n].clone())

    def fused_buffers(self) -> list[tuple[FusedTables, list[Tensor]]]:
        """Each shard buffer and the weights that must be its views (``use_triton`` checks them)."""
        return [(f, [self.weight(n) for n in g.names]) for g, f in zip(self.groups, self.fused)]

    # the two entry points: the modules' forwards delegate here
    def pooled(self, batch) -> dict[str, Tensor]:
        """``{table: [B, dim]}``, exactly the single-process sums (row and grid partial sums added)."""
        out, mod = self._routed(batch), self.module
        for n in self._hot_tables():  # plus each bag's hot partial sum, looked up here
            out[n] = out[n] + hot_bag_sums(self.weight(n), *batch.pooled[n], self.layouts[n].hot)
        if mod.table_groups and mod.use_triton(batch.dense.device):  # the data-parallel tables, whole
            for g, y in zip(mod.table_groups, mod._grouped(batch)):
                out.update({n: y[:, i] for i, n in enumerate(g.names)})
        for n in self.layouts:
            if n not in out:
                ids, offsets = batch.pooled[n]
                out[n] = F.embedding_bag(ids, self.weight(n), offsets, mode="sum", sparse=True,
                                         include_last_offset=True).float()  # fmt: skip
        return {n: out[n] for n in self.layouts}

    def sequence(self, batch) -> dict[str, Tensor]:
        """``{table: [ΣL, dim]}``, one row per token."""
        out, mod = self._routed(batch), self.module
        ids = batch.sequences[mod.name].ids
        for n in self._hot_tables():  # the cold tokens' rows, routed, and the hot ones', looked up here
            out[n] = with_hot_rows(self.weight(n), ids[n], self.layouts[n].hot, out[n])
        if mod.table_groups and mod.use_triton(batch.dense.device):  # the data-parallel tables, whole
            y = mod.grouped_rows([stack_ids([ids[n] for n in g.names]) for g in mod.table_groups],
                                 next(iter(ids.values())).numel(), batch.dense.device)  # fmt: skip
            for g in mod.table_groups:
                out.update({n: y[:, c : c + g.dim] for n, c in zip(g.names, g.cols)})
        for n in self.layouts:
            if n not in out:
                out[n] = F.embedding(ids[n], self.weight(n), sparse=True).float()
        return {n: out[n] for n in self.layouts}

    def _hot_tables(self) -> list[str]:
        return [n for n in self.routed if self.layouts[n].hot]

    # the route: ids out (``route``, ``dispatch``: ShardedTables.start may have done both for the
    # next micro-batch already), lookups, outputs back
    def inputs(self, batch) -> tuple[dict[str, tuple[Tensor, Tensor]], int]:
        """Per table ``(ids, bag of each id)`` (pooled) or ``(ids, token of each id)``, and the
        number of output rows (``B``, or the tokens)."""
        if self.is_pooled:
            B = batch.size
            return {n: (ids, torch.repeat_interleave(torch.arange(B, device=ids.device), offsets.diff()))
                    for n, (ids, offsets) in ((n, batch.pooled[n]) for n in self.layouts)}, B  # fmt: skip
        ids = batch.sequences[self.module.name].ids
        n_tokens = next(iter(ids.values())).numel()
        return {n: (ids[n], torch.arange(ids[n].numel(), device=ids[n].device)) for n in self.layouts}, n_tokens

    def route(self, batch) -> Routed:
        """Where each id goes: the ``(local row, bag or token)`` pairs sorted by (shard, table) and
        the counts ``[S, T + 1]`` to send (the last column: the output rows)."""
        inputs, n_out = self.inputs(batch)
        pl, T = self.place, len(self.routed)
        device = next(iter(inputs.values()))[0].device
        keys, rows, idx = [], [], []
        for t, n in enumerate(self.routed):
            ids, where = inputs[n]
            if self.layouts[n].hot:  # the hot ids are looked up at home
                cold = ids >= self.layouts[n].hot
                ids, where = ids[cold], where[cold]
            for dest, local in self.layouts[n].route(ids):
                keys.append(dest * T + t)
                rows.append(local)
                idx.append(where)
        key = torch.cat(keys)
        order = torch.argsort(key, stable=True)
        payload = torch.stack([torch.cat(rows), torch.cat(idx)], dim=1)[order]
        counts = torch.bincount(key, minlength=pl.S * T).view(pl.S, T)
        meta = torch.cat([counts, torch.full((pl.S, 1), n_out, dtype=torch.int64, device=device)], dim=1)
        return Routed(payload, meta, n_out)

    def dispatch(self, r: Routed, sent: list[list[int]], got: list[list[int]], *, async_op: bool) -> Inbound:
        """The ids' all-to-all inside ``sparse_shard`` (async: waited for in ``_routed``)."""
        T = len(self.routed)
        send, recv_sizes = [sum(x[:T]) for x in sent], [sum(x[:T]) for x in got]
        recv = r.payload.new_empty((sum(recv_sizes), 2))
        with comm_region(SHARD):
            work = dist.all_to_all_single(recv, r.payload, recv_sizes, send, group=self.place.shard_group,
                                          async_op=async_op)  # fmt: skip
        return Inbound(r, sent, got, recv, work if async_op else None)

    def _routed(self, batch) -> dict[str, Tensor]:
        if not self.routed:
            return {}
        inbound = self.pending.pop(id(batch), (None, None))[1]
        if inbound is None:
            r = self.route(batch)
            sent, got = _exchange_counts(r.meta, self.place.shard_group, SHARD)
            inbound = self.dispatch(r, sent, got, async_op=False)
        if inbound.work is not None:
            inbound.work.wait()
        r, sent, got, T = inbound.routed, inbound.sent, inbound.got, len(self.routed)
        pooled, device = self.is_pooled, r.payload.device
        back, back_sizes = self._local(inbound.recv, got, T, pooled=pooled, device=device)
        expect = [self._size_from(d, sent[d], r.n_out, pooled) for d in range(self.place.S)]
        # the outputs (and, by autograd, their gradients) travel in precision.comm: 16-bit payloads
        wire = torch.bfloat16 if self.place.comm == "bf16" else back.dtype
        outputs = _a2a(back.to(wire), back_sizes, expect, self.place.shard_group, SHARD, grad=True).to(back.dtype)
        return self._assemble(outputs, r.payload, sent, r.n_out, pooled=pooled)

    def _local(self, recv: Tensor, got: list[list[int]], T: int, *, pooled: bool, device) -> tuple[Tensor, list[int]]:
        """The lookups of what the peers sent me: the buffer to send back (per source: my held
        tables in order, pooled ``[B_src, cols]`` partial sums or ``[ids, cols]`` rows, flattened)."""
        S = self.place.S
        seg = torch.repeat_interleave(torch.arange(S * T, device=device),
                                      torch.tensor([c for r in got for c in r[:T]], device=device))  # fmt: skip
        tables = {}
        for n in self.held:
            t = self.routed.index(n)
            pos = torch.nonzero(seg % T == t).squeeze(1)
            tables[n] = (recv[pos, 0], recv[pos, 1], seg[pos] // T)
        sources, exchanged = self._sources({n: v[0] for n, v in tables.items()})
        # the shards themselves (not rows fetched from the replicas): the module's kernel choice
        triton = not self.place.split_replicas and self.module.use_triton(device)
        if pooled:  # the ids come sorted by (source, bag): one bag per (source, bag), as one process sums
            sizes = [got[p][T] for p in range(S)]
            base = torch.tensor([0, *sizes[:-1]], device=device).cumsum(0)
            offsets = {}
            for n, (_, where, src) in tables.items():
                per_bag = torch.bincount(base[src] + where, minlength=sum(sizes))
                offsets[n] = torch.cat([per_bag.new_zeros(1), per_bag.cumsum(0)])
            outs = self._bags(sources, offsets, sum(sizes), triton=triton)
            per = {n: outs[n].split(sizes) for n in tables}
        else:
            outs = self._rows(sources, triton=triton)
            per = {n: outs[n].split([got[p][self.routed.index(n)] for p in range(S)]) for n in tables}
        chunks = [[per[n][p].reshape(-1) for n in tables] for p in range(S)]
        anchor = _anchor(recv)
        flat = [torch.cat([*c, anchor]) for c in chunks]
        return torch.cat([*flat, exchanged]), [len(f) for f in flat]

    def _bags(self, sources: dict[str, tuple[Tensor, Tensor, bool]], offsets: dict[str, Tensor], B: int, *,
              triton: bool) -> dict[str, Tensor]:
        """Per held table ``[B, cols]`` fp32: the sums of ``table[index]`` over its ``B`` bags
        (``offsets [B+1]``); with ``triton``, each shard buffer in one ``pooled_lookup``."""
        out = {}
        if triton:
            from kernels.embedding.tbe import pooled_lookup

            for g, f in zip(self.groups, self.fused):
                indices, packed = pack_bags([(sources[n][1], offsets[n]) for n in g.names])
                y = pooled_lookup(f, [self.weight(n) for n in g.names], indices, packed, B)
                y = y.view(B, len(g.names), g.dim)
                out.update({n: y[:, i] for i, n in enumerate(g.names)})
        for n, (table, index, sparse) in sources.items():
            if n not in out:
                out[n] = F.embedding_bag(index, table, offsets[n], mode="sum", sparse=sparse,
                                         include_last_offset=True).float()  # fmt: skip
        return out

    def _rows(self, sources: dict[str, tuple[Tensor, Tensor, bool]], *, triton: bool) -> dict[str, Tensor]:
        """Per held table ``[len(index), cols]`` fp32: ``table[index]``; with ``triton``, each shard
        buffer in one ``unpooled_lookup`` (the tables' ids padded with -1 to the longest)."""
        out = {}
        if triton:
            from kernels.embedding.tbe import unpooled_lookup

            for g, f in zip(self.groups, self.fused):
                index = [sources[n][1] for n in g.names]
                ids = pad_sequence(index, batch_first=True, padding_value=-1)  # [tables, longest]
                cols = torch.arange(len(g.names), device=ids.device) * g.dim
                y = unpooled_lookup([(f, cols, [self.weight(n) for n in g.names], ids)], ids.shape[1],
                                    len(g.names) * g.dim)  # fmt: skip
                for k, (n, i) in enumerate(zip(g.names, index)):
                    out[n] = y[: len(i), k * g.dim : (k + 1) * g.dim]
        for n, (table, index, sparse) in sources.items():
            if n not in out:
                out[n] = F.embedding(index, table, sparse=sparse).float()
        return out

    def _size_from(self, d: int, sent_row: list[int], n_out: int, pooled: bool) -> int:
        """How many output values shard ``d`` sends me back (what ``_local`` builds on its side)."""
        total = 0
        for t, n in enumerate(self.routed):
            where = self.layouts[n].place(d)
            if where is not None:
                c0, c1 = self.layouts[n].cols(where[1])
                total += (n_out if pooled else sent_row[t]) * (c1 - c0)
        return total

    def _assemble(self, outputs: Tensor, payload: Tensor, sent: list[list[int]], n_out: int, *,
                  pooled: bool) -> dict[str, Tensor]:
        """Each routed table's ``[n_out, dim]`` from the shards' answers: row classes added (pooled
        partial sums) or put at their tokens, column blocks concatenated."""
        S, T = self.place.S, len(self.routed)
        per_dest = outputs.split([self._size_from(d, sent[d], n_out, pooled) for d in range(S)])
        starts = torch.tensor([c for r in sent for c in r[:T]]).cumsum(0).tolist()
        blocks: dict[tuple[str, int], Tensor] = {}
        for d in range(S):
            sizes, names = [], []
            for t, n in enumerate(self.routed):
                where = self.layouts[n].place(d)
                if where is not None:
                    c0, c1 = self.layouts[n].cols(where[1])
                    sizes.append((n_out if pooled else sent[d][t]) * (c1 - c0))
                    names.append(n)
            for n, v in zip(names, per_dest[d].split(sizes)):
                blocks[n, d] = v
        out = {}
        for t, n in enumerate(self.routed):
            L = self.layouts[n]
            cols = []
            for j in L.blocks():
                c0, c1 = L.cols(j)
                parts = [blocks[n, L.grid[i][j]].view(-1, c1 - c0) for i in range(L.a)]
                if pooled:
                    acc = parts[0]
                    for x in parts[1:]:
                        acc = acc + x
                else:  # each token went to one row class: put the rows back in token order
                    k = [L.grid[i][j] * T + t for i in range(L.a)]
                    where = torch.cat([payload[starts[c] - sent[c // T][c % T] : starts[c], 1] for c in k])
                    acc = torch.cat(parts)[torch.argsort(where)]
                cols.append(acc)
            out[n] = cols[0] if len(cols) == 1 else torch.cat(cols, dim=1)
        return out

    def _sources(self, local: dict[str, Tensor]) -> tuple[dict[str, tuple[Tensor, Tensor, bool]], Tensor]:
        """Per held table, what its lookups read: ``(table, index, sparse gradient)``, the local
        shard at the shard-local rows, or (fully sharded over replicas) the rows fetched from
        their replica owners at each id's place among them; and an empty anchor tied to the
        replica exchange, so that every rank runs its backward."""
        if not self.place.split_replicas:  # a cold shard-local row is after the hot rows in the weight
            return {n: (self.weight(n), r + self.layouts[n].hot, True) for n, r in local.items()}, _anchor(
                next(iter(local.values()), torch.zeros(0)))  # fmt: skip
        return self._replica_rows(local)

    def _replica_rows(self, local: dict[str, Tensor]) -> tuple[dict, Tensor]:
        """Fully sharded: each table's unique rows requested from their replica owners (row ``l``
        on replica ``l % R`` at ``l // R``), gathered there (``_rows``: the Triton unpooled kernel
        when the module's choice says so, it reads the owner's shards), all-to-all'd back
        (autograd: the rows' gradients go back to their owners)."""
        pl, names = self.place, list(local)
        R, Th = pl.R, len(names)
        if not names:  # a shard holding none of these tables: so do its replicas, none exchanges
            return {}, _anchor(torch.zeros(0))
        device = self.module.tables[self.routed[0]].weight.device
        uniq, keys, pos = {}, [], []
        for t, n in enumerate(names):
            u, inv = torch.unique(local[n], return_inverse=True)
            uniq[n] = u, inv
            keys.append((u % R) * Th + t)
            pos.append(u // R)
        key = torch.cat(keys) if keys else torch.zeros(0, dtype=torch.int64, device=device)
        order = torch.argsort(key, stable=True)
        req = (torch.cat(pos) if pos else key)[order]
        counts = torch.bincount(key, minlength=R * Th).view(R, Th)
        sent, got = _exchange_counts(counts, pl.replica_group, REPLICA)
        asked = _a2a(req, [sum(r) for r in sent], [sum(r) for r in got], pl.replica_group, REPLICA, grad=False)
        seg = torch.repeat_interleave(torch.arange(R * Th, device=device),
                                      torch.tensor([c for r in got for c in r], device=device))  # fmt: skip
        requested = {n: (self.weight(n), asked[torch.nonzero(seg % Th == t).squeeze(1)] + self.layouts[n].hot,
                         True) for t, n in enumerate(names)}  # fmt: skip (a cold row is after the hot rows)
        gathered = self._rows(requested, triton=self.module.use_triton(device))
        chunks: list[list[Tensor]] = [[] for _ in range(R)]
        for t, n in enumerate(names):
            for q, r in enumerate(gathered[n].split([got[q][t] for q in range(R)])):
                chunks[q].append(r.reshape(-1))
        anchor = _anchor(req)
        flat = [torch.cat([*c, anchor]) for c in chunks]
        width = {n: self.weight(n).shape[1] for n in names}
        back = _a2a(torch.cat(flat), [len(f) for f in flat],
                    [sum(sent[q][t] * width[n] for t, n in enumerate(names)) for q in range(R)], pl.replica_group,
                    REPLICA, grad=True)  # fmt: skip
        per_owner = back.split([sum(sent[q][t] * width[n] for t, n in enumerate(names)) for q in range(R)])
        out = {}
        pieces = [per_owner[q].split([sent[q][t] * width[n] for t, n in enumerate(names)]) for q in range(R)]
        for t, n in enumerate(names):
            u, inv = uniq[n]
            got_rows = torch.cat([pieces[q][t].view(-1, width[n]) for q in range(R)])  # u sorted by owner, stably
            perm = torch.argsort(u % R, stable=True)
            out[n] = got_rows, torch.argsort(perm)[inv], False
        return out, back[:0]


# ---- the model's sharded tables --------------------------------------------------------------
class ShardedTables:
    """Every table module's sharded lookups, the local shards' gradient scaling, and the replicas'
    sync (``replicated_sync``).

    Gradients: a shard's gradient arrives summed over every rank that looked it up (the output
    all-to-all's backward; under ``fully_sharded`` also over the replicas, the row exchange's
    backward), i.e. ``Σ_ranks ∂loss_rank/∂θ``. The single-process gradient is that of the mean
    over the ranks, so ``reduce`` divides by the world size. Under ``replicated_sync`` a replica
    sums only its own ``sparse_shard`` group's ranks, and ``reduce`` divides by ``sparse_shard``:
    each replica steps on the gradient of its own share of the batch (the mean over its ranks), as
    TorchRec's ``DMPCollection`` replicas do, and ``after_step`` averages weights and row-wise
    Adagrad state over ``sparse_replica`` every ``sparse_sync_interval`` steps."""

    def __init__(self, modules: list[ShardedLookups], place: Place, column_groups: dict[str, object],
                 hot: HotGrads | None = None):
        self.modules, self.place, self.steps = modules, place, 0
        self.params = [m.weight(n) for m in modules for n in m.routed]
        self.column_groups = column_groups  # table -> the group of the ranks holding its rows' other columns
        self.hot = hot or HotGrads([], None, place.world, "fp32")  # the hot rows' gradients (executor.hot_rows)

    def attach(self, sparse_opt) -> None:
        """Row-wise Adagrad's per-row mean of g² over the whole row for column- and grid-wise
        tables (each shard holds only some columns of a row; the sums of squares are all-reduced
        over the ranks holding the others, which touch the same rows: the same ids reach them)."""
        for m in self.modules:
            for n in m.held:
                group = self.column_groups.get(n)
                if group is not None:
                    sparse_opt.row_mean_sq[id(m.weight(n))] = _row_mean_sq(m.layouts[n].dim, group)

    def begin(self, batches: list) -> None:
        """Before the step's micro-batches: the first one's ids sent (``start``)."""
        if batches:
            self.start(batches[0])

    def start(self, batch) -> None:
        """Send ``batch``'s ids to their shards now (every table module's counts in one exchange,
        then each module's ids all-to-all, async), so that they travel while the micro-batch
        before it computes; its forward then waits for them. A batch not started is sent in its
        forward."""
        mods = [m for m in self.modules if m.routed]
        if not mods:
            return
        routed = [m.route(batch) for m in mods]
        sent, got = _exchange_counts(torch.cat([r.meta for r in routed], dim=1), self.place.shard_group, SHARD)
        col = 0
        for m, r in zip(mods, routed):
            k = r.meta.shape[1]
            inbound = m.dispatch(r, [x[col : col + k] for x in sent], [x[col : col + k] for x in got], async_op=True)
            m.pending[id(batch)] = (batch, inbound)
            col += k

    def reduce(self) -> None:
        """Scale the local shards' gradients to the single-process one (call after the backward)."""
        pl = self.place
        scale = pl.S if pl.strategy == "replicated_sync" else pl.world
        self.hot.reduce(scale)  # weights with hot rows: theirs averaged over every rank, the rest / scale
        hot = {id(p) for p, _ in self.hot.params}
        for p in self.params:
            if p.grad is not None and id(p) not in hot:
                p.grad = p.grad / scale

    def after_step(self, sparse_opt) -> None:
        """After the sparse optimizer's step: under ``replicated_sync`` (R > 1), every
        ``sparse_sync_interval``-th step averages the shards and their Adagrad sums over the replicas."""
        pl = self.place
        if pl.strategy != "replicated_sync" or pl.R == 1:
            return
        self.steps += 1
        if self.steps % pl.sync_interval == 0:
            self.sync(sparse_opt)

    @torch.no_grad()
    def sync(self, sparse_opt) -> None:
        """Weights and row-wise Adagrad state averaged over ``sparse_replica`` (every replica issues
        the same all-reduces: a state not made yet is made, zeros, as the optimizer would). Hot rows
        are the same on every rank already: only the cold rows are synced."""
        pl, hot = self.place, {id(p): n for p, n in self.hot.params}
        for p in self.params:
            state = sparse_opt.state[p]
            if "sum" not in state:
                state["sum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
            for t in (p.data[hot.get(id(p), 0) :], state["sum"][hot.get(id(p), 0) :]):
                with comm_region(REPLICA):
                    dist.all_reduce(t, group=pl.replica_group)
                t.div_(pl.R)


def _row_mean_sq(dim: int, group):
    def mean_sq(grad: Tensor) -> Tensor:
        sq = grad.square().sum(dim=1)
        with comm_region(SHARD):
            dist.all_reduce(sq, group=group)
        return sq / dim

    return mean_sq


def column_groups(layouts: dict[str, TableLayout], place: Place) -> dict[str, object]:
    """For each table split column-wise (column, grid), the process group of the ranks holding the
    same rows in its other column blocks (same row class, same replica), where this rank is one.
    Every rank makes every group (``new_group`` is collective), in one order."""
    made: dict[tuple, object] = {}
    mine = place.replica * place.S + place.shard  # the sparse view's row-major rank
    out = {}
    for name, L in sorted(layouts.items()):
        if not L.routed or len(L.blocks()) < 2:
            continue
        for q in range(place.R):
            for i in range(L.a):
                ranks = tuple(q * place.S + L.grid[i][j] for j in L.blocks())
                if ranks not in made:
                    made[ranks] = dist.new_group(list(ranks))
                if mine in ranks:
                    out[name] = made[ranks]
    return out


def shard_tables(model: nn.Module, scenario: Scenario, mesh, *, skip: tuple[nn.Module, ...] = ()) -> ShardedTables:
    """The sharded lookups installed on ``model``'s table modules (``shard_modules``) over the
    run's mesh, and the column groups that row-wise Adagrad's sums of squares need. ``skip``: table
    modules another backend shards (the pooled tables under ``parallelism.sparse_backend: torchrec``)."""
    place, layouts = Place.of(scenario, mesh), table_layouts(scenario)
    modules = shard_modules(model, layouts, place, skip=skip)
    hot = HotGrads([(m.weight(n), m.layouts[n].hot) for m in modules for n in m._hot_tables()],
                   mesh.world.get_group(), place.world, place.comm)  # fmt: skip
    return ShardedTables(modules, place, column_groups(layouts, place), hot)


def shard_modules(model: nn.Module, layouts: dict[str, TableLayout], place: Place, *,
                  skip: tuple[nn.Module, ...] = ()) -> list[ShardedLookups]:
    """Install the sharded lookups (``mod.sharded``) on every table module of ``model`` with a
    routed table (but those in ``skip``): its routed tables' weights become this rank's shards
    (sliced from the whole tables every rank initialised alike, in one buffer per shard width:
    ``ShardedLookups.lay_out``) and its data-parallel tables stay whole in buffers of their own
    (``keep_whole``), so that the buffers that held every table whole are freed. A module of
    data-parallel tables only is left as it is (its own lookups, its buffers). No collective:
    ``place`` says which shards are mine."""
    from executor.embeddings import _FusedTableModule

    modules = []
    for mod in model.modules():
        if not isinstance(mod, _FusedTableModule) or any(mod is m for m in skip):
            continue
        lookups = ShardedLookups(mod, layouts, place)
        if not lookups.routed:
            continue
        lookups.lay_out()
        mod.keep_whole([n for n in lookups.layouts if n not in lookups.routed])
        mod.sharded = lookups
        modules.append(lookups)
    return modules


@torch.no_grad()
def full_tables(model: nn.Module) -> dict[str, Tensor]:
    """Every table whole, on every rank (a world all-reduce per sharded table), by parameter name:
    for parity tests and checkpoints. Under ``replicated_sync`` replica 0's shards are taken. Tables
    handed to TorchRec (``executor.torchrec_tables.hand_over``: no longer the module's parameters)
    come from TorchRec's shards, under the names they had."""
    from executor.embeddings import _FusedTableModule

    out = {}
    for prefix, mod in model.named_modules():
        if not isinstance(mod, _FusedTableModule):
            continue
        lookups = getattr(mod, "sharded", None)
        if lookups is not None and not isinstance(lookups, ShardedLookups):  # the torchrec backend's
            out.update({(f"{prefix}.tables.{n}.weight" if prefix else f"tables.{n}.weight"): w
                        for n, w in lookups.full_tables().items()})  # fmt: skip
            continue
        for n, t in mod.tables.items():
            name = f"{prefix}.tables.{n}.weight" if prefix else f"tables.{n}.weight"
            w = t.weight.detach()
            if lookups is None or n not in lookups.routed:
                out[name] = w.clone()
                continue
            pl, L = lookups.place, lookups.layouts[n]
            whole = w.new_zeros((L.rows, L.dim))
            if pl.split_replicas or pl.replica == 0:
                rows, c0, c1 = L.held(pl.shard, pl.replica)
                first = 0 if pl.shard == pl.replica == 0 else L.hot  # the hot rows, on every rank: rank 0's
                whole[rows[first:].to(w.device), c0:c1] = w[first:]
            dist.all_reduce(whole)
            out[name] = whole
    return out
