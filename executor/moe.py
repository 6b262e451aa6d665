"""The mixture of experts of the non-sequence stack: top-k routing, experts run on their tokens only.

The experts are one module, ``GroupedExperts``: each weight stacked over the experts
(``w1 [E, He, d]``, ``b1 [E, He]``, ``w2 [E, d, He]``, ``b2 [E, d]``), so that all experts run
in two (grouped) matmuls, and so that expert parallelism can keep a slice of them on each rank
and FSDP2 can shard that slice as one unit (``executor.expert_parallel``).

Two ways to route, chosen by ``MoE.capacity_factor``:

- **dropless** (None, a one-process run's default): the assignments sorted by expert, every one
  computed. On CUDA in bf16 two ``torch._grouped_mm`` over the sorted rows (no host sync);
  elsewhere one expert at a time (one host sync for the group sizes).
- **capacity** (a float: what expert parallelism runs, and what a one-process reference of it
  sets): each expert takes at most ``C = ceil(capacity_factor · T·k / E)`` of a micro-batch's
  ``T·k`` assignments, the first ones in token order; the rest are **dropped** (they add nothing
  to the token's output: the residual carries it). The kept rows sit in a ``[E, C, d]`` buffer,
  so every shape is static: no host sync, and the dispatch to the experts' ranks is one
  all-to-all of equal splits (``[EP, E/EP, C, d]``), with no exchange of counts. A rank with
  ``group`` set holds experts ``[pos·E/EP, (pos+1)·E/EP)`` of its position ``pos`` in the group.

The load-balancing loss is the router's, from every assignment (dropped or not), on each rank's
own tokens. ``MoE.assignments`` counts ``[routed, dropped]`` assignments of the training forwards
on the device (no host sync); ``assignment_counts`` reads them once, at the end of a run.
"""

from __future__ import annotations

from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scenarios.schema import MoE as MoEConfig


class GroupedExperts(nn.Module):
    """``E`` experts ``Linear(d→He) → GELU → Linear(He→d)`` with their weights stacked.

    The initial values are exactly those of ``E`` pairs of ``nn.Linear`` made one after the other
    (the per-expert modules this replaced), so a seeded model starts where it always did."""

    def __init__(self, d: int, hidden: int, num_experts: int):
        super().__init__()
        pairs = [(nn.Linear(d, hidden), nn.Linear(hidden, d)) for _ in range(num_experts)]
        self.w1 = nn.Parameter(torch.stack([up.weight.detach() for up, _ in pairs]))  # [E, He, d]
        self.b1 = nn.Parameter(torch.stack([up.bias.detach() for up, _ in pairs]))  # [E, He]
        self.w2 = nn.Parameter(torch.stack([down.weight.detach() for _, down in pairs]))  # [E, d, He]
        self.b2 = nn.Parameter(torch.stack([down.bias.detach() for _, down in pairs]))  # [E, d]

    def keep(self, first: int, count: int) -> None:
        """Keep experts ``[first, first + count)`` only (expert parallelism, before FSDP2 wraps this)."""
        for name in ("w1", "b1", "w2", "b2"):
            setattr(self, name, nn.Parameter(getattr(self, name).detach()[first : first + count].clone()))

    def forward(self, x: Tensor, counts: Tensor | None = None, *, dtype: torch.dtype | None = None,
                grouped: bool = False) -> Tensor:  # fmt: skip
        """Every expert on its rows, in ``dtype`` (default: ``x``'s).

        ``x [E, R, d]``: expert ``e`` on ``x[e]`` (the capacity buffer): groups of one size, so the
        grouped GEMM is a batched one (``baddbmm``, the bias fused), with no offsets to align.
        ``x [N, d]`` with ``counts [E]``: rows grouped by expert, ``counts[e]`` of them for expert
        ``e``; ``grouped``: two ``torch._grouped_mm`` (no host sync), else one expert at a time."""
        dtype = dtype or x.dtype
        w1, b1, w2, b2 = (p.to(dtype) for p in (self.w1, self.b1, self.w2, self.b2))
        x = x.to(dtype)
        if x.dim() == 3:
            z = torch.baddbmm(b1[:, None], x, w1.transpose(1, 2))
            return torch.baddbmm(b2[:, None], F.gelu(z), w2.transpose(1, 2))
        if grouped:
            offs = torch.cumsum(counts, 0).to(torch.int32)
            # biases as one-hot matmuls: their backward is a matmul, not an index_add of every row
            # into E rows (atomics on a handful of addresses)
            expert_of = torch.searchsorted(offs, torch.arange(len(x), device=x.device, dtype=torch.int32), right=True)
            onehot = (expert_of[:, None] == torch.arange(len(counts), device=x.device)).to(dtype)  # [N, E]
            z = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs) + onehot @ b1
            return torch._grouped_mm(F.gelu(z), w2.transpose(-2, -1), offs=offs) + onehot @ b2
        parts = x.split(counts.tolist())  # the one host sync of this path
        ups, downs = zip(w1.unbind(), b1.unbind()), zip(w2.unbind(), b2.unbind())
        return torch.cat([F.linear(F.gelu(F.linear(xe, *up)), *down) for xe, up, down in zip(parts, ups, downs)])


class MoE(nn.Module):
    """Top-k routed experts (``GroupedExperts``), each run on its tokens only (or at most ``C`` of
    them, with ``capacity_factor``; see the module docstring)."""

    def __init__(self, d: int, cfg: MoEConfig):
        super().__init__()
        self.top_k, self.num_experts = cfg.top_k, cfg.num_experts
        self.grouped: bool | None = None  # None: grouped matmuls on CUDA, a loop over experts elsewhere
        self.capacity_factor: float | None = None  # None: dropless; set by expert parallelism
        self.group = None  # the expert-parallel process group (None: every expert here)
        self.router = nn.Linear(d, cfg.num_experts, bias=False)
        self.experts = GroupedExperts(d, cfg.expert_hidden, cfg.num_experts)
        # [routed, dropped] assignments of the training forwards: device counters, read at the end
        self.register_buffer("assignments", torch.zeros(2, dtype=torch.int64), persistent=False)

    def route(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(gates [T, k], experts [T, k], probs [T, E])``: softmax, top-k, gates renormalised."""
        logits = self.router(h)
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        gates, experts = probs.topk(self.top_k, dim=-1)
        return gates / gates.sum(-1, keepdim=True), experts, probs

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``h [T, d]`` → ``(Σ_k gate · expert(h), aux)``; aux = Switch ``E · Σ_e f_e · P_e``."""
        gates, experts, probs = self.route(h)
        E, T = self.num_experts, h.shape[0]
        flat_e, flat_g = experts.reshape(-1), gates.reshape(-1)
        dtype = torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else h.dtype
        if self.capacity_factor is None:
            out, dropped = self._dropless(h, flat_e, flat_g, dtype), None
        else:
            out, dropped = self._with_capacity(h, flat_e, flat_g, dtype)
        if self.training:
            with torch.no_grad():
                self.assignments[0] += flat_e.numel()
                if dropped is not None:
                    self.assignments[1] += dropped
        f = _counts(flat_e, E).to(probs.dtype) / max(T * self.top_k, 1)  # share of assignments
        aux = E * (f * probs.mean(0)).sum()
        return out.to(probs.dtype), aux

    def _dropless(self, h: Tensor, flat_e: Tensor, flat_g: Tensor, dtype: torch.dtype) -> Tensor:
        """Every assignment, sorted by expert; gathers both ways (``_Route``: no index_add)."""
        grouped = self.grouped
        if grouped is None:  # cuBLAS grouped GEMM takes bf16 on Hopper
            grouped = h.is_cuda and dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
        order = torch.argsort(flat_e, stable=True)
        inv = torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=order.device))
        x = _Route.apply(_copies(h.to(dtype), self.top_k), order, inv)  # each token's k copies, by expert
        y = self.experts(x, _counts(flat_e, self.num_experts), dtype=dtype, grouped=grouped)
        acc = torch.promote_types(dtype, torch.float32)  # gates applied and k summed in fp32 (or fp64)
        y = y.to(acc) * _Route.apply(flat_g, order, inv)[:, None].to(acc)
        return _Route.apply(y, inv, order).view(h.shape[0], self.top_k, -1).sum(1)  # token order, k summed

    def _with_capacity(self, h: Tensor, flat_e: Tensor, flat_g: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """At most ``C`` assignments per expert (the first in token order) into a ``[E, C, d]``
        buffer; with ``group``, that buffer all-to-all'd to the experts' ranks and back."""
        E, T, d = self.num_experts, h.shape[0], h.shape[1]
        cap = capacity(T * self.top_k, E, self.capacity_factor)
        C = -(-cap // _row_multiple(h)) * _row_multiple(h)  # each expert's rows, padded: zero, no drop
        slot, source, dropped = dispatch_slots(flat_e, E, cap, rows=C)
        buf = _Route.apply(_copies(h.to(dtype), self.top_k), source, slot)  # [E·C, d], empty slots zero
        ep = 1 if self.group is None else self.group.size()
        local = E // ep
        if ep > 1:  # [EP, E/EP, C, d] out, [EP (source), E/EP, C, d] in
            buf = _all_to_all(buf, self.group)
        x = buf.view(ep, local, C, d).transpose(0, 1).reshape(local, ep * C, d)
        y = self.experts(x, dtype=dtype)
        y = y.view(local, ep, C, d).transpose(0, 1).reshape(E * C, d)
        if ep > 1:
            y = _all_to_all(y, self.group)
        acc = torch.promote_types(dtype, torch.float32)
        y = _Route.apply(y, slot, source).to(acc) * flat_g[:, None].to(acc)  # dropped: zero rows
        return y.view(T, self.top_k, d).sum(1), dropped


def capacity(assignments: int, num_experts: int, factor: float) -> int:
    """Assignments one expert takes from one micro-batch: ``ceil(factor · T·k / E)``, at least 1.
    In integers (``factor`` as its exact fraction): under ``torch.compile(dynamic=True)`` ``T`` is
    a symbolic size, which float ``ceil`` cannot lift into the graph."""
    num, den = Fraction(factor).as_integer_ratio()
    return max(-(-(assignments * num) // (num_experts * den)), 1)


def dispatch_slots(flat_e: Tensor, num_experts: int, cap: int, *, rows: int | None = None
                   ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Where each assignment goes in the ``[E·R]`` capacity buffer (``R = rows``, at least the
    capacity ``cap``; default ``cap``), with no host sync.

    ``flat_e [T·k]``: each assignment's expert, in token order. Returns ``slot [T·k]`` (``e·R +
    its place among expert e's assignments``, or ``E·R`` where that place is ``cap`` or more:
    dropped), ``source [E·R]`` (the assignment in each slot, or ``T·k`` for an empty one) and the
    number dropped (a 0-d device tensor)."""
    n, E, R = flat_e.numel(), num_experts, rows or cap
    onehot = (flat_e[:, None] == torch.arange(E, device=flat_e.device)).to(torch.int32)  # [T·k, E]
    place = (onehot.cumsum(0) - 1).gather(1, flat_e[:, None]).squeeze(1)  # 0, 1, ... per expert
    kept = place < cap
    slot = torch.where(kept, flat_e * R + place, E * R)
    source = torch.full((E * R + 1,), n, dtype=torch.int64, device=flat_e.device)
    source = source.scatter(0, slot, torch.arange(n, device=flat_e.device))[: E * R]  # slot E·R: the dropped
    return slot, source, n - kept.sum()


def set_capacity(model: nn.Module, factor: float | None) -> None:
    """Every MoE layer of ``model`` routes with capacity ``factor`` (None: dropless). Expert
    parallelism sets it (``executor.expert_parallel``); a one-process run that sets it drops what
    an expert-parallel run of the same micro-batches drops (its reference)."""
    for m in model.modules():
        if isinstance(m, MoE):
            m.capacity_factor = factor


def assignment_counts(model: nn.Module) -> Tensor:
    """``[routed, dropped]`` assignments, summed over the model's MoE layers (one device tensor)."""
    counts = [m.assignments for m in model.modules() if isinstance(m, MoE)]
    return torch.stack(counts).sum(0) if counts else torch.zeros(2, dtype=torch.int64)


def _row_multiple(h: Tensor) -> int:
    """Rows each expert's slice of the capacity buffer is padded to a multiple of: 8 on CUDA
    (16-byte groups of bf16 rows, as cuBLAS's grouped and tensor-core GEMMs want), 1 elsewhere."""
    return 8 if h.is_cuda else 1


def _copies(h: Tensor, k: int) -> Tensor:
    """Each row of ``h [T, d]`` ``k`` times, consecutively: ``[T·k, d]`` (the assignments' rows)."""
    T, d = h.shape
    return h.unsqueeze(1).expand(T, k, d).reshape(-1, d)


def _all_to_all(x: Tensor, group) -> Tensor:
    """Equal splits of ``x``'s rows to the ranks of ``group``, and back in backward. The traceable
    functional collective (``torch.distributed.nn.functional.all_to_all_single`` refuses to run
    under ``torch.compile``, which the non-sequence layers run in). Eagerly, the forward's runs in
    a ``comm.expert`` range, so the profile files it under the ``expert`` axis
    (``executor.comm_profile``; the backward's, outside any range, counts as ``world``)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    from executor.comm_profile import comm_region

    if torch.compiler.is_compiling():
        return all_to_all_single_autograd(x.contiguous(), None, None, group)
    with comm_region("expert"):
        return all_to_all_single_autograd(x.contiguous(), None, None, group)


def _counts(ids: Tensor, n: int) -> Tensor:
    """``bincount(ids, minlength=n)`` for ids in ``[0, n)`` as a one-hot sum: no host sync
    (``bincount`` reads the max id to size its output) and no ``index_add`` (compiled, a sort-based
    deterministic index_put: 0.26 ms per MoE layer on the H200, s5-graphs.top.txt)."""
    return (ids.unsqueeze(1) == torch.arange(n, device=ids.device)).sum(0)


class _Route(torch.autograd.Function):
    """Rows of ``x [n, …]`` moved to ``out [m, …]``: ``out[i] = x[src[i]]``, a zero row where
    ``src[i] == n``; the backward moves them back by ``dst`` (``grad_x[j] = grad[dst[j]]``, zero
    where ``dst[j] == m``). ``src`` and ``dst`` are inverse (partial) matchings, so rows move and
    nothing accumulates: no ``index_add`` (atomics) either way. A permutation is the case with
    nothing missing; the capacity buffer's dispatch and combine are the partial ones."""

    @staticmethod
    def forward(ctx, x: Tensor, src: Tensor, dst: Tensor) -> Tensor:
        ctx.save_for_backward(dst)
        return _gather(x, src)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (dst,) = ctx.saved_tensors
        return _gather(grad, dst), None, None


def _gather(x: Tensor, idx: Tensor) -> Tensor:
    """``x[idx]`` with a zero row where ``idx == len(x)``."""
    n = x.shape[0]
    out = x.index_select(0, idx.clamp(max=max(n - 1, 0)))
    return out.masked_fill((idx >= n).view(-1, *([1] * (x.dim() - 1))), 0)
