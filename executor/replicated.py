"""Parameters every rank holds whole, kept in step by averaging their gradients over the world.

The 5D executor shards the dense parameters (FSDP2, ``executor.parallelize``), the embedding
tables (2D, ``executor.sharded_tables``) and, with ``parallelism.expert`` > 1, the experts
(``executor.expert_parallel``). What stays whole on every rank is the experts when ``expert`` is 1
and the tables the plan makes data-parallel (``parallelism.table_sharding: {family: data}``):
plain data parallelism, correct and simple. After the backward, ``ReplicatedGrads.reduce``
averages their gradients over the world, so every rank's optimizers see the gradient of the
global batch, as the single-process run does:

- dense gradients (replicated experts, and tables on a path that makes dense table gradients)
  travel in one flat all-reduce, with one extra element per parameter that counts the ranks where
  it had a gradient: a parameter no rank touched keeps ``grad = None``, so
  AdamW skips it exactly as it does on one process;
- sparse table gradients (``sparse=True`` lookups) are all-gathered as (row, value) pairs and
  summed by the row-wise Adagrad's coalesce: the traffic is the rows a step touches, never the
  table. The averaged gradient's rows are each rank's rows, so the update is the one the global
  batch makes (``executor.optim.RowWiseAdagrad``).

The sum is divided by the world size: each rank's loss is the mean over its own micro-batches, so
the mean over ranks is the mean over the global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from executor.optim import touched_rows


class ReplicatedGrads:
    """The gradients of ``dense`` (experts, without expert parallelism) and ``tables``
    (data-parallel embedding tables), identical parameters on every rank of ``group``, averaged over
    ``group``. Which way each travels is fixed here, not read from each rank's gradients, so every
    rank issues the same collectives."""

    def __init__(self, dense: list[torch.nn.Parameter], tables: list[torch.nn.Parameter], group):
        self.dense, self.tables, self.group = list(dense), list(tables), group
        self.world = dist.get_world_size(group)

    def reduce(self) -> None:
        """Average every gradient over the group (call on every rank, after the backward)."""
        self._reduce_dense()
        for p in self.tables:
            self._reduce_table(p)

    def _reduce_dense(self) -> None:
        """One all-reduce of every dense gradient (zeros where a rank has none) and a has-grad count."""
        params = self.dense
        if not params:
            return
        device = params[0].device
        parts = [p.grad.reshape(-1).float() if p.grad is not None else torch.zeros(p.numel(), device=device)
                 for p in params]  # fmt: skip
        had = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=device)
        flat = torch.cat([*parts, had])
        dist.all_reduce(flat, group=self.group)
        sums, counts = flat[: -len(params)].split([p.numel() for p in params]), flat[-len(params) :].tolist()
        for p, total, n in zip(params, sums, counts):
            p.grad = None if n == 0 else (total / self.world).view(p.shape).to(p.dtype)

    def _reduce_table(self, p: torch.nn.Parameter) -> None:
        """The table's touched (row, value) pairs from every rank, concatenated, over the world size
        (a sparse gradient; a rank that did not touch the table sends none)."""
        if p.grad is None:
            rows, values = torch.zeros(0, dtype=torch.int64, device=p.device), p.new_zeros((0, *p.shape[1:]))
        else:
            rows, values = touched_rows(p.grad)
        rows, values = _all_gather_rows(rows, values.float(), self.group, self.world)
        p.grad = torch.sparse_coo_tensor(rows[None], (values / self.world).to(p.dtype), p.shape, check_invariants=False)


def _all_gather_rows(rows: Tensor, values: Tensor, group, world: int) -> tuple[Tensor, Tensor]:
    """Variable-length all-gather: the counts first, then rows and values padded to the longest."""
    count = torch.tensor([len(rows)], dtype=torch.int64, device=rows.device)
    counts = [torch.empty_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    counts = [int(c) for c in counts]
    longest = max(counts)
    pad = longest - len(rows)
    rows = torch.cat([rows, rows.new_zeros(pad)])
    values = torch.cat([values, values.new_zeros((pad, *values.shape[1:]))])
    all_rows = [torch.empty_like(rows) for _ in range(world)]
    all_values = [torch.empty_like(values) for _ in range(world)]
    dist.all_gather(all_rows, rows, group=group)
    dist.all_gather(all_values, values, group=group)
    return (torch.cat([r[:n] for r, n in zip(all_rows, counts)]),
            torch.cat([v[:n] for v, n in zip(all_values, counts)]))  # fmt: skip
