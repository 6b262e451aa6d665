"""PyTorch reference of GDPA (kernels/ATTENTION.md): ``O = (act(Q Kᵀ) · scale · mask) V``."""

from __future__ import annotations

from torch import Tensor

from kernels.jfa.reference import ACTIVATIONS, attention_reference, dense_offsets


def gdpa(
    q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, max_q: int,
    kv_offsets: Tensor | None = None, max_kv: int | None = None, *,
    activation: str = "silu", scale: float | None = None, causal: bool = False,
) -> Tensor:  # fmt: skip
    """Generalised dot-product attention, ``[Tq, H, D]``; no softmax, no normalisation.

    Per sample and head: ``W = act(S) · scale · mask`` for ``S = Q Kᵀ``, then ``O = W V``, with
    ``act`` one of ``silu``, ``gelu`` (tanh approximation), ``relu``, ``relu2`` (``relu(x)²``),
    ``identity``. K/V are

    - jagged with ``kv_offsets`` (``k, v [Tk, H, D]``), or the queries' own tokens when
      ``kv_offsets`` is None and ``k`` is 3-D (self attention); ``scale`` defaults to
      ``1/max_kv`` (HSTU's SiLU attention; ``max_kv`` defaults to ``max_q``);
    - dense and short when ``kv_offsets`` is None and ``k, v`` are ``[B, N, H, D]``: every query
      of sample ``b`` sees the ``N`` keys of sample ``b``; ``scale`` defaults to ``1/N``.

    ``causal``: query ``i`` sees keys ``j <= i`` (positions from the sample's start). Length 0:
    no rows (Lq = 0) or zero rows (Lk = 0). Length 1: ``O = act(q·k) · scale · v``.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"gdpa activation '{activation}' is unknown; use one of {', '.join(ACTIVATIONS)}")
    if kv_offsets is None and k.dim() == 4:  # dense short K/V
        B, N = k.shape[:2]
        kv_offsets = dense_offsets(B, N, q.device)
        k, v = k.reshape(B * N, *k.shape[2:]), v.reshape(B * N, *v.shape[2:])
        default = 1.0 / max(N, 1)
    else:
        kv_offsets = q_offsets if kv_offsets is None else kv_offsets
        default = 1.0 / max(max_q if max_kv is None else max_kv, 1)
    scale = default if scale is None else scale
    return attention_reference(
        q, k, v, q_offsets, kv_offsets, weight=activation, scale=scale, causal=causal
    )
