"""The FA2-style forward and dK/dV kernels with their tiles loaded through TMA descriptors.

The same work lists, tiles, masks and math as ``_kernels.py``; only the tile loads differ: every
``[rows, D]`` tile of q, k, v (and dO in the backward) comes through a host-built TMA descriptor
over the ``[T, H·D]`` view of its tensor (``cp.async.bulk.tensor``: one instruction and an mbarrier
per tile, no per-thread address arithmetic). A tile that runs past its sample's last row reads the
next sample's rows (or zeros past the tensor), which the masks then drop, as the pointer kernels'
``other=0`` loads do. (Masked weights are zeros multiplying those rows, so a non-finite value in one
sample's k, v or dO rows can reach a neighbour's result as 0·inf, where pointer loads read zeros;
finite inputs give the pointer kernels' results bit for bit.) Stores stay masked pointer stores: a
TMA store would write into the next sample's rows.

``core`` launches them where ``tiles.use_tma`` says (a sm_90+ GPU, 16-bit tensors whose rows a
descriptor can address). A TMA dQ kernel measured 0.90-1.04x the pointer one and was removed (it is
at 1d2489d: ``git show 1d2489d:kernels/flash/_tma.py``; NOTES.md, "TMA loads").
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.flash._kernels import _dkdv_weights, _fwd_store, _fwd_weights, _item, _kv_range, _mm, _q_range


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, desc_k, desc_v, k_row, col, offs_m, lo, hi, q_len, k_len, qk_scale, scale,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr, WEIGHT: tl.constexpr,
               USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr, BN: tl.constexpr):
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        k = desc_k.load([k_row + n0, col])
        s = _mm(q, tl.trans(k), None, DOT_PREC)
        p, acc, l_i, m_i = _fwd_weights(s, acc, l_i, m_i, offs_m, offs_n, q_len, k_len, qk_scale, scale, MASKED,
                                        CAUSAL, BLOCK_W, WEIGHT, USE_ASM, False)
        v = desc_v.load([k_row + n0, col])
        acc = _mm(p.to(v.dtype), v, acc, DOT_PREC)
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["T_q"])
def _fwd_kernel(desc_q, desc_k, desc_v, O, LSE, PLAN, T_q, stride_ot, stride_oh, scale, qk_scale,
                WEIGHT: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr, ALIGNED: tl.constexpr,
                USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                D: tl.constexpr):
    q_start, q_len, k_start, k_len, t = _item(PLAN, tl.program_id(0))
    if t < 0:
        return
    h = tl.program_id(1)
    m0 = t * BM
    offs_m = m0 + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < q_len
    col = h * D
    q = desc_q.load([(q_start + m0).to(tl.int32), col])
    k_row = k_start.to(tl.int32)
    acc = tl.zeros([BM, D], dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    lo, full_hi, hi = _kv_range(m0, q_len, k_len, CAUSAL, BLOCK_W, ALIGNED, BM, BN)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, desc_k, desc_v, k_row, col, offs_m, lo, full_hi, q_len, k_len,
                               qk_scale, scale, False, CAUSAL, BLOCK_W, WEIGHT, USE_ASM, DOT_PREC, BN)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, desc_k, desc_v, k_row, col, offs_m, full_hi, hi, q_len, k_len,
                               qk_scale, scale, True, CAUSAL, BLOCK_W, WEIGHT, USE_ASM, DOT_PREC, BN)
    _fwd_store(acc, l_i, m_i, O, LSE, T_q, q_start, h, offs_m, offs_d, row_ok, stride_ot, stride_oh, WEIGHT)


@triton.jit
def _dkdv_inner(dk, dv, k, v, desc_q, desc_do, q_row, col, lse_ptr, delta_ptr, offs_n, lo, hi, q_len, k_len,
                qk_scale, scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr,
                WEIGHT: tl.constexpr, USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr, BM: tl.constexpr):
    for m0 in range(lo, hi, BM):
        offs_m = m0 + tl.arange(0, BM)
        q = desc_q.load([q_row + m0, col])
        do = desc_do.load([q_row + m0, col])
        s_t = _mm(k, tl.trans(q), None, DOT_PREC)
        dp_t = _mm(v, tl.trans(do), None, DOT_PREC)
        p_t, ds_t = _dkdv_weights(s_t, dp_t, lse_ptr, delta_ptr, offs_m, offs_n, q_len, k_len, qk_scale, scale,
                                  MASKED, CAUSAL, BLOCK_W, WEIGHT, USE_ASM, False)
        dv = _mm(p_t.to(do.dtype), do, dv, DOT_PREC)
        dk = _mm(ds_t.to(q.dtype), q, dk, DOT_PREC)
    return dk, dv


@triton.jit(do_not_specialize=["T_q"])
def _dkdv_kernel(desc_q, desc_k, desc_v, desc_do, LSE, DELTA, DK, DV, PLAN, T_q,
                 stride_dkt, stride_dkh, stride_dvt, stride_dvh, scale, qk_scale,
                 WEIGHT: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr, ALIGNED: tl.constexpr,
                 USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                 D: tl.constexpr):
    k_start, k_len, q_start, q_len, t = _item(PLAN, tl.program_id(0))
    if t < 0:
        return
    h = tl.program_id(1)
    n0 = t * BN
    offs_n = n0 + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    k_ok = (offs_n < k_len)[:, None]
    col = h * D
    k = desc_k.load([(k_start + n0).to(tl.int32), col])
    v = desc_v.load([(k_start + n0).to(tl.int32), col])
    q_row = q_start.to(tl.int32)
    lse_ptr = LSE + h.to(tl.int64) * T_q + q_start
    delta_ptr = DELTA + h.to(tl.int64) * T_q + q_start
    dk = tl.zeros([BN, D], dtype=tl.float32)
    dv = tl.zeros([BN, D], dtype=tl.float32)
    lo, full_lo, full_hi, hi = _q_range(n0, q_len, CAUSAL, BLOCK_W, ALIGNED, BN, BM)
    dk, dv = _dkdv_inner(dk, dv, k, v, desc_q, desc_do, q_row, col, lse_ptr, delta_ptr, offs_n, lo, full_lo,
                         q_len, k_len, qk_scale, scale, True, CAUSAL, BLOCK_W, WEIGHT, USE_ASM, DOT_PREC, BM)
    dk, dv = _dkdv_inner(dk, dv, k, v, desc_q, desc_do, q_row, col, lse_ptr, delta_ptr, offs_n, full_lo, full_hi,
                         q_len, k_len, qk_scale, scale, False, CAUSAL, BLOCK_W, WEIGHT, USE_ASM, DOT_PREC, BM)
    dk, dv = _dkdv_inner(dk, dv, k, v, desc_q, desc_do, q_row, col, lse_ptr, delta_ptr, offs_n, full_hi, hi,
                         q_len, k_len, qk_scale, scale, True, CAUSAL, BLOCK_W, WEIGHT, USE_ASM, DOT_PREC, BM)
    if WEIGHT == 0:
        dk = dk * scale
    tl.store(DK + k_start * stride_dkt + h * stride_dkh + offs_n[:, None] * stride_dkt + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=k_ok)
    tl.store(DV + k_start * stride_dvt + h * stride_dvh + offs_n[:, None] * stride_dvt + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=k_ok)
