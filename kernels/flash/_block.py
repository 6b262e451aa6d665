"""Block-local kernels of the core: attention inside blocks of ``BLOCK_W`` tokens (a power of two
<= 128) of each sample, self attention only. Launcher: ``core.py`` (``_block_fwd`` /
``_block_bwd``); design and the byte count in NOTES.md ("Block-local path").

A block's keys are its own queries' rows, so one program holds everything a block needs: it
loads Q, K, V (and dO) of ``BM`` rows once (``BM`` a multiple of ``BLOCK_W``; if ``BM >
BLOCK_W`` the tile covers several blocks and a block-diagonal mask keeps them apart), computes
the whole ``[BM, BM]`` score tile at once (no online softmax: every key of a row is in the tile)
and writes its rows of O (forward) or dQ, dK, dV (backward). Rows never overlap between
programs: no atomics, deterministic. The backward recomputes the softmax from the scores (no
lse read) and takes ``delta = rowsum(P ∘ dP)`` (= ``rowsum(dO ∘ O)``) from the tile, so it reads
q, k, v, dO once and writes dq, dk, dv once: 7 tensor passes, against 8 + (o, dO, q, k, v read
again) for the FA2 path.

A program walks ``G`` consecutive tiles of one sample (a loop, so the compiler's pipeliner can
prefetch the next tile's rows while the current one computes); the work list is the core's
(``_plan_kernel`` records over tiles of ``BM·G`` rows).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.flash._kernels import LN2, _act, _act_grad, _item, _mm, _pair_mask


@triton.jit
def _tile_mask(offs_m, q_len, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr, BM: tl.constexpr):
    """Pairs of the ``[BM, BM]`` tile that attend (the block mask only when a tile holds several
    blocks: tiles start at multiples of BM, so a tile of BM <= BLOCK_W rows is one block)."""
    if BM > BLOCK_W:
        mask = _pair_mask(offs_m[:, None], offs_m[None, :], q_len, q_len, CAUSAL, BLOCK_W)
    else:
        mask = _pair_mask(offs_m[:, None], offs_m[None, :], q_len, q_len, CAUSAL, 0)
    return mask


@triton.jit
def _softmax_tile(s, mask, qk_scale):
    """(p unnormalised in base 2, row max used, row sum) of one whole score tile."""
    s = tl.where(mask, s * qk_scale, float("-inf"))
    m = tl.max(s, 1)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    p = tl.exp2(s - m_use[:, None])
    return p, m_use, tl.sum(p, 1)


@triton.jit(do_not_specialize=["T_q"])
def _block_fwd_kernel(
    Q, K, V, O, LSE, PLAN, T_q,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    scale, qk_scale,
    WEIGHT: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr,
    USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr,
    BM: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
):
    """O (and lse for softmax) of the rows ``[t·BM·G, (t+1)·BM·G)`` of one sample and head."""
    start, length, _s2, _l2, t = _item(PLAN, tl.program_id(0))
    if t < 0:
        return
    h = tl.program_id(1)
    offs_d = tl.arange(0, D)
    q_ptr = Q + start * stride_qt + h * stride_qh
    k_ptr = K + start * stride_kt + h * stride_kh
    v_ptr = V + start * stride_vt + h * stride_vh
    o_ptr = O + start * stride_ot + h * stride_oh
    lse_ptr = LSE + h.to(tl.int64) * T_q + start
    first = t * (BM * G)
    n_sub = tl.minimum((length - first + BM - 1) // BM, G)
    for g in range(0, n_sub):
        offs_m = first + g * BM + tl.arange(0, BM)
        row_ok = offs_m < length
        q = tl.load(q_ptr + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None],
                    other=0.0)
        k = tl.load(k_ptr + offs_m[:, None] * stride_kt + offs_d[None, :], mask=row_ok[:, None],
                    other=0.0)
        v = tl.load(v_ptr + offs_m[:, None] * stride_vt + offs_d[None, :], mask=row_ok[:, None],
                    other=0.0)
        s = _mm(q, tl.trans(k), None, DOT_PREC)
        mask = _tile_mask(offs_m, length, CAUSAL, BLOCK_W, BM)
        if WEIGHT == 0:
            p, m, l_sum = _softmax_tile(s, mask, qk_scale)
            empty = l_sum == 0.0  # only rows past the sample's end (a valid row sees itself)
            l_safe = tl.where(empty, 1.0, l_sum)
            o = _mm(p.to(v.dtype), v, None, DOT_PREC) * (1.0 / l_safe)[:, None]
            lse = tl.where(empty, float("-inf"), (m + tl.log2(l_safe)) * LN2)
            tl.store(lse_ptr + offs_m, lse, mask=row_ok)
        else:
            p = tl.where(mask, _act(s, WEIGHT, USE_ASM) * scale, 0.0)
            o = _mm(p.to(v.dtype), v, None, DOT_PREC)
        tl.store(o_ptr + offs_m[:, None] * stride_ot + offs_d[None, :], o.to(O.dtype.element_ty),
                 mask=row_ok[:, None])


@triton.jit(do_not_specialize=["T_q"])
def _block_bwd_kernel(
    Q, K, V, DO, DQ, DK, DV, PLAN, T_q,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dqt, stride_dqh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    scale, qk_scale,
    WEIGHT: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr,
    USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr,
    BM: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
):
    """dQ, dK, dV of the rows ``[t·BM·G, (t+1)·BM·G)`` of one sample and head, in one pass:
    scores and weights recomputed from q, k (softmax: its own row max and sum, no lse), ``dP =
    dO Vᵀ``, ``delta = rowsum(P ∘ dP)``, ``dS``, then ``dV = Pᵀ dO``, ``dK = dSᵀ Q``, ``dQ = dS K``."""
    start, length, _s2, _l2, t = _item(PLAN, tl.program_id(0))
    if t < 0:
        return
    h = tl.program_id(1)
    offs_d = tl.arange(0, D)
    q_ptr = Q + start * stride_qt + h * stride_qh
    k_ptr = K + start * stride_kt + h * stride_kh
    v_ptr = V + start * stride_vt + h * stride_vh
    do_ptr = DO + start * stride_dot + h * stride_doh
    dq_ptr = DQ + start * stride_dqt + h * stride_dqh
    dk_ptr = DK + start * stride_dkt + h * stride_dkh
    dv_ptr = DV + start * stride_dvt + h * stride_dvh
    first = t * (BM * G)
    n_sub = tl.minimum((length - first + BM - 1) // BM, G)
    for g in range(0, n_sub):
        offs_m = first + g * BM + tl.arange(0, BM)
        ok = (offs_m < length)[:, None]
        q = tl.load(q_ptr + offs_m[:, None] * stride_qt + offs_d[None, :], mask=ok, other=0.0)
        k = tl.load(k_ptr + offs_m[:, None] * stride_kt + offs_d[None, :], mask=ok, other=0.0)
        v = tl.load(v_ptr + offs_m[:, None] * stride_vt + offs_d[None, :], mask=ok, other=0.0)
        do = tl.load(do_ptr + offs_m[:, None] * stride_dot + offs_d[None, :], mask=ok, other=0.0)
        s = _mm(q, tl.trans(k), None, DOT_PREC)
        dp = _mm(do, tl.trans(v), None, DOT_PREC)
        mask = _tile_mask(offs_m, length, CAUSAL, BLOCK_W, BM)
        if WEIGHT == 0:
            p, m, l_sum = _softmax_tile(s, mask, qk_scale)
            p = p * (1.0 / tl.where(l_sum == 0.0, 1.0, l_sum))[:, None]
            delta = tl.sum(p * dp, 1)
            ds = p * (dp - delta[:, None]) * scale
        else:
            a, da = _act_grad(s, WEIGHT, USE_ASM)
            p = tl.where(mask, a * scale, 0.0)
            ds = tl.where(mask, dp * da * scale, 0.0)
        dv = _mm(tl.trans(p.to(do.dtype)), do, None, DOT_PREC)
        tl.store(dv_ptr + offs_m[:, None] * stride_dvt + offs_d[None, :],
                 dv.to(DV.dtype.element_ty), mask=ok)
        ds_c = ds.to(q.dtype)
        dk = _mm(tl.trans(ds_c), q, None, DOT_PREC)
        tl.store(dk_ptr + offs_m[:, None] * stride_dkt + offs_d[None, :],
                 dk.to(DK.dtype.element_ty), mask=ok)
        dq = _mm(ds_c, k, None, DOT_PREC)
        tl.store(dq_ptr + offs_m[:, None] * stride_dqt + offs_d[None, :],
                 dq.to(DQ.dtype.element_ty), mask=ok)
