"""The mixture of experts of the non-sequence stack: top-k routing, experts run on their tokens only.

On CUDA in bf16 all experts run in two grouped matmuls over the assignments sorted by expert (no
host sync); elsewhere one expert at a time. The expert-parallel dispatch of the next issue
(``executor.parallelize``) wraps this module's experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scenarios.schema import MoE as MoEConfig


class MoE(nn.Module):
    """Top-k routed experts ``Linear(d→He) → GELU → Linear(He→d)``, each run on its tokens only."""

    def __init__(self, d: int, cfg: MoEConfig):
        super().__init__()
        self.top_k = cfg.top_k
        self.grouped: bool | None = None  # None: grouped matmuls on CUDA, a loop over experts elsewhere
        self.router = nn.Linear(d, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, cfg.expert_hidden), nn.GELU(), nn.Linear(cfg.expert_hidden, d))
            for _ in range(cfg.num_experts)
        )

    def route(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(gates [T, k], experts [T, k], probs [T, E])``: softmax, top-k, gates renormalised."""
        logits = self.router(h)
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        gates, experts = probs.topk(self.top_k, dim=-1)
        return gates / gates.sum(-1, keepdim=True), experts, probs

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``h [T, d]`` → ``(Σ_k gate · expert(h), aux)``; aux = Switch ``E · Σ_e f_e · P_e``."""
        gates, experts, probs = self.route(h)
        E, T = len(self.experts), h.shape[0]
        flat_e, flat_g = experts.reshape(-1), gates.reshape(-1)
        dtype = torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else h.dtype
        grouped = self.grouped
        if grouped is None:  # cuBLAS grouped GEMM takes bf16 on Hopper
            grouped = h.is_cuda and dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
        out = self._grouped(h, flat_e, flat_g, dtype) if grouped else self._looped(h, flat_e, flat_g, probs.dtype)
        f = _counts(flat_e, E).to(probs.dtype) / max(T * self.top_k, 1)  # share of assignments
        aux = E * (f * probs.mean(0)).sum()
        return out.to(probs.dtype), aux

    def _looped(self, h: Tensor, flat_e: Tensor, flat_g: Tensor, dtype: torch.dtype) -> Tensor:
        """One expert at a time on its tokens (``nonzero``: a host sync per expert)."""
        token = torch.arange(h.shape[0], device=h.device).repeat_interleave(self.top_k)
        out = h.new_zeros(h.shape, dtype=dtype)
        for e, expert in enumerate(self.experts):
            sel = torch.nonzero(flat_e == e).squeeze(1)
            if len(sel):
                rows = token.index_select(0, sel)
                y = expert(h.index_select(0, rows)).to(out.dtype) * flat_g.index_select(0, sel)[:, None]
                out = out.index_add(0, rows, y)
        return out

    def _grouped(self, h: Tensor, flat_e: Tensor, flat_g: Tensor, dtype: torch.dtype) -> Tensor:
        """All experts in two grouped matmuls (``torch._grouped_mm``) over the assignments sorted
        by expert: no host sync, one launch per matmul instead of one per expert."""
        order = torch.argsort(flat_e, stable=True)
        inv = torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=order.device))
        e_of = flat_e.index_select(0, order)
        offs = torch.cumsum(_counts(flat_e, len(self.experts)), 0).to(torch.int32)
        first, second = zip(*((ex[0], ex[2]) for ex in self.experts))
        w1 = torch.stack([lin.weight for lin in first]).to(dtype)  # [E, He, d]
        w2 = torch.stack([lin.weight for lin in second]).to(dtype)  # [E, d, He]
        b1 = torch.stack([lin.bias for lin in first]).to(dtype)
        b2 = torch.stack([lin.bias for lin in second]).to(dtype)
        # each token's k copies, in expert order; gathers both ways (no index_add: atomics)
        T, d = h.shape
        x = _Permute.apply(h.to(dtype).unsqueeze(1).expand(T, self.top_k, d).reshape(-1, d), order, inv)
        # biases as one-hot matmuls: their backward is a matmul, not an index_add of every
        # assignment into E rows (atomics on a handful of addresses)
        onehot = (e_of[:, None] == torch.arange(len(self.experts), device=h.device)).to(dtype)  # [T·k, E]
        z = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs) + onehot @ b1
        y = torch._grouped_mm(F.gelu(z), w2.transpose(-2, -1), offs=offs) + onehot @ b2
        y = y.float() * _Permute.apply(flat_g, order, inv)[:, None].float()
        return _Permute.apply(y, inv, order).view(T, self.top_k, d).sum(1)  # back in token order, k summed


def _counts(ids: Tensor, n: int) -> Tensor:
    """``bincount(ids, minlength=n)`` for ids in ``[0, n)`` as a one-hot sum: no host sync
    (``bincount`` reads the max id to size its output) and no ``index_add`` (compiled, a sort-based
    deterministic index_put: 0.26 ms per MoE layer on the H200, s5-graphs.top.txt)."""
    return (ids.unsqueeze(1) == torch.arange(n, device=ids.device)).sum(0)


class _Permute(torch.autograd.Function):
    """``x.index_select(0, perm)`` whose backward gathers by the inverse permutation ``inv``
    instead of ``index_add`` (atomics) — rows move, nothing accumulates."""

    @staticmethod
    def forward(ctx, x: Tensor, perm: Tensor, inv: Tensor) -> Tensor:
        ctx.save_for_backward(inv)
        return x.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (inv,) = ctx.saved_tensors
        return grad.index_select(0, inv), None, None
