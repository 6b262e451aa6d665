"""The MX format's exact fp8 rounding and E8M0 scale code, as Triton device functions.

Rules: ``kernels/mxfp8/__init__.py`` (OCP MX v1.0: 32-element blocks, E8M0 scale rounded up so
that no element saturates, round-to-nearest-even elements). Integer and exact fp32 arithmetic
only, so the interpreter (CPU) and the GPU give the same bits. Used by the quantizers
(``kernels/mxfp8/quantize.py``, ``fake_quantize.py``) and the flash core's MXFP8 P·V
(``kernels/flash/_kernels.py``, ``_mx_e4m3``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fp8_round_rne(ay, MBITS: tl.constexpr, EMIN: tl.constexpr):
    """fp32 magnitude ``ay`` (finite, ``<= max_elem``) rounded to the nearest fp8 value (ties to
    even, subnormals included), as an exact fp32."""
    E = tl.maximum(((ay.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, EMIN)
    up = ((127 + MBITS - E) << 23).to(tl.float32, bitcast=True)  # 2^(MBITS-E): quanta per unit
    down = ((127 - MBITS + E) << 23).to(tl.float32, bitcast=True)
    v = ay * up  # < 2^(MBITS+1), exact
    v = (v + 12582912.0) - 12582912.0  # rint, ties to even (1.5·2^23 magic)
    return v * down  # the rounded magnitude, exact


@triton.jit
def scale_code(amax, EMAX: tl.constexpr):
    """``amax``: int32 bits of the block's max |x| (sign cleared; >= 0x7F800000 iff the block holds
    NaN/Inf, since the bits of non-negative floats order like the values and NaN > Inf > finite).
    Returns (bad, unbiased E8M0 exponent e clamped to [-127, 127], 2^-e as fp32)."""
    bad = amax >= 0x7F800000
    e = (amax >> 23) - 127 - EMAX + ((amax & 0x7FFFFF) > 0x600000).to(tl.int32)
    e = tl.minimum(tl.maximum(e, -127), 127)
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2^-e: normal (bad blocks: e <= 121)
    return bad, e, inv
