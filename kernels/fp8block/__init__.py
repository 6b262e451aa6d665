"""Blockwise fp8 for Hopper (DeepSeek-V3 style), through cuBLASLt's block-scaled GEMM.

Exact MXFP8 (32-element blocks, E8M0 scales; ``kernels.mxfp8``) has no tensor-core path on
Hopper. cuBLASLt does have one for 128-element blocks with fp32 scales, reached through
``torch.nn.functional.scaled_mm`` with ``ScalingType.BlockWise1x128`` (activations and gradients)
and ``ScalingType.BlockWise128x128`` (weights). This package is that format, end to end:

- ``reference.py``: the PyTorch specification (quantize, dequantize, the emulated GEMM that the
  CPU runs);
- ``quantize.py``: the Triton quantizer. One read of a ``[128, 128]`` tile writes both
  orientations a Linear needs (row-wise along the tile's columns, and the transpose along its
  rows), and it can apply the producer's epilogue first (bias + GELU forward, the GELU backward
  with the bias gradient), so the activation never exists in bf16;
- ``gemm.py``: ``block_mm``, the three matmuls of a Linear on ``scaled_mm`` (emulated on CPU);
- ``linear.py``: ``Fp8BlockLinear`` (a drop-in ``nn.Linear`` with the bf16 guard) and
  ``fp8_block_ffn`` (ffn1 → bias + GELU → ffn2 with the quantization fused into the producers);
- ``bench.py``: the side-by-side measurements (the GEMM, the MLP block, the per-shape threshold
  table that ``precision.mlp: auto`` and the twin read).

The format, exactly as every implementation here computes it
-------------------------------------------------------------
- A block is 128 consecutive elements along the *block dim*, the contraction dim of the matmul
  that consumes the tensor (1×128), or a 128×128 tile of a weight (one scale for both of the
  weight's orientations, so the transposed copy dgrad needs reuses it).
- Scale: fp32, a power of two ``2^e``, ``e`` the smallest integer with ``amax <= max_elem · 2^e``
  (E4M3 ``max_elem = 448``, E5M2 ``57344``), clamped to ``[-126, 127]``; computed exactly from the
  bits of ``amax`` (``e = E - 127 - emax + (m > 0x600000)``, as the MX rule). A power of two
  keeps the scaling exact and the Triton and PyTorch results bit-identical; it costs under one
  bit of the element range against ``amax / max_elem``.
- Elements: ``cast_rne(x · 2^-e)`` to ``float8_e4m3fn`` (or ``float8_e5m2`` for gradients); no
  element saturates.
- A block holding NaN or ±Inf: its scale is NaN and its elements the NaN byte 0x7F, so anything
  computed from it is NaN (the guard sees it and falls back to bf16).
- Dims not a multiple of 128: a row count (tokens) is zero-padded to a multiple of 128 by the
  quantizer; a layer's ``in_features`` and ``out_features`` must be multiples of 128 (others run
  in bf16: ``eligible``).
"""

from __future__ import annotations

BLOCK = 128
# name: (max finite element, emax = floor(log2(max)))
ELEMENTS = {"e4m3": (448.0, 8), "e5m2": (57344.0, 15)}
E_MIN, E_MAX = -126, 127


def eligible(in_features: int, out_features: int) -> bool:
    """Whether a Linear of these widths can run blockwise fp8 (both multiples of 128)."""
    return in_features % BLOCK == 0 and out_features % BLOCK == 0


def padded(n: int) -> int:
    """``n`` rounded up to a multiple of 128."""
    return -(-int(n) // BLOCK) * BLOCK


__all__ = ["BLOCK", "ELEMENTS", "E_MAX", "E_MIN", "eligible", "padded"]
