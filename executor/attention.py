"""The executor's attention: the model's calls, on the attention family of ``kernels/attention``.

Layout: ``values [ΣL, H, D]`` packed sample after sample, ``offsets [B+1]`` (int64, sample ``b``
owns rows ``offsets[b]:offsets[b+1]``) and ``max_len`` (a bound on the batch's lengths).
Semantics: MODEL.md ("Attention kinds") and ``kernels/ATTENTION.md``; every function here builds
an ``AttentionSpec`` and calls the family's dispatcher (``kernels.attention.dispatch``), which
runs the Triton kernels (``gemtwin::attention_<kind>`` ops: exact pairs, no padding, no host
sync) or the PyTorch reference (``kernels/attention/reference.py``: exact attended pairs on CPU,
so ``FlopCounterMode`` sees the analytic count; padded, masked and recomputed in backward on
CUDA, which computes the padding too, so the executor reports MFU from the analytic count).

The kernel is picked by ``kernel=`` (auto | triton | reference; auto, the default = Triton on
CUDA, the reference on CPU), the Triton core's variants by ``flash=`` (``FlashOptions``): the
Scenario's ``execution.attention_kernel`` and ``execution.flash``, which ``executor.parallelize``
sets on the model's layers. ``jagged_attention`` and ``cross_attention`` wrap each call in
``record_function("attention.<kind>")`` (``jfa``, ``gdpa``, ``block``; ``asym`` for cross
attention) so that the profiler can attribute its time to the kernel kind the twin prices it
with; the packed path (fused projections in, packed gradients out, traced into compiled graphs)
is one op per kind, which the profiler attributes by name.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor
from torch.profiler import record_function

from kernels.attention.dispatch import attention, attention_packed
from kernels.attention.spec import AttentionSpec, FlashOptions
from scenarios.schema import AttentionKernel

Kind = Literal["jfa", "gdpa", "block"]
SELF_KINDS = get_args(Kind)
ATTENTION_KERNELS = get_args(AttentionKernel)


def use_triton(kernel: str | None, device: torch.device) -> bool:
    """Whether ``kernel`` (auto | triton | reference; None: auto) runs the Triton kernels on
    ``device``: auto is Triton on CUDA, the reference elsewhere. A run's choice is the Scenario's
    ``execution.attention_kernel``, set on the layers by ``executor.parallelize``."""
    kind = "auto" if kernel is None else kernel
    if kind not in ATTENTION_KERNELS:
        raise ValueError(f"attention kernel '{kind}': use auto, triton or reference")
    return kind == "triton" or (kind == "auto" and device.type == "cuda")


def self_spec(kind: str, *, causal: bool, block_size: int, activation: str) -> AttentionSpec:
    """The family's spec of the model's self attention ``kind`` (jfa | gdpa | block)."""
    if kind not in SELF_KINDS:
        raise ValueError(f"attention kind '{kind}' is unknown; use jfa, gdpa or block")
    return AttentionSpec(kind, causal=causal, activation=activation, block=block_size if kind == "block" else 0)


def _cross_spec(jagged: str) -> AttentionSpec:
    if jagged not in ("q", "kv"):
        raise ValueError(f"cross_attention jagged='{jagged}' is unknown; use 'q' or 'kv'")
    return AttentionSpec("asym", jagged=jagged)


def _kernel(kernel: str | None, device: torch.device) -> str:
    return "triton" if use_triton(kernel, device) else "reference"


def _max_len(max_len: int | None, offsets: Tensor) -> int:
    """``max_len`` as given (no host sync), else the longest sample read from ``offsets``."""
    if max_len is not None:
        return int(max_len)
    return int((offsets[1:] - offsets[:-1]).max()) if len(offsets) > 1 else 0


@torch.compiler.disable  # run eagerly between compiled graphs (executor.parallelize.compile_dense)
def jagged_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, *, kind: Kind = "jfa", causal: bool = True,
    block_size: int = 64, activation: str = "silu", max_len: int | None = None, padded: bool | None = None,
    kernel: str | None = None, flash: FlashOptions | None = None,
) -> Tensor:  # fmt: skip
    """Self-attention of each sample's tokens over its own tokens; returns ``[ΣL, H, D]``.

    - ``jfa``: ``softmax(Q Kᵀ / sqrt(D) + mask) V``.
    - ``gdpa``: ``(act(Q Kᵀ) · mask / max_len) V`` — no softmax, no ``1/sqrt(D)``; ``max_len``
      is the batch's longest sample (computed from ``offsets`` when None).
    - ``block``: ``jfa`` restricted to blocks of ``block_size`` consecutive tokens of a sample
      (the last block of a sample may be shorter); tokens never see other blocks.

    ``causal``: query ``i`` sees keys ``j <= i`` (inside its block for ``block``). A sample of
    length 0 has no rows and contributes nothing; a sample of length 1 attends to itself only
    (``jfa``/``block`` output = its ``v``; ``gdpa`` output = ``act(q·k) v / max_len``).
    ``padded``: run the reference as padded, masked bmm (default: on CUDA tensors) instead of
    exact pairs. ``kernel``: auto | triton | reference (auto: the Triton kernels on CUDA tensors,
    the reference elsewhere). ``flash``: the Triton core's variants.
    """
    spec = self_spec(kind, causal=causal, block_size=block_size, activation=activation)
    with record_function(f"attention.{kind}"):
        return attention(q, k, v, offsets, _max_len(max_len, offsets), spec=spec, kernel=_kernel(kernel, q.device),
                         flash=flash, padded=padded)


@torch.compiler.disable
def cross_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, *, jagged: Literal["q", "kv"], max_len: int,
    padded: bool | None = None, kernel: str | None = None, flash: FlashOptions | None = None,
) -> Tensor:  # fmt: skip
    """Softmax attention (scale ``1/sqrt(D)``, no mask) between a jagged and a dense side.

    - ``jagged="q"``: ``q [ΣL, H, D]`` jagged, ``k, v [B, N, H, D]`` dense; each token of
      sample ``b`` attends to the ``N`` dense tokens of sample ``b``. Returns ``[ΣL, H, D]``.
    - ``jagged="kv"``: ``q [B, N, H, D]`` dense, ``k, v [ΣL, H, D]`` jagged; each of the ``N``
      queries of sample ``b`` attends to the ``L_b`` tokens of sample ``b``; a sample of
      length 0 gets zeros. Returns ``[B, N, H, D]``.
    ``padded``, ``kernel``, ``flash`` as for ``jagged_attention``.
    """
    with record_function("attention.asym"):
        spec = _cross_spec(jagged)
        return attention(q, k, v, offsets, _max_len(max_len, offsets), spec=spec, kernel=_kernel(kernel, q.device),
                         flash=flash, padded=padded)


# ---- packed projections in, packed gradients out (the executor's Triton path) -----------------
def packed_self_attention(qkv: Tensor, offsets: Tensor, *, kind: Kind, causal: bool, block_size: int,
                          activation: str, max_len: int, recompute: bool = False,
                          flash: FlashOptions | None = None) -> Tensor:
    """``jagged_attention`` on the Triton kernels for ``qkv [rows, 3, H, D]`` (one fused
    projection): returns ``[rows, H, D]`` and, in backward, the gradient of ``qkv`` as one tensor
    that the kernels write directly (no stack of dq, dk, dv). Rows past ``offsets[-1]`` (padding)
    get zeros. ``recompute`` (selective checkpointing): keep only ``qkv``; softmax kinds recompute
    ``o`` and its log-sum-exp in backward, GDPA needs neither (its backward reads q, k, v, dO)."""
    spec = self_spec(kind, causal=causal, block_size=block_size, activation=activation)
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv has shape {tuple(qkv.shape)}; it must be [rows, 3, H, D]")
    return attention_packed(qkv, None, offsets, int(max_len), spec=spec, flash=flash, recompute=recompute)


def packed_cross_attention(q: Tensor, kv: Tensor, offsets: Tensor, *, jagged: Literal["q", "kv"], max_len: int,
                           recompute: bool = False, dense_off: Tensor | None = None,
                           flash: FlashOptions | None = None) -> Tensor:
    """``cross_attention`` on the Triton kernels with ``kv`` packed: ``jagged="q"``: ``q [rows, H, D]``,
    ``kv [B, N, 2, H, D]``, returns ``[rows, H, D]``; ``jagged="kv"``: ``q [B, N, H, D]``,
    ``kv [rows, 2, H, D]``, returns ``[B, N, H, D]``. The gradient of ``kv`` comes back as one
    tensor; ``recompute`` as for ``packed_self_attention``. ``dense_off``: the dense side's
    offsets ``arange(B+1)·N`` (default: made here; pass one tensor, made outside any compiled
    graph, to every layer so that the kernels' work lists for it are built once a step)."""
    spec = _cross_spec(jagged)
    return attention_packed(q, kv, offsets, int(max_len), spec=spec, flash=flash, recompute=recompute,
                            dense_off=dense_off)
