"""The attention family's dispatcher: one spec, a kernel choice, the Triton core or the reference.

``attention(q, k, v, offsets, max_len, ..., spec=AttentionSpec(...), kernel="triton")`` checks
the inputs (one-line errors), lays a dense side out as a jagged one (offsets ``arange(B+1)·N``)
and runs either the registered op (``op.py``: the Triton core, ``kernels/flash``) or the
reference (``reference.py``). ``attention_packed`` takes fused projections (``qkv [rows, 3, H,
D]``, or q with ``kv [.., 2, H, D]``) and gives their gradients back whole: the executor's path.
The named entry points below (``jagged_flash_attention``, ``gdpa``, ``block_attention``,
``jagged_q_dense_kv``, ``dense_q_jagged_kv``) build the spec for one kind.

Layout of the jagged side: ``values [T, H, D]`` packed sample after sample, ``offsets [B+1]``
(``offsets[0] = 0``, rows from ``offsets[B]`` on are padding, returned zero), ``max_len`` a bound
on the lengths (it sizes the grid: no host sync on the Triton path). A dense side is
``[B, N, H, D]``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from kernels.attention import checks as C
from kernels.attention.op import OPS, dense_offsets
from kernels.attention.reference import attention_reference
from kernels.attention.spec import KERNELS, AttentionSpec, FlashOptions, Kernel


class _Call(NamedTuple):
    """One call on the core's layout: q, k, v ``[T, H, D]``, both offsets, both bounds, and the
    shape the output goes back to."""

    q: Tensor
    k: Tensor
    v: Tensor
    q_off: Tensor
    kv_off: Tensor
    max_q: int
    max_kv: int
    shape: tuple


class _Names(NamedTuple):
    """How errors name the op and its jagged offsets and bound."""

    op: str = "attention"
    offsets: str = "offsets"
    max_len: str = "max_len"


def attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, kv_offsets: Tensor | None = None,
              max_kv: int | None = None, *, spec: AttentionSpec = AttentionSpec(), kernel: Kernel = "triton",
              flash: FlashOptions | None = None, padded: bool | None = None) -> Tensor:
    """Attention of ``spec`` (``kernels/ATTENTION.md``); returns the queries' shape.

    Sides by ``spec.jagged``: ``"both"``: ``q [Tq, H, D]`` over ``offsets`` and ``k, v`` the same
    tokens (self attention, ``kv_offsets=None``) or ``[Tk, H, D]`` over ``kv_offsets`` (bounded by
    ``max_kv``, default ``max_len``); ``"q"``: ``k, v [B, N, H, D]`` dense; ``"kv"``: ``q [B, N, H,
    D]`` dense over ``k, v [T, H, D]`` jagged by ``offsets`` (returns ``[B, N, H, D]``).

    ``kernel``: ``"triton"`` (the core; bf16/fp16/fp32, head dim a power of two 16..128) or
    ``"reference"`` (any float dtype, differentiable; ``padded`` as ``reference.attention_reference``).
    ``flash``: the core's variants (``FlashOptions``; the Scenario's ``execution.flash`` too).
    """
    return _run(spec, q, k, v, offsets, max_len, kv_offsets, max_kv, kernel, flash, padded, _Names())


def _run(spec, q, k, v, offsets, max_len, kv_offsets, max_kv, kernel, flash, padded, names) -> Tensor:
    if kernel not in KERNELS:
        raise ValueError(f"{names.op}: kernel '{kernel}' is unknown; use triton or reference")
    call = _layout(spec, names, q, k, v, offsets, max_len, kv_offsets, max_kv, triton=kernel == "triton")
    scale = spec.default_scale(call.q.shape[-1], call.max_kv)
    if kernel == "reference":
        o = attention_reference(call.q, call.k, call.v, call.q_off, call.kv_off, weight=spec.weight, scale=scale,
                                causal=spec.causal, block=spec.block, padded=padded)
    else:
        o = _op(spec, "q,k,v", call.q, call.k, call.v, call, scale, FlashOptions.of(flash), False)
    return o.view(call.shape)


def _op(spec: AttentionSpec, layout: str, a, b, c, call: _Call, scale: float, flash: FlashOptions,
        recompute: bool) -> Tensor:
    return OPS[spec.kind](a, b, c, layout, call.q_off, call.kv_off, int(call.max_q), int(call.max_kv), spec.weight,
                          float(scale), bool(spec.causal), int(spec.block), bool(recompute), flash.to_ints())[0]


# ---- layouts: every side as the core takes it -------------------------------------------------
def _layout(spec, names, q, k, v, offsets, max_len, kv_offsets, max_kv, *, triton: bool) -> _Call:
    if spec.jagged == "q":
        return _dense_kv(names, q, k, v, offsets, max_len, triton)
    if spec.jagged == "kv":
        return _dense_q(names, q, k, v, offsets, max_len, triton)
    if kv_offsets is None:
        return _self(names, q, k, v, offsets, max_len, triton)
    return _jagged_kv(spec, names, q, k, v, offsets, max_len, kv_offsets, max_kv, triton)


def _self(names, q, k, v, offsets, max_len, triton) -> _Call:
    op = names.op
    for name, t in (("q", q), ("k", k), ("v", v)):
        C.check_dims(op, name, t, 3, "[T, H, D]")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"{op}: q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}; self attention needs one shape [T, H, D]")  # fmt: skip
    if triton:
        C.check_tensors(op, q=q, k=k, v=v)
    C.check_offsets(op, names.offsets, offsets, q)
    C.check_max_len(op, names.max_len, max_len)
    return _Call(q, k, v, offsets, offsets, max_len, max_len, q.shape)


def _jagged_kv(spec, names, q, k, v, offsets, max_len, kv_offsets, max_kv, triton) -> _Call:
    op = names.op
    C.check_dims(op, "q", q, 3, "[Tq, H, D]")
    for name, t in (("k", k), ("v", v)):
        C.check_dims(op, name, t, 3, "[Tk, H, D] (or [B, N, H, D] with kv_offsets=None)")
    C.check_same(op, k, v)
    if triton:
        C.check_tensors(op, q=q, k=k, v=v)
    C.check_offsets(op, names.offsets, offsets, q)
    C.check_max_len(op, names.max_len, max_len)
    if spec.causal and kv_offsets is not offsets:
        raise ValueError(f"{op}: causal=True needs self attention; pass kv_offsets=None (or {names.offsets} itself)")
    C.check_offsets(op, "kv_offsets", kv_offsets, q, batch=offsets.shape[0] - 1)
    max_kv = max_len if max_kv is None else max_kv
    C.check_max_len(op, "max_kv", max_kv)
    return _Call(q, k, v, offsets, kv_offsets, max_len, max_kv, q.shape)


def _dense_kv(names, q, k, v, offsets, max_len, triton) -> _Call:
    """Jagged queries ``[T, H, D]`` over dense short K/V ``[B, N, H, D]``."""
    op = names.op
    C.check_dims(op, "q", q, 3, "[T, H, D]")
    for name, t in (("k", k), ("v", v)):
        C.check_dims(op, name, t, 4, "[B, N, H, D]")
    C.check_same(op, k, v, "dense K/V needs one shape [B, N, H, D]")
    if triton:
        C.check_tensors(op, q=q, k=k, v=v)
    B, N = k.shape[:2]
    C.check_offsets(op, names.offsets, offsets, q, batch=B)
    C.check_max_len(op, names.max_len, max_len)
    kv_off = dense_offsets(B, N, offsets)
    return _Call(q, k.flatten(0, 1), v.flatten(0, 1), offsets, kv_off, max_len, N, q.shape)


def _dense_q(names, q, k, v, offsets, max_len, triton) -> _Call:
    """``N`` dense queries a sample ``[B, N, H, D]`` over a jagged history ``k, v [T, H, D]``."""
    op = names.op
    C.check_dims(op, "q", q, 4, "[B, N, H, D]")
    for name, t in (("k", k), ("v", v)):
        C.check_dims(op, name, t, 3, "[T, H, D]")
    C.check_same(op, k, v)
    if triton:
        C.check_tensors(op, q=q, k=k, v=v)
    B, N = q.shape[:2]
    C.check_offsets(op, names.offsets, offsets, q, batch=B)
    C.check_max_len(op, names.max_len, max_len)
    q_off = dense_offsets(B, N, offsets)
    return _Call(q.flatten(0, 1), k, v, q_off, offsets, N, max_len, q.shape)


# ---- packed projections in, packed gradients out (the executor's path) -----------------------
def attention_packed(a: Tensor, b: Tensor | None, offsets: Tensor, max_len: int, *, spec: AttentionSpec,
                     flash: FlashOptions | None = None, recompute: bool = False,
                     dense_off: Tensor | None = None) -> Tensor:
    """``spec`` on the Triton core with fused projections: ``spec.jagged="both"``: ``a = qkv
    [rows, 3, H, D]``, ``b=None``; ``"q"``: ``a = q [rows, H, D]``, ``b = kv [B, N, 2, H, D]``;
    ``"kv"``: ``a = q [B, N, H, D]``, ``b = kv [rows, 2, H, D]``. Returns the queries' shape; in
    backward the gradient of ``a`` (and ``b``) comes back as one tensor each, written by the
    kernels. ``recompute`` (selective checkpointing): keep only the inputs; softmax recomputes
    ``o`` and its log-sum-exp in backward. ``dense_off``: the dense side's offsets (default a
    new ``arange(B+1)·N``; pass one tensor to every layer so their work lists are shared)."""
    if spec.jagged == "both":
        if a.dim() != 4 or a.shape[1] != 3 or b is not None:
            raise ValueError(f"qkv has shape {tuple(a.shape)}; it must be [rows, 3, H, D] (and b=None)")
        call = _Call(a, a, a, offsets, offsets, max_len, max_len, a.shape[:1] + a.shape[2:])
        layout = "qkv"
    else:
        dense = b if spec.jagged == "q" else a
        B, N = dense.shape[:2]
        if dense_off is None:
            dense_off = torch.arange(B + 1, device=offsets.device, dtype=offsets.dtype) * N
        if spec.jagged == "q":
            call = _Call(a, b, b, offsets, dense_off, max_len, N, a.shape)
        else:
            call = _Call(a, b, b, dense_off, offsets, N, max_len, a.shape)
        layout = "q,kv"
    scale = spec.default_scale(a.shape[-1], call.max_kv)
    o = _op(spec, layout, a, b, None, call, scale, FlashOptions.of(flash), recompute)
    return o.view(call.shape)


# ---- one entry point per kind ------------------------------------------------------------------
def jagged_flash_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, *, causal: bool = True,
                           scale: float | None = None, kernel: Kernel = "triton",
                           flash: FlashOptions | None = None) -> Tensor:
    """JFA: softmax self attention of each sample over its own tokens, ``[T, H, D]``; ``scale``
    defaults to ``1/sqrt(D)``; ``causal``: query ``i`` sees keys ``j <= i``."""
    spec = AttentionSpec("jfa", causal=causal, scale=scale)
    return _run(spec, q, k, v, offsets, max_len, None, None, kernel, flash, None, _Names("jagged_flash_attention"))


def block_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, *, block: int = 64,
                    causal: bool = False, scale: float | None = None, kernel: Kernel = "triton",
                    flash: FlashOptions | None = None) -> Tensor:
    """Softmax self attention inside blocks of ``block`` consecutive tokens of each sample (the
    last may be shorter), ``[T, H, D]``; ``causal`` adds ``j <= i``."""
    spec = AttentionSpec("block", causal=causal, block=block, scale=scale)
    return _run(spec, q, k, v, offsets, max_len, None, None, kernel, flash, None, _Names("block_attention"))


def gdpa(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, max_q: int, kv_offsets: Tensor | None = None,
         max_kv: int | None = None, *, activation: str = "silu", scale: float | None = None, causal: bool = False,
         kernel: Kernel = "triton", flash: FlashOptions | None = None) -> Tensor:
    """``O = (act(Q Kᵀ) · scale · mask) V`` for jagged ``q [Tq, H, D]``, ``[Tq, H, D]``. K/V: the
    queries' own tokens (``kv_offsets=None``, 3-D ``k``; scale ``1/max_q``), jagged ``[Tk, H, D]``
    with ``kv_offsets`` (scale ``1/max_kv``), or dense ``[B, N, H, D]`` (``kv_offsets=None``,
    4-D ``k``; scale ``1/N``)."""
    jagged = "q" if kv_offsets is None and k.dim() == 4 else "both"
    spec = AttentionSpec("gdpa", causal=causal, activation=activation, jagged=jagged, scale=scale)
    names = _Names("gdpa", "q_offsets", "max_q")
    return _run(spec, q, k, v, q_offsets, max_q, kv_offsets, max_kv, kernel, flash, None, names)


def jagged_q_dense_kv(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, *, scale: float | None = None,
                      kernel: Kernel = "triton", flash: FlashOptions | None = None) -> Tensor:
    """Long jagged queries ``q [T, H, D]`` over ``N`` dense keys a sample ``k, v [B, N, H, D]``:
    ``softmax(Q Kᵀ · scale) V``, ``[T, H, D]``; ``scale`` defaults to ``1/sqrt(D)``."""
    spec = AttentionSpec("asym", jagged="q", scale=scale)
    return _run(spec, q, k, v, offsets, max_len, None, None, kernel, flash, None, _Names("jagged_q_dense_kv"))


def dense_q_jagged_kv(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, *, scale: float | None = None,
                      kernel: Kernel = "triton", flash: FlashOptions | None = None) -> Tensor:
    """``N`` dense queries a sample ``q [B, N, H, D]`` over a long jagged history ``k, v [T, H,
    D]``: ``softmax(Q Kᵀ · scale) V``, ``[B, N, H, D]`` (zero rows for a sample of length 0)."""
    spec = AttentionSpec("asym", jagged="kv", scale=scale)
    return _run(spec, q, k, v, offsets, max_len, None, None, kernel, flash, None, _Names("dense_q_jagged_kv"))
