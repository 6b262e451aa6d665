"""Hot-row replication in the ``native`` backend (``TableFamily.hot_rows``; the twin prices it from
``scenarios.placement.hot_rows``): rows ``[0, hot)`` of a table, its most popular ids (our ids are
drawn hottest-first), are held whole by every rank, first in the rank's weight of that table
(``executor.table_layout.TableLayout.held``); the cold rows are sharded as the plan says.

- Lookups: a rank looks its batch's hot ids up in its own copy (``hot_bag_sums``,
  ``with_hot_rows``); only the cold ids are routed to the shards (``executor.sharded_tables``).
  A pooled output is the hot partial sum plus the routed cold partial sum.
- Gradients: the hot rows' gradient of each rank's own lookups is all-reduced over every rank
  (``sparse_world``), in ``precision.comm``, one flat all-reduce for every table, once per step,
  and divided by the world size (``HotGrads``): every rank then applies the same row-wise Adagrad
  update to the same rows, that of the global batch, as one process does. (A row whose summed
  gradient is exactly zero is left out of the update: Adagrad would add 0 to its sum and move it
  by 0.) The cold rows' gradients are scaled as before.

This is HugeCTR's hybrid embedding (frequent categories data-parallel with an all-reduce,
infrequent ones model-parallel with all-to-alls; ``scenarios.placement.hot_rows`` cites it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from executor.comm_profile import comm_region
from executor.optim import touched_rows
from scenarios.vocab import CommGroup

WORLD = str(CommGroup.SPARSE_WORLD)  # the profiler's axis name of the hot gradients' all-reduce
COMM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def hot_bag_sums(weight: Tensor, ids: Tensor, offsets: Tensor, hot: int) -> Tensor:
    """``[B, dim]`` fp32: each bag's sum over its ids below ``hot`` (``offsets [B+1]``), looked up in
    this rank's copy of the hot rows (the first ``hot`` rows of ``weight``)."""
    keep = ids < hot
    bag = torch.repeat_interleave(torch.arange(len(offsets) - 1, device=ids.device), offsets.diff())
    counts = torch.bincount(bag[keep], minlength=len(offsets) - 1)
    hot_offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    return F.embedding_bag(ids[keep], weight, hot_offsets, mode="sum", sparse=True,
                           include_last_offset=True).float()  # fmt: skip


def with_hot_rows(weight: Tensor, ids: Tensor, hot: int, cold_rows: Tensor) -> Tensor:
    """``[len(ids), dim]`` fp32, one row per token: a hot id's row from this rank's copy, a cold
    one's from ``cold_rows`` (the cold tokens' rows as routed, in token order)."""
    is_hot = ids < hot
    rows = F.embedding(ids[is_hot], weight, sparse=True).float()
    out = rows.new_zeros((len(ids), weight.shape[1]))
    out = out.index_copy(0, torch.nonzero(is_hot).squeeze(1), rows)
    return out.index_copy(0, torch.nonzero(~is_hot).squeeze(1), cold_rows)


class HotGrads:
    """The hot rows' gradients of the sharded tables (``params``: each weight and its hot rows, in
    one order on every rank), averaged over ``group`` (every rank) in one all-reduce."""

    def __init__(self, params: list[tuple[nn.Parameter, int]], group, world: int, comm: str):
        self.params, self.group, self.world, self.dtype = params, group, world, COMM_DTYPES[comm]

    def reduce(self, cold_scale: float) -> None:
        """Each weight's gradient: its hot rows summed over the ranks and divided by the world size,
        its cold rows divided by ``cold_scale`` (``ShardedTables.reduce``). Every rank calls it."""
        if not self.params:
            return
        parts = [_dense_hot(p, hot) for p, hot in self.params]
        flat = torch.cat([x.reshape(-1) for x in parts]).to(self.dtype)
        with comm_region(WORLD):
            dist.all_reduce(flat, group=self.group)
        sums = flat.float().split([x.numel() for x in parts])
        for (p, hot), total in zip(self.params, sums):
            p.grad = _joined(p, hot, total.view(hot, -1) / self.world, cold_scale)


def _dense_hot(p: Tensor, hot: int) -> Tensor:
    """``[hot, dim]`` fp32: this rank's gradient of the hot rows (zeros where it has none)."""
    out = torch.zeros((hot, p.shape[1]), dtype=torch.float32, device=p.device)
    if p.grad is not None:
        rows, values = touched_rows(p.grad)
        keep = rows < hot
        out.index_add_(0, rows[keep], values[keep])
    return out


def _joined(p: Tensor, hot: int, hot_grad: Tensor, cold_scale: float) -> Tensor:
    """The sparse gradient of ``p``: the hot rows with a nonzero averaged gradient, and this rank's
    cold rows over ``cold_scale``."""
    rows = torch.nonzero(hot_grad.abs().sum(dim=1) > 0).squeeze(1)
    values = hot_grad[rows]
    if p.grad is not None:
        cold_rows, cold = touched_rows(p.grad)
        keep = cold_rows >= hot
        rows, values = torch.cat([rows, cold_rows[keep]]), torch.cat([values, cold[keep] / cold_scale])
    return torch.sparse_coo_tensor(rows[None], values.to(p.dtype), p.shape, check_invariants=False)
