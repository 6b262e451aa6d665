"""The attention family as torch.library ops over the Triton core, with fakes and autograd.

``gemtwin::attention_<kind>_fwd`` (returns ``o, lse``) and ``gemtwin::attention_<kind>_bwd``
(returns the gradients of the inputs), one pair per kind (``jfa``, ``gdpa``, ``block``, ``asym``)
so that the profiler files each kind's kernels under its own name (``executor.profiling``); all
pairs come from one definition, ``_define``. ``torch.compile`` traces them into a graph through
their fakes (no graph break); ``torch.library.opcheck`` keeps op and fake in sync (the tests).

The inputs arrive in one of three layouts, so that fused projections go in and their gradients
come out whole, written by the kernels into views (nothing stacked or split after):

- ``"q,k,v"``: ``a, b, c`` are q, k, v;
- ``"qkv"``: ``a [rows, 3, H, D]``, one fused projection (self attention);
- ``"q,kv"``: ``a`` is q, ``b`` k and v packed as ``[rows, 2, H, D]`` or ``[B, N, 2, H, D]``.

A 4-D q or k/v (``[B, N, H, D]``, a dense side) is flattened to ``[B·N, H, D]`` (a view). The
call's variants arrive as ``flash``, ``FlashOptions.to_ints()``; the work lists are the ones the
query offsets tensor carries (``kernels.flash.work.WorkCache.of``).
The core is imported when an op first runs, so this module imports without it (fakes, meta
tensors and tracing need no core).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.attention.spec import KINDS, FlashOptions

LAYOUTS = ("q,k,v", "qkv", "q,kv")


def views(layout: str, a: Tensor, b: Tensor | None, c: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(q, k, v)`` as ``[T, H, D]`` views of the inputs in ``layout`` (no copy)."""
    if layout == "qkv":
        return a.unbind(1)
    if layout == "q,kv":
        k, v = b.unbind(-3)
        return _rows(a), _rows(k), _rows(v)
    if layout == "q,k,v":
        return _rows(a), _rows(b), _rows(c)
    raise ValueError(f"attention layout '{layout}' is unknown; use one of {', '.join(LAYOUTS)}")


def _rows(t: Tensor) -> Tensor:
    return t.flatten(0, 1) if t.dim() == 4 else t


def lse_like(q: Tensor, weight: str) -> Tensor:
    """The core's log-sum-exp output: ``[H, Tq]`` fp32 for softmax, empty for activations."""
    if weight == "softmax":
        return q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return q.new_empty((0,), dtype=torch.float32)


def _core_kw(q_off, weight, scale, causal, block, flash_ints) -> dict:
    from kernels.flash.work import WorkCache

    flash = FlashOptions.from_ints(flash_ints)
    return dict(weight=weight, scale=scale, causal=causal, block=block, flash=flash, cache=WorkCache.of(q_off),
                poison_outputs=flash.poison)


def _define(kind: str):
    """Register ``gemtwin::attention_{kind}_fwd`` / ``_bwd`` (see the module docstring)."""

    @torch.library.custom_op(f"gemtwin::attention_{kind}_fwd", mutates_args=())
    def fwd(a: Tensor, b: Tensor | None, c: Tensor | None, layout: str, q_off: Tensor, kv_off: Tensor,
            max_q: int, max_kv: int, weight: str, scale: float, causal: bool, block: int, recompute: bool,
            flash: list[int]) -> tuple[Tensor, Tensor]:
        """``(o, lse)`` of ``kernels.flash.core.attention_fwd`` on views of the inputs;
        ``recompute`` tells the backward not to keep ``o`` and ``lse``."""
        from kernels.flash.core import attention_fwd

        q, k, v = views(layout, a, b, c)
        o, lse = attention_fwd(q, k, v, q_off, kv_off, max_q, max_kv,
                               **_core_kw(q_off, weight, scale, causal, block, flash))
        return o.contiguous(), lse

    @fwd.register_fake
    def _(a, b, c, layout, q_off, kv_off, max_q, max_kv, weight, scale, causal, block, recompute, flash):
        q = views(layout, a, b, c)[0]
        return q.new_empty(q.shape), lse_like(q, weight)

    @torch.library.custom_op(f"gemtwin::attention_{kind}_bwd", mutates_args=())
    def bwd(do: Tensor, a: Tensor, b: Tensor | None, c: Tensor | None, o: Tensor, lse: Tensor, layout: str,
            q_off: Tensor, kv_off: Tensor, max_q: int, max_kv: int, weight: str, scale: float, causal: bool,
            block: int, recompute: bool, flash: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        """``(da, db, dc)``: the gradients of the inputs (empty for a None input), written by the
        kernels directly into views of them. ``recompute`` (softmax only): ``o`` and ``lse`` were
        not kept; the forward runs again here."""
        from kernels.flash.core import attention_bwd, attention_fwd

        q, k, v = views(layout, a, b, c)
        kw = _core_kw(q_off, weight, scale, causal, block, flash)
        if recompute and weight == "softmax":
            o, lse = attention_fwd(q, k, v, q_off, kv_off, max_q, max_kv, **kw)
        da, db, dc = (a.new_empty((0,)) if t is None else torch.empty(t.shape, dtype=t.dtype, device=t.device)
                      for t in (a, b, c))
        out = views(layout, da, None if b is None else db, None if c is None else dc)
        attention_bwd(do if do.stride(-1) == 1 else do.contiguous(), q, k, v, o, lse, q_off, kv_off, max_q,
                      max_kv, out=out, **kw)
        return da, db, dc

    @bwd.register_fake
    def _(do, a, b, c, o, lse, layout, q_off, kv_off, max_q, max_kv, weight, scale, causal, block, recompute,
          flash):
        return tuple(a.new_empty((0,)) if t is None else t.new_empty(t.shape) for t in (a, b, c))

    fwd.register_autograd(_backward(bwd), setup_context=_setup_context)
    return fwd


def _setup_context(ctx, inputs, output):
    a, b, c, layout, q_off, kv_off, *args = inputs  # args: max_q, max_kv, weight, scale, causal, block, recompute, ...
    o, lse = output
    keep = args[2] == "softmax" and not args[6]
    ctx.save_for_backward(a, b, c, q_off, kv_off, o if keep else None, lse if keep else None)
    ctx.layout, ctx.args = layout, args
    ctx.mark_non_differentiable(lse)


def _backward(bwd):
    def backward(ctx, do, _dlse):
        a, b, c, q_off, kv_off, o, lse = ctx.saved_tensors
        if o is None:  # activation weights (their backward reads neither) or recompute
            o = lse = a.new_empty((0,))
        da, db, dc = bwd(do, a, b, c, o, lse, ctx.layout, q_off, kv_off, *ctx.args)
        return (da, None if b is None else db, None if c is None else dc) + (None,) * 11

    return backward


OPS = {kind: _define(kind) for kind in KINDS}


def dense_offsets(batch: int, n: int, like: Tensor) -> Tensor:
    """Offsets ``arange(B+1)·N`` (dtype and device of ``like``) of a dense ``[B, N, H, D]`` side.
    A new tensor per call: pass one tensor to every layer of a step (the model does) so that the
    work lists built for it are reused (``kernels.flash.work``). Callers must not write to it."""
    return torch.arange(batch + 1, device=like.device, dtype=like.dtype) * n
