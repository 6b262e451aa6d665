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

The lookups are torch ones (``F.embedding`` with sparse gradients) on every device, CUDA too: the
Triton TBE kernels look up a ``FusedTables`` buffer of whole tables, and the shards are not laid
out as one yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from executor.comm_profile import comm_region
from executor.embeddings import PooledTables
from executor.table_layout import TableLayout, table_layouts
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

    @classmethod
    def of(cls, s: Scenario, mesh) -> Place:
        ss, sr = mesh["sparse_shard"], mesh["sparse_replica"]
        p = s.parallelism
        return cls(ss.get_local_rank(), sr.get_local_rank(), ss.get_group(), sr.get_group(), ss.size(), sr.size(),
                   mesh.world.size(), p.sparse_strategy, p.sparse_sync_interval)  # fmt: skip

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

    def weight(self, name: str) -> Tensor:
        return self.module.tables[name].weight

    # the two entry points: the modules' forwards delegate here
    def pooled(self, batch) -> dict[str, Tensor]:
        """``{table: [B, dim]}``, exactly the single-process sums (row and grid partial sums added)."""
        out = self._routed(batch)
        for n in self.layouts:
            if not self.layouts[n].routed:
                ids, offsets = batch.pooled[n]
                out[n] = F.embedding_bag(ids, self.weight(n), offsets, mode="sum", sparse=True,
                                         include_last_offset=True).float()  # fmt: skip
        return {n: out[n] for n in self.layouts}

    def sequence(self, batch) -> dict[str, Tensor]:
        """``{table: [ΣL, dim]}``, one row per token."""
        out = self._routed(batch)
        ids = batch.sequences[self.module.name].ids
        for n in self.layouts:
            if not self.layouts[n].routed:
                out[n] = F.embedding(ids[n], self.weight(n), sparse=True).float()
        return {n: out[n] for n in self.layouts}

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
        outputs = _a2a(back, back_sizes, expect, self.place.shard_group, SHARD, grad=True)
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
        sources = self._sources({n: v[0] for n, v in tables.items()})
        chunks: list[list[Tensor]] = [[] for _ in range(S)]
        for n, (_, where, src) in tables.items():
            t = self.routed.index(n)
            table, index, sparse = sources[n]
            if pooled:  # the ids come sorted by (source, bag): one bag per (source, bag), as one process sums
                sizes = [got[p][T] for p in range(S)]
                base = torch.tensor([0, *sizes[:-1]], device=device).cumsum(0)
                per_bag = torch.bincount(base[src] + where, minlength=sum(sizes))
                offsets = torch.cat([per_bag.new_zeros(1), per_bag.cumsum(0)])
                out = F.embedding_bag(index, table, offsets, mode="sum", sparse=sparse, include_last_offset=True)
                per = out.float().split(sizes)
            else:
                per = F.embedding(index, table, sparse=sparse).float().split([got[p][t] for p in range(S)])
            for p in range(S):
                chunks[p].append(per[p].reshape(-1))
        anchor = _anchor(recv)
        flat = [torch.cat([*c, anchor]) for c in chunks]
        return torch.cat([*flat, sources["__anchor__"]]), [len(f) for f in flat]

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

    def _sources(self, local: dict[str, Tensor]) -> dict[str, tuple[Tensor, Tensor, bool]]:
        """Per held table, what its lookups read: ``(table, index, sparse gradient)``, the local
        shard at the shard-local rows, or (fully sharded over replicas) the rows fetched from
        their replica owners at each id's place among them; and an ``"__anchor__"`` (empty) tied
        to the replica exchange, so that every rank runs its backward."""
        if not self.place.split_replicas:
            out: dict = {n: (self.weight(n), r, True) for n, r in local.items()}
            out["__anchor__"] = _anchor(next(iter(local.values()), torch.zeros(0)))
            return out
        return self._replica_rows(local)

    def _replica_rows(self, local: dict[str, Tensor]) -> dict:
        """Fully sharded: each table's unique rows requested from their replica owners (row ``l``
        on replica ``l % R`` at ``l // R``), looked up there, all-to-all'd back (autograd: the rows'
        gradients go back to their owners)."""
        pl, names = self.place, list(local)
        R, Th = pl.R, len(names)
        if not names:  # a shard holding none of these tables: so do its replicas, none exchanges
            return {"__anchor__": _anchor(torch.zeros(0))}
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
        chunks: list[list[Tensor]] = [[] for _ in range(R)]
        for t, n in enumerate(names):
            p = torch.nonzero(seg % Th == t).squeeze(1)
            rows = F.embedding(asked[p], self.weight(n), sparse=True).float()
            for q, r in enumerate(rows.split([got[q][t] for q in range(R)])):
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
        out["__anchor__"] = back[:0]
        return out


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

    def __init__(self, modules: list[ShardedLookups], place: Place, column_groups: dict[str, object]):
        self.modules, self.place, self.steps = modules, place, 0
        self.params = [m.weight(n) for m in modules for n in m.routed]
        self.column_groups = column_groups  # table -> the group of the ranks holding its rows' other columns

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
        for p in self.params:
            if p.grad is not None:
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
        the same all-reduces: a state not made yet is made, zeros, as the optimizer would)."""
        pl = self.place
        for p in self.params:
            state = sparse_opt.state[p]
            if "sum" not in state:
                state["sum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
            for t in (p.data, state["sum"]):
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
    """Install the sharded lookups on every table module of ``model`` (``mod.sharded``), their
    weights replaced by this rank's shards (sliced from the whole tables every rank initialised
    alike; a table's whole initial copy is freed). ``skip``: table modules another backend shards
    (the pooled tables under ``parallelism.sparse_backend: torchrec``)."""
    from executor.embeddings import _FusedTableModule

    place, layouts = Place.of(scenario, mesh), table_layouts(scenario)
    modules = []
    for mod in model.modules():
        if not isinstance(mod, _FusedTableModule) or any(mod is m for m in skip):
            continue
        lookups = ShardedLookups(mod, layouts, place)
        for n in lookups.routed:
            rows, c0, c1 = layouts[n].held(place.shard, place.replica)
            whole = mod.tables[n].weight.detach()
            mod.tables[n].weight = nn.Parameter(whole[rows.to(whole.device)][:, c0:c1].clone())
        if lookups.routed:
            mod.fused = []  # the whole tables' buffer; the Triton path no longer runs (use_triton)
        mod.sharded = lookups
        modules.append(lookups)
    return ShardedTables(modules, place, column_groups(layouts, place))


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
                whole[rows.to(w.device), c0:c1] = w
            dist.all_reduce(whole)
            out[name] = whole
    return out
