"""GDPA as a torch.library op: ``gemtwin::gdpa_fwd`` / ``gemtwin::gdpa_bwd`` over the Triton
core. Semantics: ``kernels.gdpa.reference.gdpa`` (kernels/ATTENTION.md)."""

from __future__ import annotations

from torch import Tensor

from kernels.jfa.registration import (
    ACTIVATIONS, check_dims, check_max_len, check_offsets, check_tensors, define_attention_ops,
    dense_offsets,
)  # fmt: skip

OPS = define_attention_ops("gdpa")


def gdpa(
    q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, max_q: int,
    kv_offsets: Tensor | None = None, max_kv: int | None = None, *,
    activation: str = "silu", scale: float | None = None, causal: bool = False,
) -> Tensor:  # fmt: skip
    """``O = (act(Q Kᵀ) · scale · mask) V`` for jagged ``q [Tq, H, D]`` (``q_offsets [B+1]``);
    returns ``[Tq, H, D]``.

    K/V: jagged ``[Tk, H, D]`` with ``kv_offsets`` (scale defaults to ``1/max_kv``); the
    queries' own tokens when ``kv_offsets`` is None and ``k`` is 3-D (``max_kv = max_q``); or
    dense ``[B, N, H, D]`` when ``kv_offsets`` is None and ``k`` is 4-D (scale ``1/N``).
    """
    op = "gdpa"
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation '{activation}' is unknown; use one of {', '.join(ACTIVATIONS)}")
    check_dims(op, "q", q, 3, "[Tq, H, D]")
    check_offsets(op, "q_offsets", q_offsets, q)
    check_max_len(op, "max_q", max_q)
    if kv_offsets is None and k.dim() == 4:  # dense short K/V
        if v.shape != k.shape:
            raise ValueError(f"{op}: k, v have shapes {tuple(k.shape)}, {tuple(v.shape)}; dense K/V needs one shape [B, N, H, D]")
        if causal:
            raise ValueError(f"{op}: causal=True needs jagged self attention; dense K/V takes causal=False")
        check_tensors(op, q=q, k=k, v=v)
        B, N = k.shape[:2]
        check_offsets(op, "q_offsets", q_offsets, q, batch=B)
        default = 1.0 / max(N, 1)
        kv_offsets, max_kv = dense_offsets(B, N, q_offsets), N
        k, v = k.reshape(B * N, *k.shape[2:]), v.reshape(B * N, *v.shape[2:])
    else:
        for name, t in (("k", k), ("v", v)):
            check_dims(op, name, t, 3, "[Tk, H, D] (or [B, N, H, D] with kv_offsets=None)")
        if v.shape != k.shape:
            raise ValueError(f"{op}: k, v have shapes {tuple(k.shape)}, {tuple(v.shape)}; they must match")
        check_tensors(op, q=q, k=k, v=v)
        if kv_offsets is None:
            kv_offsets = q_offsets
        elif causal and kv_offsets is not q_offsets:
            raise ValueError(f"{op}: causal=True needs self attention; pass kv_offsets=None (or q_offsets itself)")
        else:
            check_offsets(op, "kv_offsets", kv_offsets, q, batch=q_offsets.shape[0] - 1)
        max_kv = max_q if max_kv is None else max_kv
        check_max_len(op, "max_kv", max_kv)
        default = 1.0 / max(max_kv, 1)
    scale = default if scale is None else scale
    return OPS(q, k, v, q_offsets, kv_offsets, max_q, max_kv, weight=activation, scale=scale,
               causal=causal, block=0)  # fmt: skip
