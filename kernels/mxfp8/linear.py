"""``MXFP8Linear``: a drop-in ``nn.Linear`` whose three matmuls run in MXFP8, with a bf16 guard.

For ``y = x Wᵀ + b`` (``x [M, K]``, ``W [N, K]``), each matmul quantizes its two operands along
its own contraction dim, so activations and weights are quantized in both orientations:

- forward ``y = x · Wᵀ``:       ``x`` along K (dim 1), ``W`` along K (dim 1)      → ``mx_mm``
- dgrad  ``dx = dy · W``:       ``dy`` along N (dim 1), ``W`` along N (dim 0)     → ``mx_mm``
- wgrad  ``dW = dyᵀ · x``:      ``dy`` along M (dim 0), ``x`` along M (dim 0)     → ``mx_mm``

Elements E4M3; gradients E4M3 by default, E5M2 with ``grad_elem="e5m2"``. The bias and its
gradient stay in high precision. Output dtype: bf16 under autocast, else ``x``'s dtype.
On CUDA the quantization is the Triton kernel and the matmul ``gemm.mx_mm`` (the fp8
emulation on Hopper, native block-scaled MMA on Blackwell); on CPU both are the PyTorch
reference (dequantize + fp32 matmul), the emulation the parity runs on CPU use.

Guard: during its first ``guard_calls`` training forwards a layer also computes the bf16
product ``bf16(x) · bf16(W)ᵀ`` and the relative error ``‖y_mx − y_bf16‖ / ‖y_bf16‖``; if the
error exceeds ``threshold`` the layer falls back to bf16 for good and logs one line
(``MXFP8Linear.report()`` lists every decision). MXFP8 E4M3 gives ~3% on well-scaled data
(2^-4 relative rounding per operand, averaged over the dot product); the default threshold
0.1 catches layers whose blocks mix magnitudes so much that small elements flush to zero.
The guard counts eager forwards only (it reads the error on the host): under ``torch.compile``
it is skipped, and ``executor.train`` runs a compiled model eagerly while ``guard_pending``.
"""

from __future__ import annotations

import contextlib
import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels.mxfp8.gemm import mx_mm

log = logging.getLogger("mxfp8")


def _range(name: str):
    """A profiler range the RunRecord's op classes (``executor.profiling``) file the kernels
    launched inside as ``quantize`` / ``gemm`` (eager raw Triton launches have no aten op above
    them). Under ``torch.compile`` dynamo drops such ranges (with a warning), so none is opened
    there; the kernels' own names classify them."""
    return contextlib.nullcontext() if torch.compiler.is_compiling() else torch.profiler.record_function(name)


def _quantize(x: Tensor, dim: int, elem: str):
    with _range("mxfp8.quantize"):
        if x.is_cuda:
            from kernels.mxfp8.quantize import quantize

            return quantize(x, dim, elem)
        from kernels.mxfp8.reference import quantize_ref

        return quantize_ref(x, dim, elem)


def _mm(xq, wq, out_dtype):
    with _range("mxfp8.gemm"):
        return mx_mm(*xq, *wq, out_dtype)


class _MXFP8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, out_dtype: torch.dtype, grad_elem: str):
        M, K = x.shape
        y = _mm(_quantize(x, 1, "e4m3"), _quantize(weight, 1, "e4m3"), torch.float32)
        if bias is not None:
            y = y + bias.float()
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.grad_elem, ctx.x_dtype, ctx.w_dtype = bias is not None, grad_elem, x.dtype, weight.dtype
        return y.to(out_dtype)

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, weight = ctx.saved_tensors
        M, K = x.shape
        N = weight.shape[0]
        ge = ctx.grad_elem
        dx = dw = db = None
        if ctx.needs_input_grad[0]:  # dx [M, K] = dy [M, N] · W [N, K]: contraction over N
            dx = _mm(_quantize(dy, 1, ge), _quantize(weight, 0, "e4m3"), torch.float32).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:  # dW [N, K] = dyᵀ [N, M] · x [M, K]: contraction over M
            dw = _mm(_quantize(dy, 0, ge), _quantize(x, 0, "e4m3"), torch.float32).to(ctx.w_dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.float().sum(0)
        return dx, dw, db, None, None


class MXFP8Linear(nn.Linear):
    """``nn.Linear`` computing its forward, dgrad and wgrad matmuls in MXFP8 (module docstring)."""

    decisions: list[str] = []  # every guard decision of the process, in order (for the report)
    label = "mxfp8"  # the format, in guard lines and repr
    _fn = None  # the autograd Function of the three matmuls (set below; kernels.fp8block.linear has its own)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, grad_elem: str = "e4m3",
                 threshold: float = 0.1, guard_calls: int = 2, name: str = "", device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.grad_elem, self.threshold, self.guard_calls, self.name = grad_elem, threshold, guard_calls, name
        self.fallback = False
        self.calls = 0
        self.max_rel_err = 0.0

    @classmethod
    def from_linear(cls, lin: nn.Linear, **kw) -> MXFP8Linear:
        new = cls(lin.in_features, lin.out_features, lin.bias is not None, device=lin.weight.device,
                  dtype=lin.weight.dtype, **kw)
        new.weight, new.bias = lin.weight, lin.bias  # the same Parameters (optimizers, init unchanged)
        return new

    def forward(self, x: Tensor) -> Tensor:
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        if self.fallback or x.numel() == 0:
            return self._bf16(x, out_dtype)
        lead = x.shape[:-1]
        with torch.autocast(dev, enabled=False):
            y = self._fn.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias, out_dtype, self.grad_elem)
        y = y.reshape(*lead, self.out_features)
        # the guard syncs with the host: it runs on eager calls only (torch.compile would break the
        # graph there and recompile for every error value); a compiled model runs its first
        # steps eagerly until no guard is pending (``guard_pending``, ``executor.train``)
        if not torch.compiler.is_compiling() and self.training and self.calls < self.guard_calls:
            self.calls += 1
            self._guard(x, y)
        return y

    def pending(self) -> bool:
        """Whether an eager training forward is still owed to the guard."""
        return self.training and not self.fallback and self.calls < self.guard_calls

    def _bf16(self, x: Tensor, out_dtype) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            b = None if self.bias is None else self.bias.to(torch.bfloat16)
            return F.linear(x.to(torch.bfloat16), self.weight.to(torch.bfloat16), b).to(out_dtype)

    @torch.no_grad()
    def _guard(self, x: Tensor, y: Tensor) -> None:
        ref = self._bf16(x.detach(), torch.float32)
        err = float((y.detach().float() - ref).norm() / ref.norm().clamp_min(1e-30))
        self.max_rel_err = max(self.max_rel_err, err)
        if not err <= self.threshold:  # NaN too
            self.fallback = True
            msg = (f"{self.label} guard: {self.name or 'linear'} [{self.in_features}->{self.out_features}] relative error "
                   f"{err:.3g} > {self.threshold:g}: falls back to bf16")
            log.warning(msg)
            MXFP8Linear.decisions.append(msg)
        elif self.calls == self.guard_calls:
            MXFP8Linear.decisions.append(f"{self.label} guard: {self.name or 'linear'} [{self.in_features}->"
                                         f"{self.out_features}] max relative error {self.max_rel_err:.3g}: "
                                         f"stays {self.label}")

    def extra_repr(self) -> str:
        return super().extra_repr() + f", {self.label}={'off (fallback)' if self.fallback else 'on'}"


MXFP8Linear._fn = _MXFP8LinearFn


def guard_pending(module: nn.Module) -> bool:
    """Whether an ``MXFP8Linear`` under ``module`` (training, not fallen back) has guard calls left
    (or, a blockwise-fp8 one, its ``auto`` decision: ``pending``)."""
    return any(isinstance(m, MXFP8Linear) and m.pending() for m in module.modules())


def convert(module: nn.Module, *, skip=lambda name, lin: False, **kw) -> list[str]:
    """Replace every ``nn.Linear`` under ``module`` (not ``skip(name, lin)``) by an ``MXFP8Linear``
    sharing its parameters; returns the converted names."""
    done = []
    for parent_name, parent in list(module.named_modules()):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if type(child) is nn.Linear and not skip(name, child):
                setattr(parent, child_name, MXFP8Linear.from_linear(child, name=name, **kw))
                done.append(name)
    return done


def report(module: nn.Module) -> dict[str, dict]:
    """Per MXFP8Linear of ``module``: guard calls, max relative error, fallback."""
    return {m.name: {"calls": m.calls, "max_rel_err": m.max_rel_err, "fallback": m.fallback}
            for m in module.modules() if isinstance(m, MXFP8Linear)}


__all__ = ["MXFP8Linear", "convert", "report"]
