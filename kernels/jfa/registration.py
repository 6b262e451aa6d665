"""torch.library registration shared by the four attention ops, and their input checks.

Every public op (JFA, GDPA, BlockAttention, asymmetric) is one call of the Triton core
(``kernels.flash.core.attention_fwd`` / ``attention_bwd``, kernels/ATTENTION.md "Core") with its
own flags. ``define_attention_ops("jfa")`` registers the pair ``gemtwin::jfa_fwd`` (returns
``o, lse``) and ``gemtwin::jfa_bwd`` (returns ``dq, dk, dv``) with the core's signature, a fake
(meta) implementation of each, and autograd on the forward op; so each kernel kind is its own
op in traces and profiles while all share one implementation. The core is imported when an op
first runs, so this module imports without it (fakes, meta tensors and tracing need no core).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ACTIVATIONS = ("silu", "gelu", "relu", "relu2", "identity")


class AttentionOps(NamedTuple):
    fwd: object  # torch.library CustomOpDef: (q, k, v, q_offsets, kv_offsets, ...) -> (o, lse)
    bwd: object  # (do, q, k, v, o, lse, q_offsets, kv_offsets, ...) -> (dq, dk, dv)

    def __call__(self, q, k, v, q_offsets, kv_offsets, max_q, max_kv, *, weight, scale,
                 causal, block) -> Tensor:  # fmt: skip
        """The attention output ``o`` (differentiable in q, k, v). q, k, v may be strided views
        (e.g. of one fused qkv projection) as long as the head dim is contiguous: no copy."""
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        o, _ = self.fwd(q, k, v, q_offsets, kv_offsets, int(max_q), int(max_kv), weight,
                        float(scale), bool(causal), int(block))  # fmt: skip
        return o


def define_attention_ops(kind: str) -> AttentionOps:
    """Register ``gemtwin::{kind}_fwd`` and ``gemtwin::{kind}_bwd`` (see the module docstring)."""

    @torch.library.custom_op(f"gemtwin::{kind}_fwd", mutates_args=())
    def fwd(
        q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, max_q: int,
        max_kv: int, weight: str, scale: float, causal: bool, block: int,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        from kernels.flash.core import attention_fwd

        return attention_fwd(q, k, v, q_offsets, kv_offsets, max_q, max_kv, weight=weight,
                             scale=scale, causal=causal, block=block)  # fmt: skip

    @fwd.register_fake
    def _(q, k, v, q_offsets, kv_offsets, max_q, max_kv, weight, scale, causal, block):
        return torch.empty_like(q), lse_like(q, weight)

    @torch.library.custom_op(f"gemtwin::{kind}_bwd", mutates_args=())
    def bwd(
        do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, q_offsets: Tensor,
        kv_offsets: Tensor, max_q: int, max_kv: int, weight: str, scale: float, causal: bool,
        block: int,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        from kernels.flash.core import attention_bwd

        return attention_bwd(do, q, k, v, o, lse, q_offsets, kv_offsets, max_q, max_kv,
                             weight=weight, scale=scale, causal=causal, block=block)  # fmt: skip

    @bwd.register_fake
    def _(do, q, k, v, o, lse, q_offsets, kv_offsets, max_q, max_kv, weight, scale, causal, block):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def setup_context(ctx, inputs, output):
        q, k, v, q_offsets, kv_offsets, *flags = inputs
        o, lse = output
        ctx.save_for_backward(q, k, v, o, lse, q_offsets, kv_offsets)
        ctx.flags = flags  # max_q, max_kv, weight, scale, causal, block
        ctx.mark_non_differentiable(lse)

    def backward(ctx, do, _dlse):
        q, k, v, o, lse, q_offsets, kv_offsets = ctx.saved_tensors
        do = do if do.stride(-1) == 1 else do.contiguous()
        dq, dk, dv = bwd(do, q, k, v, o, lse, q_offsets, kv_offsets, *ctx.flags)
        return dq, dk, dv, None, None, None, None, None, None, None, None

    fwd.register_autograd(backward, setup_context=setup_context)
    return AttentionOps(fwd, bwd)


def lse_like(q: Tensor, weight: str) -> Tensor:
    """The core's log-sum-exp output: ``[H, Tq]`` fp32 for softmax, empty for activations."""
    if weight == "softmax":
        return q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return q.new_empty((0,), dtype=torch.float32)


_DENSE_OFFSETS: dict[tuple, Tensor] = {}


def dense_offsets(batch: int, n: int, like: Tensor) -> Tensor:
    """Offsets ``arange(B+1)·N`` (dtype and device of ``like``) of a dense ``[B, N, H, D]`` side.
    One tensor per (B, N, dtype, device), so the flash core's work lists for it are reused
    across layers (``kernels.flash.core._work``); not kept when made during a CUDA graph
    capture (its contents would exist only once the graph runs). Callers must not write to it."""
    key = (batch, n, like.dtype, like.device)
    t = _DENSE_OFFSETS.get(key)
    if t is None:
        t = torch.arange(batch + 1, device=like.device, dtype=like.dtype) * n
        if not (t.is_cuda and torch.cuda.is_current_stream_capturing()) and not torch.is_inference_mode_enabled():
            _DENSE_OFFSETS[key] = t  # (an inference tensor could not be saved for a later backward)
    return t


# ---- input checks: one line naming the field, the value and the fix ---------------------------
def check_tensors(op: str, **tensors: Tensor) -> None:
    """Same dtype (bf16/fp16/fp32), device, heads and head dim (a power of two in 16..128)."""
    first_name, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        if t.dtype not in DTYPES:
            raise ValueError(f"{op}: {name}.dtype is {t.dtype}; use bfloat16, float16 or float32")
        if t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"{op}: {name} is {t.dtype} on {t.device} but {first_name} is "
                             f"{first.dtype} on {first.device}; give all of them one dtype and device")  # fmt: skip
        if t.shape[-2:] != first.shape[-2:]:
            raise ValueError(f"{op}: {name} has heads, head dim {tuple(t.shape[-2:])} but "
                             f"{first_name} has {tuple(first.shape[-2:])}; they must match")  # fmt: skip
    d = first.shape[-1]
    if d < 16 or d > 128 or d & (d - 1):
        raise ValueError(f"{op}: head dim {d} is not a power of two in 16..128; pad it to one")


def check_dims(op: str, name: str, t: Tensor, dims: int, layout: str) -> None:
    if t.dim() != dims:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; it must be {layout}")


def check_offsets(op: str, name: str, offsets: Tensor, like: Tensor, batch: int | None = None) -> None:
    """1-D int32/int64 ``[B+1]`` on ``like``'s device (``B`` checked when known); its values are
    not read (that would need a host sync)."""
    if offsets.device != like.device:
        raise ValueError(f"{op}: {name} is on {offsets.device} but the values are on {like.device}; "
                         "move it there")  # fmt: skip
    if offsets.dim() != 1 or offsets.shape[0] < 1 or offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: {name} is {offsets.dtype} of shape {tuple(offsets.shape)}; "
                         "it must be a 1-D int32 or int64 tensor [B+1]")  # fmt: skip
    if batch is not None and offsets.shape[0] != batch + 1:
        raise ValueError(f"{op}: {name} has {offsets.shape[0]} entries for a batch of {batch}; "
                         f"it must have B+1 = {batch + 1}")  # fmt: skip


def check_max_len(op: str, name: str, value) -> None:
    if not isinstance(value, (int, torch.SymInt)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{op}: {name} is {value!r}; pass an int >= the longest sample's length")


def check_self_attention(op: str, q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len) -> None:
    """The input checks of a self-attention op: ``q, k, v`` of one shape ``[T, H, D]`` over ``offsets``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_dims(op, name, t, 3, "[T, H, D]")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"{op}: q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}; self attention needs one shape [T, H, D]")  # fmt: skip
    check_tensors(op, q=q, k=k, v=v)
    check_offsets(op, "offsets", offsets, q)
    check_max_len(op, "max_len", max_len)
