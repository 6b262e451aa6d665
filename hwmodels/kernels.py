"""Roofline kernel cost: max(compute time, memory time) + launch, per op class.

    compute_s = flops / (peak(dtype) × eff_compute)      memory_s = bytes / (hbm_bw_Bps × eff_memory)
    time_s    = (max(compute_s, memory_s) + launch_s) × scale[op_class]

`gemm` and `attention` run on tensor cores at `peak(dtype)`; the other classes run on CUDA
cores, so their compute roof is the fp32 (non-tensor) peak whatever `dtype` says. `scale`
is a calibration's per-class multiplier (`calibration.Calibration.scale`), 1 when absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

from hwmodels.gpus import GPUSpec

OpClass = Literal["gemm", "attention", "embedding", "elementwise", "norm", "optimizer", "other"]
OP_CLASSES: tuple[str, ...] = get_args(OpClass)
TENSOR_CORE_CLASSES = ("gemm", "attention")

# (compute efficiency, memory efficiency) per op class: the fraction of the datasheet roof a
# good kernel reaches. Measured on one H200 (hwmodels/data/measured/h200_2026-11-30.yaml)
# against the datasheet 989 TFLOP/s bf16 and 4.8 TB/s, unless marked as an assumption.
DEFAULT_EFFICIENCY: dict[str, tuple[float, float]] = {
    # bf16 matmul 8192^3: 780 / 989 = 0.79; fp8 row-wise 1,341 / 1,979 = 0.68 (bf16 taken).
    # Memory side: copy 4.25 / 4.8 = 0.885, rounded down (GEMM epilogues stream less well).
    "gemm": (0.79, 0.80),
    # SDPA bf16 fwd+bwd at S=4096: 546 / 989 = 0.55 (fwd alone 0.66; S=1024 fwd+bwd 0.33).
    "attention": (0.55, 0.80),
    # F.embedding_bag sum fwd, rows read: fp32 1.72 / 4.8 = 0.36, bf16 1.02 / 4.8 = 0.21
    # (FBGEMM TBE reaches ~2.5 TB/s fwd, ANCHORS.md). Compute side: assumption, never binding.
    "embedding": (0.50, 0.35),
    # device copy 4.25 / 4.8 = 0.885. Compute side: assumption (CUDA-core fp32).
    "elementwise": (0.50, 0.885),
    # assumption: reductions over a row stream ~15% below a copy.
    "norm": (0.50, 0.75),
    # assumption: fused multi-tensor Adam streams params, grads and two moments near copy speed.
    "optimizer": (0.50, 0.80),
    # assumption: unknown kernels get half of each roof.
    "other": (0.50, 0.50),
}


class KernelCost(BaseModel):
    """Roofline breakdown of one kernel (scale already applied to each part)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute_s: float
    memory_s: float
    launch_s: float

    @property
    def bound(self) -> Literal["compute", "memory"]:
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.launch_s


def check_op_class(op_class: str) -> None:
    """One-line ValueError unless `op_class` is one of OP_CLASSES."""
    if op_class not in OP_CLASSES:
        raise ValueError(f"unknown op_class {op_class!r}; known: {', '.join(OP_CLASSES)}")


def kernel_cost(*, op_class: str, flops: float, bytes: float, gpu: GPUSpec, dtype: str,
                efficiency: Mapping[str, tuple[float, float]] | None = None,
                scale: Mapping[str, float] | None = None, launch_s: float = 5e-6) -> KernelCost:
    """Roofline breakdown; `efficiency` overrides DEFAULT_EFFICIENCY per class, `scale` multiplies time."""
    check_op_class(op_class)
    eff_c, eff_m = (efficiency or {}).get(op_class) or DEFAULT_EFFICIENCY[op_class]
    s = (scale or {}).get(op_class, 1.0)
    if min(flops, bytes) < 0 or min(eff_c, eff_m, s) <= 0:
        raise ValueError(f"kernel {op_class}: flops ({flops}) and bytes ({bytes}) must be >= 0, "
                         f"efficiency ({eff_c}, {eff_m}) and scale ({s}) > 0")
    peak = gpu.peak(dtype if op_class in TENSOR_CORE_CLASSES else "fp32")
    return KernelCost(compute_s=s * flops / (peak * eff_c), memory_s=s * bytes / (gpu.hbm_bw_Bps * eff_m),
                      launch_s=s * launch_s)


def kernel_time_s(*, op_class: str, flops: float, bytes: float, gpu: GPUSpec, dtype: str,
                  efficiency: Mapping[str, tuple[float, float]] | None = None,
                  scale: Mapping[str, float] | None = None, launch_s: float = 5e-6) -> float:
    """Seconds for one kernel: (max(compute, memory) + launch) × scale[op_class]."""
    return kernel_cost(op_class=op_class, flops=flops, bytes=bytes, gpu=gpu, dtype=dtype,
                       efficiency=efficiency, scale=scale, launch_s=launch_s).time_s
