"""FLOPs and bytes of the MXFP8 ops, torch-free (the twin prices them with ``hwmodels.kernels``:
``quantize`` on the ``quantize`` kernel kind, the GEMM on ``gemm`` with dtype ``mxfp8``).

Bytes are the fewest a kernel must move through device memory: each input read once, each
output written once. The scale is one byte per 32 elements; block dims are padded to 32.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.mxfp8 import BLOCK


def padded(n: int) -> int:
    return -(-int(n) // BLOCK) * BLOCK


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float


def quantize(rows: int, n: int, *, in_bytes: float = 2.0, elem_bytes: float = 1.0) -> Cost:
    """Quantize ``rows × n`` along ``n``: read the input, write fp8 data and the E8M0 scales.
    No tensor-core FLOPs (a few CUDA-core ops per element, memory-bound)."""
    n32 = padded(n)
    return Cost(0.0, rows * n * in_bytes + rows * n32 * elem_bytes + rows * n32 / BLOCK)


def gemm(m: int, n: int, k: int, *, out_bytes: float = 2.0) -> Cost:
    """``[m, k] · [n, k]ᵀ`` in MXFP8: 2·m·n·k FLOPs; reads both fp8 operands and their scales once,
    writes the output (bf16 by default)."""
    k32 = padded(k)
    return Cost(2.0 * m * n * k, (m + n) * k32 * (1.0 + 1.0 / BLOCK) + m * n * out_bytes)


def linear_training(m: int, k: int, n: int, *, in_bytes: float = 2.0, out_bytes: float = 2.0) -> dict[str, Cost]:
    """The kernels of one ``MXFP8Linear`` step (``x [m, k]``, ``W [n, k]``): three GEMMs and the six
    quantizations (x and W along k; dy along n and W along n; dy and x along m)."""
    return {
        "fwd.gemm": gemm(m, n, k, out_bytes=out_bytes),
        "dgrad.gemm": gemm(m, k, n, out_bytes=out_bytes),
        "wgrad.gemm": gemm(n, k, m, out_bytes=out_bytes),
        "fwd.quantize_x": quantize(m, k, in_bytes=in_bytes),
        "fwd.quantize_w": quantize(n, k, in_bytes=in_bytes),
        "dgrad.quantize_dy": quantize(m, n, in_bytes=in_bytes),
        "dgrad.quantize_w": quantize(k, n, in_bytes=in_bytes),
        "wgrad.quantize_dy": quantize(n, m, in_bytes=in_bytes),
        "wgrad.quantize_x": quantize(k, m, in_bytes=in_bytes),
    }


__all__ = ["Cost", "gemm", "linear_training", "quantize"]
