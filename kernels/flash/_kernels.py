"""Triton kernels of the jagged attention core (the launcher is ``core.py``; design in NOTES.md).

Every attention kernel walks a *work list* built by ``_plan_kernel``: one record per
(sample, tile) item, longest sample first, holding the sample's row ranges on both sides and the
tile index, so a program needs one round of loads before its first tile. Axis 0 of the grid is
the item, axis 1 the head; programs past the last item (tile index -1) exit.

Tiles are masked only where they need it: a loop over the tiles that are fully valid (inside both
lengths, under the causal diagonal, inside one block) runs without masks, the diagonal / ragged
tails run a second, masked copy of the same loop body.

Weights (``WEIGHT``): 0 softmax, 1 silu, 2 gelu (tanh form), 3 relu, 4 relu², 5 identity.
Softmax runs in base 2 (``qk_scale = scale · log2 e``); ``lse`` is stored in natural log.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common.mx_triton import fp8_round_rne, scale_code

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
GELU_C0 = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)
GELU_C1 = tl.constexpr(0.035677408136300125)  # sqrt(2 / pi) * 0.044715


@triton.jit
def _mm(a, b, acc, DOT_PREC: tl.constexpr):
    """``a @ b (+ acc)`` in fp32. ``DOT_PREC``: "default" (16-bit inputs), "ieee" (fp32 inputs)
    or "upcast" (16-bit inputs under the interpreter, whose dot reads bf16 as raw integers)."""
    if DOT_PREC == "upcast":
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif DOT_PREC == "ieee":
        c = tl.dot(a, b, acc, input_precision="ieee")
    else:
        c = tl.dot(a, b, acc)
    return c


# ---- element-wise pieces ------------------------------------------------------------------------
@triton.jit
def _tanh(x, USE_ASM: tl.constexpr):
    """tanh; on the GPU one MUFU op (``tanh.approx.f32``, ~2^-11 relative error)."""
    if USE_ASM:
        y = tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        y = 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
    return y


@triton.jit
def _act(s, WEIGHT: tl.constexpr, USE_ASM: tl.constexpr):
    """act(s) for the activation weights (1..5)."""
    if WEIGHT == 1:  # silu(s) = s·σ(s) = s/2 · (1 + tanh(s/2))
        h = 0.5 * s
        a = h + h * _tanh(h, USE_ASM)
    elif WEIGHT == 2:  # gelu, tanh form
        h = 0.5 * s
        a = h + h * _tanh(s * (GELU_C0 + GELU_C1 * s * s), USE_ASM)
    elif WEIGHT == 3:
        a = tl.maximum(s, 0.0)
    elif WEIGHT == 4:
        r = tl.maximum(s, 0.0)
        a = r * r
    else:
        a = s
    return a


@triton.jit
def _act_grad(s, WEIGHT: tl.constexpr, USE_ASM: tl.constexpr):
    """(act(s), act'(s)) sharing the transcendental."""
    if WEIGHT == 1:
        h = 0.5 * s
        sig = 0.5 + 0.5 * _tanh(h, USE_ASM)
        a = s * sig
        da = sig + a * (1.0 - sig)
    elif WEIGHT == 2:
        s2 = s * s
        t = _tanh(s * (GELU_C0 + GELU_C1 * s2), USE_ASM)
        h = 0.5 * s
        a = h + h * t
        da = 0.5 + 0.5 * t + h * (1.0 - t * t) * (GELU_C0 + 3.0 * GELU_C1 * s2)
    elif WEIGHT == 3:
        a = tl.maximum(s, 0.0)
        da = tl.where(s > 0.0, 1.0, 0.0)
    elif WEIGHT == 4:
        r = tl.maximum(s, 0.0)
        a = r * r
        da = 2.0 * r
    else:
        a = s
        da = tl.full(s.shape, 1.0, tl.float32)
    return a, da


@triton.jit
def _mx_e4m3(p, AXIS: tl.constexpr):
    """``p`` MX-quantized (OCP MX v1.0, E4M3 elements, E8M0 scale rounded up so no element
    saturates) in blocks of the whole tile extent along ``AXIS`` (32: one block), then dequantized:
    the values ``kernels.mxfp8.reference.fake_quantize`` gives, in exact fp32 and integer
    arithmetic only (so the interpreter agrees with the GPU). GDPA's un-normalised weights P are
    quantized so, per 32 keys of one query row, before P·V (``kernels.mxfp8.gdpa``)."""
    amax = tl.max(tl.abs(p), axis=AXIS)
    _, e, inv = scale_code(amax.to(tl.int32, bitcast=True), 8)  # e4m3: max 448 = 1.75·2^8
    scl = tl.where(e == -127, 5.877471754111438e-39, ((127 + tl.maximum(e, -126)) << 23).to(tl.float32, bitcast=True))
    y = p * tl.expand_dims(inv, AXIS)  # |y| <= 448
    r = fp8_round_rne(tl.abs(y), 3, -6)  # e4m3: 3 mantissa bits, emin -6
    return tl.where(y < 0, -r, r) * tl.expand_dims(scl, AXIS)


@triton.jit
def _pair_mask(offs_q, offs_k, q_len, k_len, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr):
    """Which (query, key) pairs of a tile attend: ``offs_q [M, 1]``, ``offs_k [1, N]`` (any
    broadcastable orientation), positions counted from the sample's start."""
    mask = (offs_q < q_len) & (offs_k < k_len)
    if CAUSAL:
        mask = mask & (offs_k <= offs_q)
    if BLOCK_W > 0:
        mask = mask & ((offs_k // BLOCK_W) == (offs_q // BLOCK_W))
    return mask


@triton.jit(do_not_specialize=["n_items", "n_samples", "n_search"])
def _plan_kernel(PLAN, ends, order, ntiles, own_off, other_off, n_items, n_samples, n_search,
                 REVERSE: tl.constexpr, BLOCK: tl.constexpr):
    """One record of 8 int32 per work item: (own start, own length, other start, other length,
    tile index, 0, 0, 0); tile index -1 past the last item. ``ends`` is the cumulative tile count
    of the samples in longest-first ``order``; the item's rank is found by binary search."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    hi = tl.zeros([BLOCK], dtype=tl.int32) + n_samples
    for _ in range(n_search):  # smallest rank r with ends[r] > i
        mid = (lo + hi) // 2
        active = lo < hi
        go_right = tl.load(ends + mid, mask=active, other=0) <= i
        lo = tl.where(active & go_right, mid + 1, lo)
        hi = tl.where(active & ~go_right, mid, hi)
    valid = lo < n_samples
    r = tl.where(valid, lo, 0)
    b = tl.load(order + r).to(tl.int32)
    nt = tl.load(ntiles + r).to(tl.int32)
    t = i - (tl.load(ends + r).to(tl.int32) - nt)
    if REVERSE:
        t = nt - 1 - t
    own_start = tl.load(own_off + b)
    other_start = tl.load(other_off + b)
    rec = PLAN + i.to(tl.int64) * 8
    ok = i < n_items
    tl.store(rec + 0, own_start.to(tl.int32), mask=ok)
    tl.store(rec + 1, (tl.load(own_off + b + 1) - own_start).to(tl.int32), mask=ok)
    tl.store(rec + 2, other_start.to(tl.int32), mask=ok)
    tl.store(rec + 3, (tl.load(other_off + b + 1) - other_start).to(tl.int32), mask=ok)
    tl.store(rec + 4, tl.where(valid, t, -1), mask=ok)


@triton.jit
def _item(PLAN, pid):
    """(own start [int64], own length, other start [int64], other length, tile) of item pid."""
    rec = PLAN + pid.to(tl.int64) * 8
    return (tl.load(rec + 0).to(tl.int64), tl.load(rec + 1), tl.load(rec + 2).to(tl.int64),
            tl.load(rec + 3), tl.load(rec + 4))


@triton.jit
def _kv_range(m0, q_len, k_len, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr,
              ALIGNED: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Key tiles of the query tile ``[m0, m0+BM)``: ``[lo, full_hi)`` need no mask,
    ``[full_hi, hi)`` do (step ``BN``)."""
    lo = m0 * 0
    hi = k_len
    lim = k_len
    if BLOCK_W > 0:
        lo = (m0 // BLOCK_W) * BLOCK_W
        hi = tl.minimum(hi, ((m0 + BM - 1) // BLOCK_W + 1) * BLOCK_W)
        lim = tl.minimum(lim, lo + BLOCK_W)
    if CAUSAL:
        hi = tl.minimum(hi, m0 + BM)
        lim = tl.minimum(lim, m0 + 1)
    if BLOCK_W > 0 and not ALIGNED:
        full_hi = lo
    else:
        full_hi = lo + (tl.maximum(lim - lo, 0) // BN) * BN
    return lo, full_hi, hi


@triton.jit
def _q_range(n0, q_len, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr,
             ALIGNED: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    """Query tiles (step ``BM``) of the key tile ``[n0, n0+BN)``: ``[lo, full_lo)`` and
    ``[full_hi, hi)`` need masks, ``[full_lo, full_hi)`` do not."""
    lo = n0 * 0
    hi = q_len
    lim = q_len
    if BLOCK_W > 0:
        lo = (n0 // BLOCK_W) * BLOCK_W
        hi = tl.minimum(hi, ((n0 + BN - 1) // BLOCK_W + 1) * BLOCK_W)
        lim = tl.minimum(lim, lo + BLOCK_W)
    full_lo = lo
    if CAUSAL:  # rows >= n0 only; a tile needs no mask once its first row >= n0 + BN - 1
        lo = lo + (tl.maximum(n0 - lo, 0) // BM) * BM
        full_lo = lo + ((tl.maximum(n0 + BN - 1 - lo, 0) + BM - 1) // BM) * BM
    if BLOCK_W > 0 and not ALIGNED:
        full_lo = hi
    full_lo = tl.minimum(full_lo, hi)
    full_hi = full_lo + (tl.maximum(lim - full_lo, 0) // BM) * BM
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    return lo, full_lo, full_hi, hi


# ---- forward ------------------------------------------------------------------------------------
@triton.jit
def _fwd_weights(s, acc, l_i, m_i, offs_m, offs_n, q_len, k_len, qk_scale, scale,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr,
                 WEIGHT: tl.constexpr, USE_ASM: tl.constexpr, QUANT_P: tl.constexpr):
    """The weights P of one score tile ``s [BM, BN]`` and the running state: softmax rescales
    ``acc`` and updates ``l_i``, ``m_i`` (online, base 2); activations give ``act(s)·scale``."""
    if MASKED:
        mask = _pair_mask(offs_m[:, None], offs_n[None, :], q_len, k_len, CAUSAL, BLOCK_W)
    if WEIGHT == 0:
        if MASKED:
            s = tl.where(mask, s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_use[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_use = m_new
            p = tl.exp2(s * qk_scale - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_new
    else:
        p = _act(s, WEIGHT, USE_ASM) * scale
        if MASKED:
            p = tl.where(mask, p, 0.0)
        if QUANT_P:  # MXFP8 P·V: P per 32 keys of a row (BN == 32, tiles start at the sample's keys)
            p = _mx_e4m3(p, 1)
    return p, acc, l_i, m_i


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_ptr, v_ptr, stride_k, stride_v, offs_m, offs_d, lo, hi,
               q_len, k_len, qk_scale, scale,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr,
               WEIGHT: tl.constexpr, USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr,
               BN: tl.constexpr, QUANT_P: tl.constexpr = False):
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        if MASKED:
            k_ok = (offs_n < k_len)[:, None]
            k = tl.load(k_ptr + offs_n[:, None] * stride_k + offs_d[None, :], mask=k_ok, other=0.0)
        else:
            k = tl.load(k_ptr + offs_n[:, None] * stride_k + offs_d[None, :])
        s = _mm(q, tl.trans(k), None, DOT_PREC)
        p, acc, l_i, m_i = _fwd_weights(s, acc, l_i, m_i, offs_m, offs_n, q_len, k_len, qk_scale, scale, MASKED,
                                        CAUSAL, BLOCK_W, WEIGHT, USE_ASM, QUANT_P)
        if MASKED:
            v = tl.load(v_ptr + offs_n[:, None] * stride_v + offs_d[None, :], mask=k_ok, other=0.0)
        else:
            v = tl.load(v_ptr + offs_n[:, None] * stride_v + offs_d[None, :])
        acc = _mm(p.to(v.dtype), v, acc, DOT_PREC)
    return acc, l_i, m_i


@triton.jit
def _fwd_store(acc, l_i, m_i, O, LSE, T_q, q_start, h, offs_m, offs_d, row_ok, stride_ot, stride_oh,
               WEIGHT: tl.constexpr):
    """The forward's epilogue: softmax normalises and stores lse; the rows of the sample are stored."""
    if WEIGHT == 0:
        empty = l_i == 0.0  # a row with no key: o = 0, lse = -inf
        l_safe = tl.where(empty, 1.0, l_i)
        acc = acc * (1.0 / l_safe)[:, None]
        lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
        tl.store(LSE + h.to(tl.int64) * T_q + q_start + offs_m, lse, mask=row_ok)
    o_ptr = O + q_start * stride_ot + h * stride_oh
    tl.store(o_ptr + offs_m[:, None] * stride_ot + offs_d[None, :], acc.to(O.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit(do_not_specialize=["T_q"])
def _fwd_kernel(
    Q, K, V, O, LSE,  # q [Tq, H, D], k/v [Tk, H, D], o like q, lse [H, Tq] fp32 (softmax)
    PLAN,  # work list over (sample, query tile): records of _plan_kernel
    T_q,  # rows of q (stride of one head in lse)
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    scale, qk_scale,  # scale; scale·log2 e
    WEIGHT: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr, ALIGNED: tl.constexpr,
    USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, QUANT_P: tl.constexpr = False,
):
    q_start, q_len, k_start, k_len, t = _item(PLAN, tl.program_id(0))
    if t < 0:
        return
    h = tl.program_id(1)
    m0 = t * BM
    offs_m = m0 + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < q_len
    q_ptr = Q + q_start * stride_qt + h * stride_qh
    q = tl.load(q_ptr + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None],
                other=0.0)
    k_ptr = K + k_start * stride_kt + h * stride_kh
    v_ptr = V + k_start * stride_vt + h * stride_vh

    acc = tl.zeros([BM, D], dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    lo, full_hi, hi = _kv_range(m0, q_len, k_len, CAUSAL, BLOCK_W, ALIGNED, BM, BN)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptr, v_ptr, stride_kt, stride_vt, offs_m,
                               offs_d, lo, full_hi, q_len, k_len, qk_scale, scale, False, CAUSAL,
                               BLOCK_W, WEIGHT, USE_ASM, DOT_PREC, BN, QUANT_P)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptr, v_ptr, stride_kt, stride_vt, offs_m,
                               offs_d, full_hi, hi, q_len, k_len, qk_scale, scale, True, CAUSAL,
                               BLOCK_W, WEIGHT, USE_ASM, DOT_PREC, BN, QUANT_P)
    _fwd_store(acc, l_i, m_i, O, LSE, T_q, q_start, h, offs_m, offs_d, row_ok, stride_ot, stride_oh, WEIGHT)


# ---- backward -----------------------------------------------------------------------------------
@triton.jit
def _delta_kernel(O, DO, DELTA, T_q, stride_ot, stride_oh, stride_dot, stride_doh,
                  BR: tl.constexpr, D: tl.constexpr):
    """delta[h, t] = Σ_d dO[t, h, d] · O[t, h, d] (softmax backward)."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    h = tl.program_id(1)
    offs_d = tl.arange(0, D)
    ok = (rows < T_q)[:, None]
    rows64 = rows.to(tl.int64)
    o = tl.load(O + rows64[:, None] * stride_ot + h * stride_oh + offs_d[None, :], mask=ok,
                other=0.0)
    do = tl.load(DO + rows64[:, None] * stride_dot + h * stride_doh + offs_d[None, :], mask=ok,
                 other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + h.to(tl.int64) * T_q + rows64, delta, mask=rows < T_q)


@triton.jit
def _dkdv_weights(s_t, dp_t, lse_ptr, delta_ptr, offs_m, offs_n, q_len, k_len, qk_scale, scale,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr, WEIGHT: tl.constexpr,
                  USE_ASM: tl.constexpr, QUANT_P: tl.constexpr):
    """``(Pᵀ, dSᵀ)`` of one transposed score tile ``s_t [BN, BM]`` (keys are rows) and its
    ``dp_t = V dOᵀ``; softmax reads the query rows' lse and delta."""
    if MASKED:
        q_ok = offs_m < q_len
        mask = _pair_mask(offs_m[None, :], offs_n[:, None], q_len, k_len, CAUSAL, BLOCK_W)
    if WEIGHT == 0:
        if MASKED:
            lse2 = tl.load(lse_ptr + offs_m, mask=q_ok, other=0.0) * LOG2E
            delta = tl.load(delta_ptr + offs_m, mask=q_ok, other=0.0)
        else:
            lse2 = tl.load(lse_ptr + offs_m) * LOG2E
            delta = tl.load(delta_ptr + offs_m)
        p_t = tl.exp2(s_t * qk_scale - lse2[None, :])
        if MASKED:
            p_t = tl.where(mask, p_t, 0.0)
        ds_t = p_t * (dp_t - delta[None, :])
    else:
        a, da = _act_grad(s_t, WEIGHT, USE_ASM)
        p_t = a * scale
        ds_t = dp_t * da * scale
        if MASKED:
            p_t = tl.where(mask, p_t, 0.0)
            ds_t = tl.where(mask, ds_t, 0.0)
        if QUANT_P:  # dV = Pᵀ dO with the forward's quantized P (one block: a column of 32 keys)
            p_t = _mx_e4m3(p_t, 0)
    return p_t, ds_t


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, stride_q, stride_do,
                stride_dq, offs_n, offs_d, lo, hi, q_len, k_len, qk_scale, scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr,
                WEIGHT: tl.constexpr, USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr,
                ATOMIC_DQ: tl.constexpr, BM: tl.constexpr, QUANT_P: tl.constexpr = False):
    """Accumulate dK, dV of one key tile over the query tiles ``[lo, hi)`` (transposed scores
    ``[BN, BM]``); with ``ATOMIC_DQ`` also add this tile's share of dQ."""
    for m0 in range(lo, hi, BM):
        offs_m = m0 + tl.arange(0, BM)
        if MASKED:
            q_ok = offs_m < q_len
            q = tl.load(q_ptr + offs_m[:, None] * stride_q + offs_d[None, :], mask=q_ok[:, None],
                        other=0.0)
            do = tl.load(do_ptr + offs_m[:, None] * stride_do + offs_d[None, :],
                         mask=q_ok[:, None], other=0.0)
        else:
            q = tl.load(q_ptr + offs_m[:, None] * stride_q + offs_d[None, :])
            do = tl.load(do_ptr + offs_m[:, None] * stride_do + offs_d[None, :])
        s_t = _mm(k, tl.trans(q), None, DOT_PREC)  # [BN, BM]
        dp_t = _mm(v, tl.trans(do), None, DOT_PREC)
        p_t, ds_t = _dkdv_weights(s_t, dp_t, lse_ptr, delta_ptr, offs_m, offs_n, q_len, k_len, qk_scale, scale,
                                  MASKED, CAUSAL, BLOCK_W, WEIGHT, USE_ASM, QUANT_P)
        dv = _mm(p_t.to(do.dtype), do, dv, DOT_PREC)
        if ATOMIC_DQ:  # keys past the sample's end must not add (their k rows are 0 but ds may not be finite)
            ds_t = tl.where((offs_n < k_len)[:, None], ds_t, 0.0)
        ds_c = ds_t.to(q.dtype)
        dk = _mm(ds_c, q, dk, DOT_PREC)
        if ATOMIC_DQ:
            dq = _mm(tl.trans(ds_c), k, None, DOT_PREC)
            if WEIGHT == 0:
                dq = dq * scale
            dq_ptrs = dq_ptr + offs_m[:, None] * stride_dq + offs_d[None, :]
            if MASKED:
                tl.atomic_add(dq_ptrs, dq, mask=q_ok[:, None], sem="relaxed")
            else:
                tl.atomic_add(dq_ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=["T_q"])
def _dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ,  # DQ: fp32 accumulator (ATOMIC_DQ only)
    PLAN, T_q,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt, stride_dqh,
    scale, qk_scale,
    WEIGHT: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr, ALIGNED: tl.constexpr,
    USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    BN: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, QUANT_P: tl.constexpr = False,
):
    """dK, dV of one (sample, key tile, head); the work list is over key tiles."""
    k_start, k_len, q_start, q_len, t = _item(PLAN, tl.program_id(0))
    if t < 0:
        return
    h = tl.program_id(1)
    n0 = t * BN
    offs_n = n0 + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    k_ok = (offs_n < k_len)[:, None]
    k = tl.load(K + k_start * stride_kt + h * stride_kh + offs_n[:, None] * stride_kt
                + offs_d[None, :], mask=k_ok, other=0.0)
    v = tl.load(V + k_start * stride_vt + h * stride_vh + offs_n[:, None] * stride_vt
                + offs_d[None, :], mask=k_ok, other=0.0)
    q_ptr = Q + q_start * stride_qt + h * stride_qh
    do_ptr = DO + q_start * stride_dot + h * stride_doh
    dq_ptr = DQ + q_start * stride_dqt + h * stride_dqh
    lse_ptr = LSE + h.to(tl.int64) * T_q + q_start
    delta_ptr = DELTA + h.to(tl.int64) * T_q + q_start

    dk = tl.zeros([BN, D], dtype=tl.float32)
    dv = tl.zeros([BN, D], dtype=tl.float32)
    lo, full_lo, full_hi, hi = _q_range(n0, q_len, CAUSAL, BLOCK_W, ALIGNED, BN, BM)
    dk, dv = _dkdv_inner(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, stride_qt,
                         stride_dot, stride_dqt, offs_n, offs_d, lo, full_lo, q_len, k_len,
                         qk_scale, scale, True, CAUSAL, BLOCK_W, WEIGHT, USE_ASM, DOT_PREC,
                         ATOMIC_DQ, BM, QUANT_P)
    dk, dv = _dkdv_inner(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, stride_qt,
                         stride_dot, stride_dqt, offs_n, offs_d, full_lo, full_hi, q_len, k_len,
                         qk_scale, scale, False, CAUSAL, BLOCK_W, WEIGHT, USE_ASM, DOT_PREC,
                         ATOMIC_DQ, BM, QUANT_P)
    dk, dv = _dkdv_inner(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, stride_qt,
                         stride_dot, stride_dqt, offs_n, offs_d, full_hi, hi, q_len, k_len,
                         qk_scale, scale, True, CAUSAL, BLOCK_W, WEIGHT, USE_ASM, DOT_PREC,
                         ATOMIC_DQ, BM, QUANT_P)
    if WEIGHT == 0:
        dk = dk * scale
    tl.store(DK + k_start * stride_dkt + h * stride_dkh + offs_n[:, None] * stride_dkt
             + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=k_ok)
    tl.store(DV + k_start * stride_dvt + h * stride_dvh + offs_n[:, None] * stride_dvt
             + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=k_ok)


@triton.jit
def _dq_weights(s, dp, lse2, delta, offs_m, offs_n, q_len, k_len, qk_scale, scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr, WEIGHT: tl.constexpr,
                USE_ASM: tl.constexpr):
    """dS of one score tile ``s [BM, BN]`` (queries are rows) and its ``dp = dO Vᵀ``."""
    if WEIGHT == 0:
        p = tl.exp2(s * qk_scale - lse2[:, None])
        ds = p * (dp - delta[:, None])
    else:
        a, da = _act_grad(s, WEIGHT, USE_ASM)
        ds = dp * da * scale
    if MASKED:
        mask = _pair_mask(offs_m[:, None], offs_n[None, :], q_len, k_len, CAUSAL, BLOCK_W)
        ds = tl.where(mask, ds, 0.0)
    return ds


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, k_ptr, v_ptr, stride_k, stride_v, offs_m, offs_d, lo, hi,
              q_len, k_len, qk_scale, scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr,
              WEIGHT: tl.constexpr, USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr,
              BN: tl.constexpr):
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        if MASKED:
            k_ok = (offs_n < k_len)[:, None]
            k = tl.load(k_ptr + offs_n[:, None] * stride_k + offs_d[None, :], mask=k_ok, other=0.0)
            v = tl.load(v_ptr + offs_n[:, None] * stride_v + offs_d[None, :], mask=k_ok, other=0.0)
        else:
            k = tl.load(k_ptr + offs_n[:, None] * stride_k + offs_d[None, :])
            v = tl.load(v_ptr + offs_n[:, None] * stride_v + offs_d[None, :])
        s = _mm(q, tl.trans(k), None, DOT_PREC)
        dp = _mm(do, tl.trans(v), None, DOT_PREC)
        ds = _dq_weights(s, dp, lse2, delta, offs_m, offs_n, q_len, k_len, qk_scale, scale, MASKED, CAUSAL, BLOCK_W,
                         WEIGHT, USE_ASM)
        dq = _mm(ds.to(k.dtype), k, dq, DOT_PREC)
    return dq


@triton.jit(do_not_specialize=["T_q"])
def _dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    PLAN, T_q,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dqt, stride_dqh,
    scale, qk_scale,
    WEIGHT: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_W: tl.constexpr, ALIGNED: tl.constexpr,
    USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
):
    """dQ of one (sample, query tile, head); the work list is the forward's."""
    q_start, q_len, k_start, k_len, t = _item(PLAN, tl.program_id(0))
    if t < 0:
        return
    h = tl.program_id(1)
    m0 = t * BM
    offs_m = m0 + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < q_len
    q = tl.load(Q + q_start * stride_qt + h * stride_qh + offs_m[:, None] * stride_qt
                + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + q_start * stride_dot + h * stride_doh + offs_m[:, None] * stride_dot
                 + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    if WEIGHT == 0:
        lse2 = tl.load(LSE + h.to(tl.int64) * T_q + q_start + offs_m, mask=row_ok,
                       other=0.0) * LOG2E
        delta = tl.load(DELTA + h.to(tl.int64) * T_q + q_start + offs_m, mask=row_ok, other=0.0)
    else:
        lse2 = tl.zeros([BM], dtype=tl.float32)
        delta = lse2
    k_ptr = K + k_start * stride_kt + h * stride_kh
    v_ptr = V + k_start * stride_vt + h * stride_vh

    dq = tl.zeros([BM, D], dtype=tl.float32)
    lo, full_hi, hi = _kv_range(m0, q_len, k_len, CAUSAL, BLOCK_W, ALIGNED, BM, BN)
    dq = _dq_inner(dq, q, do, lse2, delta, k_ptr, v_ptr, stride_kt, stride_vt, offs_m, offs_d,
                   lo, full_hi, q_len, k_len, qk_scale, scale, False, CAUSAL, BLOCK_W, WEIGHT,
                   USE_ASM, DOT_PREC, BN)
    dq = _dq_inner(dq, q, do, lse2, delta, k_ptr, v_ptr, stride_kt, stride_vt, offs_m, offs_d,
                   full_hi, hi, q_len, k_len, qk_scale, scale, True, CAUSAL, BLOCK_W, WEIGHT,
                   USE_ASM, DOT_PREC, BN)
    if WEIGHT == 0:
        dq = dq * scale
    tl.store(DQ + q_start * stride_dqt + h * stride_dqh + offs_m[:, None] * stride_dqt
             + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _rows(ptr, start, h, stride_t, stride_h, offs, offs_d, ok):
    """Rows ``start + offs`` of head ``h`` of a ``[T, H, D]`` tensor (``ok``: which to read)."""
    return tl.load(ptr + start * stride_t + h * stride_h + offs[:, None] * stride_t + offs_d[None, :],
                   mask=ok[:, None], other=0.0)


@triton.jit
def _store_rows(ptr, start, h, stride_t, stride_h, offs, offs_d, x, ok):
    tl.store(ptr + start * stride_t + h * stride_h + offs[:, None] * stride_t + offs_d[None, :],
             x.to(ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _p_ds(sc, dp, mask, lse2, delta, qk_scale, scale, ROW_DELTA: tl.constexpr, WEIGHT: tl.constexpr,
          USE_ASM: tl.constexpr):
    """``(P, dS)`` of a score tile ``[rows, cols]`` (rows are queries), zero outside ``mask``.
    Softmax: ``ROW_DELTA`` takes delta as ``Σ_j P_ij dP_ij`` over the tile's columns (every key of
    the row is in the tile), else the given ``delta``."""
    if WEIGHT == 0:
        p = tl.where(mask, tl.exp2(sc * qk_scale - lse2[:, None]), 0.0)
        if ROW_DELTA:
            delta = tl.sum(p * dp, axis=1)
        ds = p * (dp - delta[:, None])
    else:
        a, da = _act_grad(sc, WEIGHT, USE_ASM)
        p = tl.where(mask, a * scale, 0.0)
        ds = tl.where(mask, dp * da * scale, 0.0)
    return p, ds


@triton.jit(do_not_specialize=["T_q"])
def _short_bwd_kernel(
    Q, K, V, DO, O, LSE, DQ, DK, DV,
    PLAN, T_q,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_ot, stride_oh, stride_dqt, stride_dqh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    scale, qk_scale,
    WEIGHT: tl.constexpr, USE_ASM: tl.constexpr, DOT_PREC: tl.constexpr, LONG_Q: tl.constexpr,
    BL: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
):
    """dQ, dK and dV of one (sample, head) of a cross attention (no causal or block mask) whose
    short side has at most ``S`` rows a sample: the keys with ``LONG_Q``, else the queries. The
    short side's rows stay in registers while the program walks the long side in tiles of ``BL``
    rows, so every long-side row is read once and its gradient written once, in one launch (the
    two-kernel path reads the long side twice, and softmax reads O and dO once more for delta).

    With ``LONG_Q`` a tile holds whole score rows (all of the sample's keys), so softmax's
    ``delta = rowsum(dO ∘ O)`` is computed from the tile as ``Σ_j P_ij dP_ij`` (equal, since O's
    row is ``Σ_j P_ij V_j``) and O is not read; dK and dV accumulate in registers. Otherwise the
    few query rows' delta comes from O and dO once, and dQ accumulates in registers. The work
    list has one item per sample with a non-empty long side (``_work`` with the tile as long as
    the longest sample); the launcher zeroes the short side's gradient first, for the samples
    with none."""
    l_start, l_len, s_start, s_len, t = _item(PLAN, tl.program_id(0))
    if t < 0:
        return
    h = tl.program_id(1)
    offs_s = tl.arange(0, S)
    offs_d = tl.arange(0, D)
    s_ok = offs_s < s_len
    g = 1.0 if WEIGHT != 0 else scale  # softmax's dS carries no scale; dQ and dK take it here
    if LONG_Q:  # short side: the keys
        k = _rows(K, s_start, h, stride_kt, stride_kh, offs_s, offs_d, s_ok)
        v = _rows(V, s_start, h, stride_vt, stride_vh, offs_s, offs_d, s_ok)
        dk = tl.zeros([S, D], dtype=tl.float32)
        dv = tl.zeros([S, D], dtype=tl.float32)
        for m0 in range(0, l_len, BL):
            offs_m = m0 + tl.arange(0, BL)
            m_ok = offs_m < l_len
            q = _rows(Q, l_start, h, stride_qt, stride_qh, offs_m, offs_d, m_ok)
            do = _rows(DO, l_start, h, stride_dot, stride_doh, offs_m, offs_d, m_ok)
            lse2 = offs_m * 0.0
            if WEIGHT == 0:
                lse2 = tl.load(LSE + h.to(tl.int64) * T_q + l_start + offs_m, mask=m_ok, other=0.0) * LOG2E
            p, ds = _p_ds(_mm(q, tl.trans(k), None, DOT_PREC), _mm(do, tl.trans(v), None, DOT_PREC),
                          m_ok[:, None] & s_ok[None, :], lse2, lse2, qk_scale, scale, True, WEIGHT, USE_ASM)
            ds_c = ds.to(q.dtype)
            _store_rows(DQ, l_start, h, stride_dqt, stride_dqh, offs_m, offs_d, _mm(ds_c, k, None, DOT_PREC) * g,
                        m_ok)
            dv = _mm(tl.trans(p.to(do.dtype)), do, dv, DOT_PREC)
            dk = _mm(tl.trans(ds_c), q, dk, DOT_PREC)
        _store_rows(DK, s_start, h, stride_dkt, stride_dkh, offs_s, offs_d, dk * g, s_ok)
        _store_rows(DV, s_start, h, stride_dvt, stride_dvh, offs_s, offs_d, dv, s_ok)
    else:  # short side: the queries
        q = _rows(Q, s_start, h, stride_qt, stride_qh, offs_s, offs_d, s_ok)
        do = _rows(DO, s_start, h, stride_dot, stride_doh, offs_s, offs_d, s_ok)
        lse2 = offs_s * 0.0
        delta = lse2
        if WEIGHT == 0:
            lse2 = tl.load(LSE + h.to(tl.int64) * T_q + s_start + offs_s, mask=s_ok, other=0.0) * LOG2E
            o = _rows(O, s_start, h, stride_ot, stride_oh, offs_s, offs_d, s_ok)
            delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), axis=1)
        dq = tl.zeros([S, D], dtype=tl.float32)
        for n0 in range(0, l_len, BL):
            offs_n = n0 + tl.arange(0, BL)
            n_ok = offs_n < l_len
            k = _rows(K, l_start, h, stride_kt, stride_kh, offs_n, offs_d, n_ok)
            v = _rows(V, l_start, h, stride_vt, stride_vh, offs_n, offs_d, n_ok)
            p, ds = _p_ds(_mm(q, tl.trans(k), None, DOT_PREC), _mm(do, tl.trans(v), None, DOT_PREC),
                          s_ok[:, None] & n_ok[None, :], lse2, delta, qk_scale, scale, False, WEIGHT, USE_ASM)
            ds_c = ds.to(q.dtype)
            _store_rows(DV, l_start, h, stride_dvt, stride_dvh, offs_n, offs_d,
                        _mm(tl.trans(p.to(do.dtype)), do, None, DOT_PREC), n_ok)
            _store_rows(DK, l_start, h, stride_dkt, stride_dkh, offs_n, offs_d,
                        _mm(tl.trans(ds_c), q, None, DOT_PREC) * g, n_ok)
            dq = _mm(ds_c, k, dq, DOT_PREC)
        _store_rows(DQ, s_start, h, stride_dqt, stride_dqh, offs_s, offs_d, dq * g, s_ok)


@triton.jit
def _zero_outside_kernel(T_ptr, off_ptr, n_off, n_rows, stride_t, W: tl.constexpr, BR: tl.constexpr,
                         BW: tl.constexpr):
    """Zero the rows of ``T`` (``[n_rows, W]`` with row stride ``stride_t``) that belong to no
    sample: before ``off[0]`` or from ``off[n_off-1]`` on (padding rows of a static-shape batch).
    Programs whose rows all belong to samples return after two scalar loads."""
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    lo = tl.load(off_ptr).to(tl.int64)
    hi = tl.load(off_ptr + n_off - 1).to(tl.int64)
    m = (r < n_rows) & ((r < lo) | (r >= hi))
    if tl.max(m.to(tl.int32), axis=0) == 0:
        return
    for w0 in range(0, W, BW):
        w = w0 + tl.arange(0, BW)
        tl.store(T_ptr + r[:, None] * stride_t + w[None, :],
                 tl.zeros([BR, BW], dtype=T_ptr.dtype.element_ty), mask=m[:, None] & (w < W)[None, :])

