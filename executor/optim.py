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

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group["lr"], group["eps"])

    def _update(self, p: Tensor, lr: float, eps: float) -> None:
        state = self.state[p]
        if "sum" not in state:
            state["sum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
        rows, grad = touched_rows(p.grad)
        acc = state["sum"].index_add_(0, rows, grad.square().mean(dim=1))[rows]
        p.index_add_(0, rows, (-lr * grad / (acc.sqrt() + eps)[:, None]).to(p.dtype))


def touched_rows(grad: Tensor) -> tuple[Tensor, Tensor]:
    """``(unique rows, their fp32 gradient rows)`` of a sparse or dense table gradient."""
    if grad.is_sparse:
        grad = grad.coalesce()
        return grad.indices()[0], grad.values().float()
    rows = torch.nonzero(grad.abs().sum(dim=1) > 0).squeeze(1)
    return rows, grad[rows].float()
