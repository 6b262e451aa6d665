"""Row-wise Adagrad for embedding tables (the FBGEMM/TorchRec ``rowwise_adagrad`` update).

Per table row ``r`` one accumulator ``s_r`` (fp32): for each row touched by the gradient,
``s_r += mean_j(g_rj²)`` and ``w_r -= lr · g_r / (sqrt(s_r) + eps)``. Untouched rows do not
change. Works with sparse (``sparse=True`` embeddings) and dense gradients; the update is done
in fp32 and written back in the table's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


class RowWiseAdagrad(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 0.05, eps: float = 1e-8):
        if lr <= 0:
            raise ValueError(f"sparse lr ({lr}) must be positive")
        super().__init__(params, dict(lr=lr, eps=eps))
        # id(param) -> fn(fp32 gradient rows [k, cols]) -> mean of g² over each row's whole width:
        # for a table whose columns are split over ranks (executor.sharded_tables), which sums the
        # squares over the ranks holding the row's other columns (a collective: the step then
        # calls it on every such parameter, with a gradient or not)
        self.row_mean_sq: dict[int, object] = {}

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None or id(p) in self.row_mean_sq:
                    self._update(p, group["lr"], group["eps"])

    def _update(self, p: Tensor, lr: float, eps: float) -> None:
        state = self.state[p]
        if "sum" not in state:
            state["sum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
        if p.grad is None:  # a column shard no id touched this step: still joins its peers' sums
            rows, grad = torch.zeros(0, dtype=torch.int64, device=p.device), p.new_zeros((0, p.shape[1])).float()
        else:
            rows, grad = touched_rows(p.grad)
        mean_sq = self.row_mean_sq[id(p)](grad) if id(p) in self.row_mean_sq else grad.square().mean(dim=1)
        acc = state["sum"].index_add_(0, rows, mean_sq)[rows]
        p.index_add_(0, rows, (-lr * grad / (acc.sqrt() + eps)[:, None]).to(p.dtype))


def touched_rows(grad: Tensor) -> tuple[Tensor, Tensor]:
    """``(unique rows, their fp32 gradient rows)`` of a sparse or dense table gradient."""
    if grad.is_sparse:
        grad = grad.coalesce()
        return grad.indices()[0], grad.values().float()
    rows = torch.nonzero(grad.abs().sum(dim=1) > 0).squeeze(1)
    return rows, grad[rows].float()


def clip_grad_norm(params: list[Tensor], max_norm: float, *, disjoint: DisjointParams | None = None) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` of the global model, over parameters that may mix FSDP2's
    sharded DTensors (on one mesh or several: dense parameters over the dense mesh, experts over
    ``expert_replicate``) with plain tensors, which no single foreach kernel takes: the 2-norm of
    each kind (a DTensor's summed over its mesh's shards), combined, then each kind scaled by the
    one clip factor. ``disjoint``: parameters that each rank of a group holds different ones of
    (expert parallelism's experts), whose squared norm is summed over that group as well. With
    plain tensors only it is exactly ``clip_grad_norm_``."""
    from torch.distributed.tensor import DTensor

    spread = {id(p) for p in disjoint.params} if disjoint is not None else set()
    kinds: dict[tuple, list[Tensor]] = {}
    for p in params:
        if p.grad is not None:
            sharded = isinstance(p, DTensor)
            kinds.setdefault((sharded, p.device_mesh if sharded else None, id(p) in spread), []).append(p)
    norms = []
    for (sharded, _, spread_out), ps in kinds.items():
        norm = torch.nn.utils.get_total_norm([p.grad for p in ps])
        norm = norm.full_tensor() if sharded else norm
        if spread_out:
            norm = disjoint.norm(norm)
        norms.append(norm)
    if not norms:
        return torch.zeros(())
    total = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
    for ps in kinds.values():
        torch.nn.utils.clip_grads_with_norm_(ps, max_norm, total)
    return total


@dataclass
class DisjointParams:
    """Parameters of which each rank of ``group`` holds different ones (expert parallelism: each
    rank of the ``expert`` axis its own experts): the model's norm sums theirs over ``group``."""

    params: list[Tensor]
    group: object  # a torch.distributed ProcessGroup

    def norm(self, local: Tensor) -> Tensor:
        """The 2-norm over the group from this rank's ``local`` one (one all-reduce of its square)."""
        import torch.distributed as dist

        sq = local.double().square()
        dist.all_reduce(sq, group=self.group)
        return sq.sqrt().to(local.dtype)
