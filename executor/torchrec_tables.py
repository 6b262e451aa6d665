"""The ``torchrec`` backend of 2D embedding parallelism: the pooled tables sharded over
``sparse_shard`` by TorchRec, following the Scenario's own plan (the ``torchrec`` extra).

``scenarios.placement.table_plan`` (a sharding per table family) and ``table_owners`` (the
``sparse_shard`` rank of each table-wise table) are the plan the twin prices; this module turns
them into TorchRec ``ParameterSharding``s (``construct_module_sharding_plan`` with the
``table_wise(rank=…)``, ``column_wise(ranks=…)``, ``row_wise()``, ``data_parallel()`` helpers) and
shards an ``EmbeddingBagCollection`` with ``DistributedModelParallel`` over the ``sparse_shard``
process group. TorchRec does the input and output all-to-alls; the ``native`` backend
(our own all-to-alls) is the other implementation of the same plan.

What runs where, and why it equals the single-process model (``PooledTables`` +
``executor.optim.RowWiseAdagrad`` on the global batch, loss = mean over ranks of each rank's mean
over its micro-batches):

- table-, column-wise tables: FBGEMM's TBE with the optimizer fused into its backward
  (``EXACT_ROWWISE_ADAGRAD``: per row ``s += mean_j g²``, ``w -= lr·g/(sqrt(s)+eps)``, duplicate ids
  summed first, as ``RowWiseAdagrad``'s coalesce does). TorchRec's output all-to-all divides the
  gradient by the group size in its backward (``comm_ops.GRADIENT_DIVISION``, on by default), so the
  owner's gradient is the mean over ranks: the reference's.
- data-parallel tables: TorchRec keeps them whole on every rank as plain parameters under DDP
  (which averages their gradients over the group); TorchRec fuses no optimizer there, so
  ``step()`` applies ``RowWiseAdagrad`` to them, the same update.
- row-wise and grid: TorchRec's CPU sharder lists only data-parallel / table-wise / column-wise
  / table-column-wise (gloo lacks the reduce-scatter it needs): on CPU they are refused in one line.
  Grid is refused on every device: TorchRec's ``grid_shard`` spreads rows over hosts, which our
  plan does not say; the ``native`` backend runs it.

The fused update happens *inside the backward*, once per backward. A step of several
micro-batches (``Scenario.grad_accum``) must therefore look them all up at once, so that the
tables see one accumulated gradient, as ``RowWiseAdagrad`` does: ``lookup(batches)`` makes one
TorchRec lookup of the step's micro-batches and hands back detached leaves per micro-batch; the
micro-batches' backwards fill the leaves' gradients; ``backward()`` then pushes them through
TorchRec once (one output all-to-all backward, one fused update). ``forward(batch)`` is the plain
one-micro-batch lookup: its backward updates the tables at once.

Column-wise note: the row-wise accumulator of a column shard is the mean of ``g²`` over *its*
columns, not over the whole row: a table split column-wise over ``k`` ranks keeps ``k``
accumulators per row (each shard a table of its own, FBGEMM's layout). That is TorchRec's update,
not quite ``RowWiseAdagrad``'s; ``column_blocks`` says where the blocks are, so a reference can
apply the same update per block.

In the training step (``executor.parallelize.apply_sharding`` with ``parallelism.sparse_backend:
torchrec``): ``shard_pooled_torchrec`` builds it from the model's tables, ``hand_over`` makes it
``PooledTables``' lookups and drops the model's own copies, and ``executor.train.step_loss`` drives
it through the interface the native backend has too (``begin``: the step's one lookup; ``reduce``:
its one backward; ``after_step``: the data-parallel tables' update). The sequence tables stay on
the native backend (TorchRec's ``EmbeddingCollection`` is not wired); ``precision.embeddings=bf16``,
``sparse_replica > 1`` and hot rows on a pooled table are refused (``check_plan``: TorchRec has no
hot-row replication; its closest, the UVM caching kernels, caches rows in HBM per rank and does not
replicate their updates).

Importing this module needs torch only; building the backend needs torchrec and fbgemm
(``require_torchrec`` names the fix when they are missing).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from executor.data import Batch
from executor.optim import RowWiseAdagrad
from scenarios.placement import hot_rows, table_owners, table_plan
from scenarios.schema import Scenario

EPS = 1e-8  # RowWiseAdagrad's default, passed to FBGEMM explicitly (its default differs by version)
CPU_SHARDINGS = frozenset({"table", "column", "data"})  # what TorchRec's CPU sharder allows, in our names


def require_torchrec() -> None:
    """One-line ``ImportError`` when torchrec or its FBGEMM kernels cannot be imported. Checked when
    the backend is built, not when a Scenario is validated: the twin prices a ``torchrec`` plan on
    machines without torchrec (the GPU image has none)."""
    try:
        import fbgemm_gpu  # noqa: F401  (fails with OSError when its build does not match torch's)
        import torchrec  # noqa: F401
    except (ImportError, OSError) as e:
        raise ImportError(
            f"parallelism.sparse_backend=torchrec needs torchrec and fbgemm-gpu(-cpu), which do not import here "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no message'}): install the torchrec "
            f"extra as README.md's Set up does (uv pip install -e '.[exec,torchrec]': plain pip pulls the CUDA "
            f"fbgemm-gpu) or set parallelism.sparse_backend=native"
        ) from None


def check_plan(scenario: Scenario, device: torch.device) -> dict[str, str]:
    """Our sharding of each pooled table (by table name); one-line ``ValueError`` for a plan this
    backend cannot run on ``device``, naming the field or table, its value and the fix.

    ``sparse_replica > 1`` is refused: each replica group would train its own sharded copy with
    nothing keeping the copies in step. TorchRec's answer, ``DMPCollection`` (its 2D
    parallelism), asserts CUDA, and its ``fully_sharded`` strategy needs CUDA streams."""
    p = scenario.parallelism
    if p.sparse_replica > 1:
        raise ValueError(
            f"parallelism.sparse_replica ({p.sparse_replica}) must be 1 with parallelism.sparse_backend=torchrec "
            f"(replicas of the sharded tables need TorchRec's DMPCollection, CUDA only): set "
            f"parallelism.sparse_replica=1 and sparse_shard={p.sparse_shard * p.sparse_replica}, "
            f"or parallelism.sparse_backend=native"
        )
    if scenario.precision.embeddings != "fp32":
        raise ValueError(
            f"precision.embeddings ({scenario.precision.embeddings}) must be fp32 with parallelism.sparse_backend="
            f"torchrec (its tables train in fp32 here): set precision.embeddings=fp32, "
            f"or parallelism.sparse_backend=native"
        )
    plan, hot = table_plan(scenario), hot_rows(scenario)
    n = p.sparse_shard
    out = {}
    for fam in scenario.model.embeddings.pooled:
        kind = plan[fam.name]
        if fam.name in hot:
            raise ValueError(
                f"model.embeddings.pooled[{fam.name}].hot_rows ({fam.hot_rows}) needs parallelism.sparse_backend="
                f"native (the torchrec backend has no hot-row replication): set parallelism.sparse_backend=native, "
                f"or hot_rows to 0")
        name = ", ".join(fam.table_names())
        if kind == "grid" or (device.type == "cpu" and kind not in CPU_SHARDINGS):
            where = "on CPU (TorchRec's CPU sharder allows table, column and data only)" if kind == "row" \
                else "(our grid is not mapped onto TorchRec's grid_shard)"  # fmt: skip
            raise ValueError(
                f"table {name} (family {fam.name}): {kind}-wise, which the torchrec backend cannot shard {where}; "
                f"set parallelism.sparse_backend=native, or parallelism.table_sharding.{fam.name} to table or column"
            )
        if kind == "column" and fam.dim % n:
            raise ValueError(
                f"table {name} (family {fam.name}): column-wise over sparse_shard {n}, which does not divide its "
                f"dim ({fam.dim}); set parallelism.table_sharding.{fam.name} to table, "
                f"or a sparse_shard dividing {fam.dim}"
            )
        out.update(dict.fromkeys(fam.table_names(), kind))
    return out


def column_blocks(scenario: Scenario) -> dict[str, int]:
    """Per pooled table, how many column blocks its row-wise accumulator is kept in: the
    ``sparse_shard`` size for a column-wise table, 1 for the others (see the module docstring)."""
    plan, n = table_plan(scenario), scenario.parallelism.sparse_shard
    return {name: n if plan[f.name] == "column" else 1 for f in scenario.model.embeddings.pooled
            for name in f.table_names()}  # fmt: skip


class _Holder(nn.Module):
    """The EBC under one attribute, so that the TorchRec plan has a module path (``ebc``)."""

    def __init__(self, ebc: nn.Module):
        super().__init__()
        self.ebc = ebc

    def forward(self, kjt):
        return self.ebc(kjt)


class TorchrecPooled:
    """The scenario's pooled tables sharded by TorchRec over ``group`` (the ``sparse_shard``
    process group), starting from ``weights`` (``{table: [rows, dim]}``, the same on every rank).
    ``forward(batch)`` (or calling it) returns ``{table: [B, dim]}`` like ``PooledTables``; the
    optimizer is TorchRec's fused row-wise Adagrad (table-, column-wise) and ``step()``
    (data-parallel).

    Not an ``nn.Module`` on purpose: installed as ``PooledTables.sharded`` it must not become a
    submodule of the model, whose parameters go to FSDP2 and the dense optimizer. It meets the
    training step through the interface ``executor.sharded_tables.ShardedTables`` has too
    (``begin``, ``start``, ``attach``, ``reduce``, ``after_step``: ``executor.train.step_loss``
    drives both backends alike)."""

    def __init__(self, scenario: Scenario, weights: dict[str, Tensor], group, *, device: torch.device | None = None):
        require_torchrec()
        from torchrec import EmbeddingBagCollection
        from torchrec.distributed import DistributedModelParallel
        from torchrec.distributed.types import ShardingEnv, ShardingPlan

        from executor.sparse import ebc_configs

        device = device or torch.device("cpu")
        self.kinds = check_plan(scenario, device)
        _quiet_fx_tracing_warning()
        _check_gradient_division()
        self.group = group
        self.names = list(self.kinds)
        self.shapes = {n: (f.rows, f.dim) for f in scenario.model.embeddings.pooled for n in f.table_names()}
        self.blocks = column_blocks(scenario)
        self.family_tables = [fam.table_names() for fam in scenario.model.embeddings.pooled]
        sharder = _sharder(scenario.training.sparse_lr)
        ebc = EmbeddingBagCollection(tables=ebc_configs(scenario.model.embeddings), device=torch.device("meta"))
        module_plan = self._module_plan(ebc, scenario, sharder, dist.get_world_size(group), device)
        self.dmp = DistributedModelParallel(_Holder(ebc), env=ShardingEnv.from_process_group(group), device=device,
                                            plan=ShardingPlan({"ebc": module_plan}), sharders=[sharder])  # fmt: skip
        self._load(weights)
        params = dict(self.dmp.named_parameters())
        self.replicated = {n: params[f"ebc.embedding_bags.{n}.weight"] for n, k in self.kinds.items() if k == "data"}
        self.dense_opt = RowWiseAdagrad(list(self.replicated.values()), lr=scenario.training.sparse_lr, eps=EPS) \
            if self.replicated else None  # fmt: skip
        self._pending: list[tuple[dict[str, Tensor], list[tuple[Batch, dict[str, Tensor]]]]] = []

    def _module_plan(self, ebc, scenario: Scenario, sharder, world: int, device: torch.device):
        """Our plan as TorchRec's: table-wise on the table's owner, column-wise over every rank of the
        group (equal column blocks), row-wise over all of them, data-parallel."""
        from torchrec.distributed.sharding_plan import (column_wise, construct_module_sharding_plan, data_parallel,
                                                        row_wise, table_wise)  # fmt: skip

        owners = table_owners(scenario)
        make = {"table": lambda n: table_wise(rank=owners[n], compute_kernel="fused"),
                "column": lambda n: column_wise(ranks=list(range(world)), compute_kernel="fused"),
                "row": lambda n: row_wise(compute_kernel="fused"),
                "data": lambda n: data_parallel()}  # fmt: skip
        return construct_module_sharding_plan(ebc, {n: make[k](n) for n, k in self.kinds.items()}, sharder=sharder,
                                              local_size=world, world_size=world, device_type=device.type)  # fmt: skip

    # ---- the step's interface (executor.train.step_loss; ShardedTables has the same) --------------
    def begin(self, batches: list[Batch]) -> None:
        """Before the step's micro-batches: all of them in one lookup (``lookup``)."""
        self.lookup(batches)

    def start(self, batch: Batch) -> None:
        """Nothing: ``begin`` already looked up every micro-batch of the step."""

    def attach(self, sparse_opt) -> None:
        """Nothing: TorchRec's tables have their own optimizer (fused, and ``step``'s)."""

    def reduce(self) -> None:
        """After the micro-batches' backwards: their gradients through TorchRec once (``backward``),
        which updates the sharded tables and leaves the data-parallel ones' gradients averaged."""
        self.backward()

    def after_step(self, sparse_opt) -> None:
        """With the other optimizers: the data-parallel tables' update (``step``)."""
        self.step()

    # ---- the lookups ----------------------------------------------------------------------------
    def __call__(self, batch: Batch) -> dict[str, Tensor]:
        return self.forward(batch)

    def pooled(self, batch: Batch) -> dict[str, Tensor]:
        """What ``PooledTables.forward`` delegates to once the tables are handed over."""
        return self.forward(batch)

    def forward(self, batch: Batch) -> dict[str, Tensor]:
        """``{table: [B, dim]}``: of a micro-batch a pending ``lookup`` holds (that very ``Batch``
        object), its leaves; otherwise one TorchRec lookup, whose backward applies the fused update
        at once."""
        for _, leaves in self._pending:
            for b, leaf in leaves:
                if b is batch:
                    return leaf
        return self._lookup(batch)

    def families(self, batch: Batch) -> list[Tensor]:
        """``[B, count, dim]`` per pooled family, in config order (``PooledTables.families``)."""
        pooled = self(batch)
        return [torch.stack([pooled[n] for n in names], dim=1) for names in self.family_tables]

    def lookup(self, batches: list[Batch]) -> list[dict[str, Tensor]]:
        """A step's micro-batches in one TorchRec lookup: per micro-batch ``{table: [B_i, dim]}``,
        detached leaves whose gradients the micro-batches' backwards accumulate (``forward`` of one
        of these batches hands back its leaves, so the model runs unchanged); ``backward()`` then
        sends them through TorchRec once (one fused update per step, see the module docstring)."""
        out = self._lookup(_cat(batches))
        sizes = [b.size for b in batches]
        leaves = [dict(zip(self.names, parts)) for parts in
                  zip(*[[p.detach().requires_grad_() for p in out[n].split(sizes)] for n in self.names])]  # fmt: skip
        self._pending.append((out, list(zip(batches, leaves))))
        return leaves

    def _lookup(self, batch: Batch) -> dict[str, Tensor]:
        from executor.sparse import pooled_kjt

        out = self.dmp(pooled_kjt(batch)).to_dict()
        return {n: out[n] for n in self.names}  # index by key: TorchRec's order follows its sharding

    def backward(self) -> None:
        """The gradients the pending ``lookup``s' leaves gathered, through TorchRec's backward (every
        rank calls it, once per ``lookup``: the output all-to-all is collective). A leaf no loss
        reached sends zeros."""
        for out, leaves in self._pending:
            grads = [torch.cat([leaf[n].grad if leaf[n].grad is not None else torch.zeros_like(leaf[n])
                                for _, leaf in leaves]) for n in self.names]  # fmt: skip
            torch.autograd.backward([out[n] for n in self.names], grads)
        self._pending.clear()

    def step(self) -> None:
        """The data-parallel tables' update (their gradients already averaged by DDP); the sharded
        tables were updated in the backward."""
        if self.dense_opt is not None:
            self.dense_opt.step()
            self.dense_opt.zero_grad(set_to_none=True)

    # ---- the weights and the optimizer state ------------------------------------------------------
    def _state(self, n: str):
        return self.dmp.state_dict()[f"ebc.embedding_bags.{n}.weight"]

    @torch.no_grad()
    def _load(self, weights: dict[str, Tensor]) -> None:
        """Copy the whole tables into this rank's shards (TorchRec re-initialises what it shards;
        ``state_dict`` hands back views of its TBE buffers, so a copy into them is the load)."""
        from torch.distributed._shard.sharded_tensor import ShardedTensor

        for n in self.names:
            v = self._state(n)
            for s in v.local_shards() if isinstance(v, ShardedTensor) else ():
                s.tensor.copy_(weights[n][_block(s.metadata)])
            if not isinstance(v, ShardedTensor):
                v.copy_(weights[n])

    @torch.no_grad()
    def full_tables(self) -> dict[str, Tensor]:
        """Every table whole, on every rank (a collective over the group: call it on every rank)."""
        return {n: self._whole(self._state(n), self.shapes[n]) for n in self.names}

    @torch.no_grad()
    def accumulators(self) -> dict[str, Tensor]:
        """Every table's row-wise Adagrad sums, ``[blocks, rows]`` (``column_blocks``; zeros before the
        first update), on every rank: FBGEMM's ``momentum1`` (a column-wise table's blocks laid end to
        end), or ``RowWiseAdagrad``'s for a data-parallel table. They scale as the gradient squared,
        so they show how the gradient was scaled over the ranks, which the update itself hides (a
        row-wise Adagrad step does not change when every gradient is scaled alike). A collective."""
        # this rank's fused state: only the tables it holds a shard of (keyed by parameter path)
        fused = {k.rsplit(".", 2)[-2]: v for k, v in self.dmp.fused_optimizer.state_dict()["state"].items()}
        out = {}
        for n in self.names:
            rows, blocks = self.shapes[n][0], self.blocks[n]
            if n in self.replicated:
                out[n] = self.dense_opt.state.get(self.replicated[n], {}).get("sum", torch.zeros(rows)).clone()[None]
            else:
                momentum = fused[n][f"{n}.momentum1"] if n in fused else None
                out[n] = self._whole(momentum, (blocks * rows,)).view(blocks, rows)
        return out

    @torch.no_grad()
    def load_accumulators(self, sums: dict[str, Tensor]) -> None:
        """Set every table's row-wise Adagrad sums from ``accumulators``' whole ``[blocks, rows]``
        (this rank's shards of FBGEMM's ``momentum1`` copied in place; a data-parallel table's into
        its optimizer's state): what a checkpoint restores."""
        fused = {k.rsplit(".", 2)[-2]: v for k, v in self.dmp.fused_optimizer.state_dict()["state"].items()}
        for n in self.names:
            flat = sums[n].reshape(-1)
            if n in self.replicated:
                self.dense_opt.state[self.replicated[n]]["sum"] = sums[n][0].clone()
                continue
            for shard in fused[n][f"{n}.momentum1"].local_shards() if n in fused else ():
                shard.tensor.copy_(flat[_block(shard.metadata)])

    def load_tables(self, weights: dict[str, Tensor]) -> None:
        """Copy whole tables into this rank's shards (a checkpoint's restore)."""
        self._load(weights)

    def _whole(self, v, shape) -> Tensor:
        """A ShardedTensor whole on every rank: each rank's blocks placed in zeros, summed over the
        group (a block lives on one rank only; None: this rank holds none); a plain tensor
        (data-parallel) as it is."""
        from torch.distributed._shard.sharded_tensor import ShardedTensor

        if v is not None and not isinstance(v, ShardedTensor):
            return v.detach().clone()
        full = torch.zeros(shape, dtype=torch.float32)
        for s in v.local_shards() if v is not None else ():
            full[_block(s.metadata)] = s.tensor.float()
        dist.all_reduce(full, group=self.group)
        return full


def _block(meta) -> tuple[slice, ...]:
    """The slices of the whole tensor a shard's metadata covers."""
    return tuple(slice(o, o + n) for o, n in zip(meta.shard_offsets, meta.shard_sizes))


def _quiet_fx_tracing_warning() -> None:
    """TorchRec's lookups call ``torch.fx``'s ``is_fx_tracing``, which logs once per process that it
    also returns true under ``torch.export`` (advice to TorchRec, not to our users; every rank
    prints it into ``gemtwin train``'s output). The warning is an ``lru_cache``'d function: called
    once here with its logger disabled, it stays quiet for the process, and nothing else is muted."""
    from torch.fx import _symbolic_trace

    warn = getattr(_symbolic_trace, "is_fx_tracing_warning", None)
    if warn is None:  # another torch: nothing to quiet
        return
    log, was = _symbolic_trace.log, _symbolic_trace.log.disabled
    log.disabled = True
    try:
        warn()
    finally:
        log.disabled = was


def _check_gradient_division() -> None:
    """TorchRec's output all-to-all divides the gradient by the group size (a module-global switch,
    on by default): what makes the tables' gradient the mean over ranks. One line if it is off."""
    from torchrec.distributed.comm_ops import get_gradient_division

    if not get_gradient_division():
        raise ValueError("torchrec.distributed.comm_ops gradient division is off (set_gradient_division(False)): "
                         "turn it back on, or the tables' gradient is the sum over ranks, not the mean that the "
                         "single-process step makes")  # fmt: skip


def _sharder(lr: float):
    """The EBC sharder with FBGEMM's fused exact row-wise Adagrad (``RowWiseAdagrad``'s update)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return EmbeddingBagCollectionSharder(fused_params=dict(optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                           learning_rate=lr, eps=EPS))  # fmt: skip


def _cat(batches: list[Batch]) -> Batch:
    """The micro-batches' pooled ids as one batch (samples in order); dense and labels too, so that
    the result is a whole ``Batch``."""
    if len(batches) == 1:
        return batches[0]
    pooled = {}
    for name in batches[0].pooled:
        ids = [b.pooled[name][0] for b in batches]
        lengths = torch.cat([b.pooled[name][1].diff() for b in batches])
        pooled[name] = (torch.cat(ids), torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]))
    return Batch(dense=torch.cat([b.dense for b in batches]), pooled=pooled, sequences={},
                 labels=torch.cat([b.labels for b in batches]))  # fmt: skip


def shard_pooled_torchrec(model: nn.Module, scenario: Scenario, group) -> TorchrecPooled:
    """The model's pooled tables (``model.pooled``, a ``PooledTables``) sharded by TorchRec over
    ``group`` (``mesh["sparse_shard"].get_group()``), starting from the model's weights. The model
    is left as it was (``hand_over`` plugs the result in)."""
    weights = {n: t.weight.detach().float() for n, t in model.pooled.tables.items()}
    return TorchrecPooled(scenario, weights, group, device=next(model.parameters()).device)


def hand_over(model: nn.Module, pooled: TorchrecPooled) -> None:
    """``model.pooled``'s lookups and tables handed to ``pooled``: its forward delegates there
    (``PooledTables.sharded``; a family's ``[B, count, dim]`` is a stack of its tables), and its
    own tables and their fused buffer are dropped, so that nothing else (``RowWiseAdagrad``,
    ``ReplicatedGrads``, FSDP2, the dense optimizer) sees a copy TorchRec does not train.
    ``executor.sharded_tables.full_tables`` rebuilds them from TorchRec's shards."""
    mod = model.pooled
    mod.sharded = pooled
    mod.tables = nn.ModuleDict()
    mod.fused = []
