"""MXFP8 (OCP Microscaling Formats v1.0): quantize / dequantize, the block-scaled GEMM, training layers.

Torch-free (the twin imports ``kernels.mxfp8.cost``); torch and Triton live in ``reference.py``
(PyTorch), ``quantize.py`` and ``gemm.py`` (Triton), ``linear.py`` (``MXFP8Linear``) and
``gdpa.py`` (GDPA's Q·Kᵀ and P·V through MXFP8).

The format, exactly as every implementation here computes it
-------------------------------------------------------------
- A block is 32 consecutive elements along the *block dim* (the contraction dim of the matmul
  that will consume the tensor). A block dim whose length is not a multiple of 32 is
  **zero-padded** to the next multiple (the padded tail is stored; zeros add nothing to a dot
  product, and a partial block's scale comes from its real elements only).
- Scale: one E8M0 byte per block, ``X = 2^e``, code ``e + 127``. ``e`` is the **smallest**
  integer with ``amax <= max_elem · 2^e`` (``amax`` = the block's largest |x| in fp32; E4M3
  ``max_elem = 448 = 1.75·2^8``, E5M2 ``57344 = 1.75·2^15``), i.e. the OCP shared exponent
  ``floor(log2(amax)) - emax_elem`` rounded **up** by one when amax's significand exceeds 1.75,
  so no element ever saturates. Computed exactly on the fp32 bits: with ``E`` = amax's biased
  exponent field and ``m`` its 23-bit mantissa field, ``e = E - 127 - emax_elem + (m > 0x600000)``,
  clamped to ``[-127, 127]``.
  - ``amax = 0`` (an all-zero block) and fp32-subnormal amax: ``e = -127`` (code 0, scale
    ``2^-127``); the elements are then exactly representable zeros / tiny values as computed.
  - Finite fp32/bf16 inputs give ``e <= 120`` (E4M3) so code 255 is never produced by finite data.
  - A block holding a NaN or ±Inf gets code **255** (E8M0 NaN) and all its elements are the
    element format's NaN; dequantization gives NaN for the whole block.
- Elements: ``cast_rne(x · 2^-e)`` to ``float8_e4m3fn`` (or ``float8_e5m2``): the product is
  exact in fp32 (a power-of-two scaling), the cast rounds to nearest-even and never saturates
  (``|x · 2^-e| <= max_elem`` by the choice of ``e``).
- Dequantize: ``fp32(element) · 2^e`` (exact in fp32).

Layouts: ``quantize(x, dim)`` of a 2-D ``x [R, C]`` returns ``(data, scale)`` with the block dim
moved last and contiguous: ``dim=1`` → ``data [R, C32]``, ``dim=0`` → ``data [C, R32]`` (the
transpose), ``C32``/``R32`` the padded lengths, ``scale`` uint8 ``[rows, len32/32]``. The GEMM
``mx_mm(a, sa, b, sb)`` computes ``A · Bᵀ`` for ``A [M, K32]``, ``B [N, K32]`` both K-major,
which is the layout Hopper's fp8 tensor cores require; forward, dgrad and wgrad of a Linear each
map onto it by quantizing their two operands along their own contraction dim.
"""

from __future__ import annotations

BLOCK = 32
E8M0_BIAS = 127
E8M0_NAN = 255
# name: (max finite element, emax = floor(log2(max)), element bytes)
ELEMENTS = {"e4m3": (448.0, 8, 1), "e5m2": (57344.0, 15, 1)}

__all__ = ["BLOCK", "E8M0_BIAS", "E8M0_NAN", "ELEMENTS"]
