"""The sequence FFN ``ffn2(gelu(ffn1(x)))`` with its GELU in cuBLASLt GEMM epilogues (issue 25).

``gelu_ffn(x, w1, b1, w2, b2)``: on a CUDA GPU, three of the FFN's matmuls carry the GELU's work:
- forward, ffn1 with ``CUBLASLT_EPILOGUE_GELU_AUX_BIAS``: one GEMM writes ``a = gelu(x w1ᵀ + b1)``
  and the GELU's input ``h`` (the "aux" output, saved for the backward);
- backward, ffn2's dgrad with ``CUBLASLT_EPILOGUE_DGELU``: one GEMM writes ``dh = (dy w2) ⊙ gelu'(h)``;
- backward, ffn1's weight gradient ``dhᵀ x`` with ``CUBLASLT_EPILOGUE_BGRADB``: its contraction runs
  over the tokens, and the same GEMM sums ``db1 = Σ_rows dh`` (``dbias``: or in the dGELU's epilogue,
  ``DGELU_BGRAD``, or by torch after it).
Against the Triton path (``kernels.ffn.bias_gelu``: a GEMM, then a pass that reads ``h`` and writes
``a``; in the backward a GEMM, then a pass that reads ``dA`` and ``h`` and writes ``dh``) each
direction saves a pass over ``[tokens, hidden]`` in bf16, and the bias gradient's reduction.

cuBLASLt's GELU is the **tanh approximation** (``F.gelu(approximate="tanh")``), not the exact GELU
of ``kernels.ffn.bias_gelu``: a model that takes this path computes a different function (within
~1e-3 of exact GELU), which is a model choice, not an execution detail. The C++ source is
``gelu_epilogue.cpp``, built on first use where CUDA and cuBLASLt exist
(``torch.utils.cpp_extension``); elsewhere (CPU) ``gelu_ffn`` runs the same math in torch ops, the
reference the GPU path is checked against. ``python -m kernels.ffn.bench_epilogue`` times it
against the Triton path and checks it, on one GPU.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

SOURCE = Path(__file__).with_name("gelu_epilogue.cpp")


@functools.cache
def _lib():
    """The built extension (once per process; torch caches the build under its extensions dir)."""
    from torch.utils.cpp_extension import load

    return load(name="gemtwin_gelu_epilogue", sources=[str(SOURCE)], extra_cflags=["-O2"],
                extra_ldflags=["-lcublasLt"], with_cuda=True)


def native(t: Tensor) -> bool:
    """Whether the cuBLASLt path runs for ``t``: a bf16 tensor on a CUDA GPU."""
    return t.is_cuda and t.dtype == torch.bfloat16


def linear_gelu_aux_ref(x: Tensor, w: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``(gelu_tanh(h), h)`` with ``h = x wᵀ + b``, in fp32, returned in ``x``'s dtype."""
    h = x.float() @ w.float().t() + b.float()
    return F.gelu(h, approximate="tanh").to(x.dtype), h.to(x.dtype)


def gelu_tanh_grad(h: Tensor) -> Tensor:
    """``d/dh gelu_tanh(h)``, torch's own formula (``aten.gelu_backward``: autograd is off inside
    a custom op, so the references call it directly)."""
    return torch.ops.aten.gelu_backward(torch.ones_like(h), h, approximate="tanh")


def linear_dgelu_bgrad_ref(dy: Tensor, w2: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
    """``(dh, db)``: ``dh = (dy w2) ⊙ gelu_tanh'(h)``, ``db = Σ_rows dh``, in fp32, returned in ``dy``'s dtype."""
    dh = torch.ops.aten.gelu_backward(dy.float() @ w2.float(), h.float(), approximate="tanh")
    return dh.to(dy.dtype), dh.sum(0).to(dy.dtype)


def linear_gelu_aux(x: Tensor, w: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    if native(x):
        return _lib().linear_gelu_aux(x.contiguous(), w.contiguous(), b.to(x.dtype).contiguous())
    return linear_gelu_aux_ref(x, w, b)


def linear_dgelu_bgrad(dy: Tensor, w2: Tensor, h: Tensor, *, bgrad: bool = True) -> tuple[Tensor, Tensor | None]:
    """``(dh, db)``; ``bgrad=False``: the epilogue computes ``dh`` alone (``DGELU``), ``db`` None."""
    if native(dy):
        return _lib().linear_dgelu_bgrad(dy.contiguous(), w2.contiguous(), h.contiguous(), bgrad)
    dh, db = linear_dgelu_bgrad_ref(dy, w2, h)
    return dh, db if bgrad else None


def linear_wgrad_bgrad_ref(dh: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(dW, db) = (dhᵀ x, Σ_rows dh)`` in fp32, returned in ``dh``'s dtype."""
    return (dh.float().t() @ x.float()).to(dh.dtype), dh.float().sum(0).to(dh.dtype)


def linear_wgrad_bgrad(dh: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(dW, db)``: the weight gradient, and the bias gradient in its epilogue (``BGRADB``)."""
    if native(dh):
        return _lib().linear_wgrad_bgrad(dh.contiguous(), x.contiguous())
    return linear_wgrad_bgrad_ref(dh, x)


DBIAS = ("wgrad", "dgelu", "sum")  # where ffn1's bias gradient is summed (gelu_ffn)


def _backward_math(dy: Tensor, x: Tensor, w1: Tensor, w2: Tensor, a: Tensor, h: Tensor, dbias: str):
    """``(dx, dw1, db1, dw2, db2)`` of ``ffn2(gelu_tanh(ffn1(x)))`` from what the forward kept."""
    dy = dy.contiguous()
    dh, db1 = linear_dgelu_bgrad(dy, w2, h, bgrad=dbias == "dgelu")
    if dbias == "wgrad":
        dw1, db1 = linear_wgrad_bgrad(dh, x)
    else:
        dw1 = dh.t() @ x
        db1 = db1 if dbias == "dgelu" else dh.sum(0)
    return dh @ w1, dw1, db1, dy.t() @ a, dy.sum(0)


# ---- the custom ops: torch.compile traces each as one node (the extension is opaque to it) --------
@torch.library.custom_op("gemtwin::gelu_ffn", mutates_args=())
def _gelu_ffn_op(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Optional[Tensor],
                 dbias: str) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, a, h)``: the FFN's output, and the GELU's output and input (kept for the backward)."""
    a, h = linear_gelu_aux(x, w1, b1)
    return F.linear(a, w2, b2), a, h


@_gelu_ffn_op.register_fake
def _(x, w1, b1, w2, b2, dbias):
    T, H = x.shape[0], w1.shape[0]
    return x.new_empty(T, w2.shape[0]), x.new_empty(T, H), x.new_empty(T, H)


@torch.library.custom_op("gemtwin::gelu_ffn_bwd", mutates_args=())
def _gelu_ffn_bwd_op(dy: Tensor, x: Tensor, w1: Tensor, w2: Tensor, a: Tensor, h: Tensor,
                     dbias: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(dx, dw1, db1, dw2, db2)`` (``_backward_math``)."""
    return _backward_math(dy, x, w1, w2, a, h, dbias)


@_gelu_ffn_bwd_op.register_fake
def _(dy, x, w1, w2, a, h, dbias):
    return (x.new_empty(x.shape), w1.new_empty(w1.shape), dy.new_empty(w1.shape[0]), w2.new_empty(w2.shape),
            dy.new_empty(dy.shape[1]))


def _setup_context(ctx, inputs, output):
    x, w1, b1, w2, b2, dbias = inputs
    _, a, h = output
    ctx.save_for_backward(x, w1, w2, a, h)
    ctx.dbias, ctx.has_b2, ctx.b1_dtype = dbias, b2 is not None, b1.dtype
    # ``a`` and ``h`` are outputs only to be saved: no loss reads them, and a materialized gradient
    # would be two ``[T, H]`` zero fills a step (0.49 ms at gem-h200-1gpu's shape on an H100).
    ctx.set_materialize_grads(False)


def _backward(ctx, dy, _da, _dh):
    x, w1, w2, a, h = ctx.saved_tensors
    dx, dw1, db1, dw2, db2 = _gelu_ffn_bwd_op(dy, x, w1, w2, a, h, ctx.dbias)
    return dx, dw1, db1.to(ctx.b1_dtype), dw2, db2 if ctx.has_b2 else None, None


_gelu_ffn_op.register_autograd(_backward, setup_context=_setup_context)


def gelu_ffn(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor | None = None, *,
             dbias: str = "sum") -> Tensor:
    """``ffn2(gelu_tanh(ffn1(x)))`` for ``x [T, d]``, ``w1 [H, d]``, ``b1 [H]``, ``w2 [d, H]``,
    ``b2 [d]`` (module docstring), with autograd. ``H`` a multiple of 8 (cuBLASLt's aux rows).
    ``dbias``: where ffn1's bias gradient is summed: ``sum`` (the default), by torch after the
    dGELU; ``wgrad``, in the epilogue of its weight gradient (``BGRADB``: on an H100 a separate
    generic kernel, no faster than the sum); ``dgelu``, in the dGELU's (``DGELU_BGRAD``: on an H100
    a generic epilogue kernel, 0.7-0.8× the Triton path). ``kernels/ffn/NOTES.md`` has the figures."""
    if dbias not in DBIAS:
        raise ValueError(f"gelu_ffn: dbias '{dbias}' is unknown; use one of: {', '.join(DBIAS)}")
    if w1.shape[0] % 8:
        raise ValueError(f"gelu_ffn: hidden size {w1.shape[0]} must be a multiple of 8 (cuBLASLt's GELU aux)")
    return _gelu_ffn_op(x, w1, b1, w2, b2, dbias)[0]


def gelu_ffn_linear(x: Tensor, ffn1: torch.nn.Linear, ffn2: torch.nn.Linear, *, dbias: str = "sum") -> Tensor:
    """``ffn2(gelu_tanh(ffn1(x)))`` of two ``nn.Linear`` (``gelu_ffn``), as autocast would run them:
    under autocast every operand in its dtype (fp32 parameters cast, their gradients cast back)."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        cast = lambda t: None if t is None else t.to(dt)  # noqa: E731
        with torch.autocast(dev, enabled=False):
            return gelu_ffn(cast(x), cast(ffn1.weight), cast(ffn1.bias), cast(ffn2.weight), cast(ffn2.bias),
                            dbias=dbias)
    return gelu_ffn(x, ffn1.weight, ffn1.bias, ffn2.weight, ffn2.bias, dbias=dbias)


__all__ = ["DBIAS", "gelu_ffn", "gelu_ffn_linear", "gelu_tanh_grad", "linear_dgelu_bgrad", "linear_dgelu_bgrad_ref",
           "linear_gelu_aux", "linear_gelu_aux_ref", "linear_wgrad_bgrad", "linear_wgrad_bgrad_ref", "native"]
