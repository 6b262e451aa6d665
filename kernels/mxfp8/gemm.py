"""MXFP8 GEMM ``C = A · Bᵀ`` (``A [M, K32]``, ``B [N, K32]``, both K-major fp8 with E8M0 scales
per 32 along K): Hopper emulation of the block-scaled MMA, plus the native path's dispatch.

Hopper (sm_90) has fp8 tensor cores but no block-scaled MMA. ``_mx_mm_kernel`` runs the K loop
in chunks of ``32·SUB``; inside a chunk each 32-wide slice is one fp8 ``tl.dot`` (a K=32 wgmma)
into a fresh fp32 tile, folded into the accumulator as ``acc += dot · (sa ⊗ sb)``. That is
exactly the block-scaled product (the scales are powers of two, so the multiply is exact
unless it under/overflows fp32, which the dequantize-then-matmul reference also does), with
fp32 accumulation across blocks. The cost the tensor cores never see: 2 fp32 ops per output
element per 32 of K on the CUDA cores (the scale outer product and the FMA), about twice the
tensor-core time of the K=32 wgmma itself at fp8 rate, which bounds this emulation at roughly
half the fp8 peak (see kernels/mxfp8/NOTES.md for the measurement).

``_mx_mm_native_kernel`` uses ``tl.dot_scaled`` (e4m3 × e4m3, e8m0 scales): on Blackwell (sm_100)
Triton lowers it to the native block-scaled MMA; on Hopper Triton decomposes it (upcast to
bf16, bf16 MMA), which is how its correctness is tested there. ``mx_mm`` dispatches:
capability >= 10 → native, 9.x → the emulation above, CPU → ``reference.mx_mm_ref`` (dequantize
+ fp32 matmul) unless ``backend`` names a Triton kernel (the CPU tests run both kernels under
``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.mxfp8 import BLOCK
from kernels.mxfp8.reference import mx_mm_ref


@triton.jit
def _e8m0_to_f32(code):
    c = code.to(tl.int32)
    bits = tl.where(c == 0, 0x400000, c << 23)  # 2^-127 is an fp32 subnormal
    bits = tl.where(c == 255, 0x7FC00000, bits)  # E8M0 NaN
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _tile(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    per_group = GROUP_M * num_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def _mx_mm_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, c_ptr, M, N, nkb, s_am, s_bn, s_cm, s_cn,
                  BM: tl.constexpr, BN: tl.constexpr, SUB: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile(M, N, BM, BN, GROUP_M)
    rm = (pid_m * BM + tl.arange(0, BM)) % M
    rn = (pid_n * BN + tl.arange(0, BN)) % N
    rk = tl.arange(0, 32)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * s_am + rk[None, :]
    b_ptrs = b_ptr + rn[None, :].to(tl.int64) * s_bn + rk[:, None]  # [32, BN] tile of Bᵀ
    sa_ptrs = sa_ptr + rm.to(tl.int64) * nkb
    sb_ptrs = sb_ptr + rn.to(tl.int64) * nkb
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(0, nkb, SUB):
        for j in tl.static_range(SUB):
            k = kb + j
            ok = k < nkb
            a = tl.load(a_ptrs + k * 32, mask=ok, other=0.0)
            b = tl.load(b_ptrs + k * 32, mask=ok, other=0.0)
            sa = _e8m0_to_f32(tl.load(sa_ptrs + k, mask=ok, other=127))
            sb = _e8m0_to_f32(tl.load(sb_ptrs + k, mask=ok, other=127))
            acc += tl.dot(a, b) * (sa[:, None] * sb[None, :])
    cm = pid_m * BM + tl.arange(0, BM)
    cn = pid_n * BN + tl.arange(0, BN)
    c_ptrs = c_ptr + cm[:, None].to(tl.int64) * s_cm + cn[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(cm < M)[:, None] & (cn < N)[None, :])


@triton.jit
def _mx_mm_native_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, c_ptr, M, N, K, s_am, s_bn, s_cm, s_cn,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile(M, N, BM, BN, GROUP_M)
    rm = (pid_m * BM + tl.arange(0, BM)) % M
    rn = (pid_n * BN + tl.arange(0, BN)) % N
    rk = tl.arange(0, BK)
    rs = tl.arange(0, BK // 32)
    nkb = K // 32
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        kok = (k + rk) < K
        sok = (k // 32 + rs) < nkb
        a = tl.load(a_ptr + rm[:, None].to(tl.int64) * s_am + (k + rk)[None, :], mask=kok[None, :], other=0.0)
        b = tl.load(b_ptr + rn[None, :].to(tl.int64) * s_bn + (k + rk)[:, None], mask=kok[:, None], other=0.0)
        sa = tl.load(sa_ptr + rm[:, None].to(tl.int64) * nkb + (k // 32 + rs)[None, :], mask=sok[None, :], other=127)
        sb = tl.load(sb_ptr + rn[:, None].to(tl.int64) * nkb + (k // 32 + rs)[None, :], mask=sok[None, :], other=127)
        acc = tl.dot_scaled(a, sa, "e4m3", b, sb, "e4m3", acc)
    cm = pid_m * BM + tl.arange(0, BM)
    cn = pid_n * BN + tl.arange(0, BN)
    c_ptrs = c_ptr + cm[:, None].to(tl.int64) * s_cm + cn[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(cm < M)[:, None] & (cn < N)[None, :])


# (BM, BN, SUB, GROUP_M, num_warps, num_stages): the H200 choice (kernels/mxfp8/NOTES.md) first
CONFIGS = {"default": (64, 128, 4, 8, 4, 4)}  # best of 8 at 8192^3 on H200 (168-171 TFLOP/s; NOTES.md)


def _check(a: Tensor, sa: Tensor, b: Tensor, sb: Tensor) -> tuple[int, int, int]:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"mx_mm: a [M, K] and b [N, K] must share K; got {tuple(a.shape)} and {tuple(b.shape)} "
                         "(quantize both along the contraction dim)")
    M, K = a.shape
    N = b.shape[0]
    if K % BLOCK or sa.shape != (M, K // BLOCK) or sb.shape != (N, K // BLOCK):
        raise ValueError(f"mx_mm: scales must be [rows, K/32] = {(M, K // BLOCK)} and {(N, K // BLOCK)}; got "
                         f"{tuple(sa.shape)} and {tuple(sb.shape)} (K={K} must be a multiple of 32)")
    if a.stride(1) != 1 or b.stride(1) != 1 or not sa.is_contiguous() or not sb.is_contiguous():
        raise ValueError("mx_mm: a and b must be K-major (stride 1 along K) and the scales contiguous; "
                         "use the (data, scale) pair quantize returns")
    return M, N, K


def mx_mm(a: Tensor, sa: Tensor, b: Tensor, sb: Tensor, out_dtype: torch.dtype = torch.bfloat16, *,
          backend: str = "auto", config: tuple | None = None) -> Tensor:
    """``A · Bᵀ`` of MX tensors (``quantize(x, dim)`` pairs, K-major); ``out_dtype`` bf16 or fp32.

    ``backend``: ``auto`` (see the module docstring), ``emulated`` (the fp8 tl.dot kernel),
    ``native`` (tl.dot_scaled), ``reference`` (dequantize + fp32 matmul).
    """
    M, N, K = _check(a, sa, b, sb)
    if backend == "auto":
        if not a.is_cuda:
            backend = "reference"
        else:
            backend = "native" if torch.cuda.get_device_capability(a.device)[0] >= 10 else "emulated"
    if backend == "reference":
        return mx_mm_ref(a, sa, b, sb, out_dtype)
    c = torch.empty((M, N), dtype=out_dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    if backend == "emulated":
        BM, BN, SUB, GM, warps, stages = config or CONFIGS["default"]
        if not a.is_cuda:  # interpreter: small tiles, no pipelining
            BM, BN, SUB, GM, warps, stages = config or (16, 16, 2, 4, 4, 1)
        grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
        _mx_mm_kernel[grid](a, b, sa, sb, c, M, N, K // BLOCK, a.stride(0), b.stride(0), c.stride(0), c.stride(1),
                            BM=BM, BN=BN, SUB=SUB, GROUP_M=GM, num_warps=warps, num_stages=stages)
        return c
    if backend == "native":
        BM, BN, BK, GM, warps, stages = config or ((128, 128, 128, 8, 8, 3) if a.is_cuda else (16, 16, 32, 4, 4, 1))
        grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
        _mx_mm_native_kernel[grid](a.view(torch.uint8), b.view(torch.uint8), sa, sb, c, M, N, K, a.stride(0),
                                   b.stride(0), c.stride(0), c.stride(1), BM=BM, BN=BN, BK=BK, GROUP_M=GM,
                                   num_warps=warps, num_stages=stages)
        return c
    raise ValueError(f"mx_mm backend '{backend}' is unknown; use auto, emulated, native or reference")


__all__ = ["CONFIGS", "mx_mm"]
