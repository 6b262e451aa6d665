"""Row-wise Adagrad for embedding tables (the FBGEMM/TorchRec ``rowwise_adagrad`` update).

Per table row ``r`` one accumulator ``s_r`` (fp32): for each row touched by the gradient,
``s_r += mean_j(g_rj²)`` and ``w_r -= lr · g_r / (sqrt(s_r) + eps)``. Untouched rows do not
change. Works with sparse (``sparse=True`` embeddings) and dense gradients; the update is done
in fp32 and written back in the table's dtype.
"""

from __future__ import annotations

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


def clip_grad_norm(params: list[Tensor], max_norm: float) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` over parameters that may mix FSDP2's sharded DTensors
    with plain (replicated) tensors, which no single foreach kernel takes: the 2-norm of each
    kind (a DTensor's summed over its shards), combined, then each kind scaled by the one clip
    factor. With plain tensors only it is exactly ``clip_grad_norm_``."""
    from torch.distributed.tensor import DTensor

    kinds: dict[bool, list[Tensor]] = {}
    for p in params:
        if p.grad is not None:
            kinds.setdefault(isinstance(p, DTensor), []).append(p)
    norms = []
    for sharded, ps in kinds.items():
        norm = torch.nn.utils.get_total_norm([p.grad for p in ps])
        norms.append(norm.full_tensor() if sharded else norm)
    if not norms:
        return torch.zeros(())
    total = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
    for ps in kinds.values():
        torch.nn.utils.clip_grads_with_norm_(ps, max_norm, total)
    return total
