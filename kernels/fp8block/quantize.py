"""Triton blockwise-fp8 quantizer (rules in ``kernels/fp8block/__init__.py``), with the producer's
epilogue fused in.

``dual(x, ...)`` reads ``x [R, C]`` once, in ``[128, 128]`` tiles (one block of each
orientation), applies the epilogue in fp32 and writes what the Linear that consumes the tensor
needs:

- row-wise (``row``): ``q [R128, C]`` fp8 and its scales, 1×128 along the columns: the operand
  of a matmul contracting over C (the forward's activation, dgrad's output gradient);
- column-wise (``col``): the transpose ``qt [C, R128]`` and its scales, 1×128 along the rows: the
  operand of the weight gradient, which contracts over the tokens. The transpose goes through
  registers and shared memory in the same program, so no second read of ``x`` and no eager
  ``.t().contiguous()``;
- ``dbias``: the fp32 column sums of the epilogue's output (the bias gradient), as per-program
  partials summed by torch in a fixed order.

Epilogues: ``none``; ``bias_gelu`` (``a = gelu(x + b)``: ffn1's output becomes ffn2's input without
ever being written in bf16); ``bias_gelu_grad`` (``dH = dA · gelu'(h + b)``: the GELU backward of
ffn1, whose dH feeds ffn1's dgrad and wgrad); ``layer_norm`` (``(x - mean) · rstd · γ + β``, the
rows' statistics from ``ln_stats``: a pre-norm's output becomes the next Linear's input without
ever being written). Rows beyond ``R`` are written as zeros (``R128`` is
``R`` rounded up to 128): zero rows add nothing to a weight gradient.

Scales are stored outer-dim-major, as cuBLASLt's 1×128 recipe reads them: the row-wise ones as
``[C/128, R128]`` contiguous, returned as its transposed view ``[R128, C/128]`` (stride
``(1, R128)``), the column-wise ones as ``[R128/128, C]``, returned as ``[C, R128/128]``. On CPU
the kernel runs under ``TRITON_INTERPRET=1`` (with an integer fp8 cast, bit-exact), else
``reference.dual_ref`` runs.

Cost (``python -m kernels.fp8block.sass``: compiled for sm_90a, SASS instructions per element): the
GELU epilogues' reciprocal is ``rcp.approx`` on the GPU (``FAST_ERF=2``; ``div.full.f32`` cost ~8
instructions an element), the row amax one ``max.NaN`` of ``|y|``, and rows that fill whole tiles
carry no mask (``EVEN``): ~31 and ~38 instructions an element with the GELU forward and backward
(packed), under the bytes' time at the H200's issue rate (``NOTES.md``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.ffn.bias_gelu import _gelu, _gelu_grad, _runs_triton
from kernels.fp8block import BLOCK, E_MAX, E_MIN, padded
from kernels.fp8block.reference import EPILOGUES as _EPILOGUE_NAMES
from kernels.fp8block.reference import (
    FP8, Dual, _check, check_elem, check_epilogue, dual_ref, ln_stats_ref, quantize_weight_ref,
)
from kernels.mxfp8.quantize import _absmax4, _cast, _max_nan, _word4, elem_constexprs

EPILOGUES = {name: code for code, name in enumerate(_EPILOGUE_NAMES)}  # the kernels' EPILOGUE constexpr


@triton.jit
def _scales(y, AXIS: tl.constexpr, EMAX: tl.constexpr):
    """Per-block (bad, 2^e, 2^-e) of the fp32 tile ``y`` reduced along ``AXIS``."""
    return _code(tl.max(y.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=AXIS), EMAX)


@triton.jit
def _code(amax, EMAX: tl.constexpr):
    """(bad, 2^e, 2^-e) of the int32 bits of a block's amax (NaN/Inf: bits >= 0x7F800000)."""
    bad = amax >= 0x7F800000
    e = (amax >> 23) - 127 - EMAX + ((amax & 0x7FFFFF) > 0x600000).to(tl.int32)
    e = tl.minimum(tl.maximum(e, -126), 127)
    scale = ((e + 127) << 23).to(tl.float32, bitcast=True)
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
    return bad, tl.where(bad, float("nan"), scale), inv


@triton.jit
def _dual_kernel(x_ptr, h_ptr, b_ptr, g_ptr, mu_ptr, rs_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, db_ptr,
                 R, C, R128, s_xr, s_hr,
                 EPILOGUE: tl.constexpr, ROW: tl.constexpr, COL: tl.constexpr, DBIAS: tl.constexpr,
                 TILE: tl.constexpr, FAST_ERF: tl.constexpr,
                 EMAX: tl.constexpr, E5M2: tl.constexpr, SOFT_CAST: tl.constexpr,
                 MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr, SUB_UP: tl.constexpr,
                 BR: tl.constexpr, BC: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    r = pid_r * BR + tl.arange(0, BR)
    c = pid_c * BC + tl.arange(0, BC)
    b = tl.load(b_ptr + c).to(tl.float32) if EPILOGUE != 0 else 0.0
    gam = tl.load(g_ptr + c).to(tl.float32) if EPILOGUE == 3 else 0.0
    y = _slice(x_ptr, h_ptr, b, gam, mu_ptr, rs_ptr, r, c, R, s_xr, s_hr, EPILOGUE, FAST_ERF)
    if DBIAS:
        tl.store(db_ptr + pid_r.to(tl.int64) * C + c, tl.sum(y, axis=0))
    if TILE:  # a weight: one 128×128 block, both orientations with its one scale
        bad, scale, inv = _scales(tl.reshape(y, (1, BR * BC)), 1, EMAX)
        q = _cast(y * inv, E5M2, SOFT_CAST, MBITS, EMIN, BIAS, SUB_UP)
        q = tl.where(bad, 0x7F, q).to(tl.uint8)
        tl.store(q_ptr + r[:, None].to(tl.int64) * C + c[None, :], q)
        tl.store(qt_ptr + c[:, None].to(tl.int64) * R128 + r[None, :], tl.trans(q))
        tl.store(s_ptr + pid_r * tl.num_programs(1) + pid_c + tl.arange(0, 1), scale)
    elif ROW:  # blocks along the columns: one per row of the tile
        _row_blocks(y, r, c, pid_c, q_ptr, s_ptr, C, R128, EMAX, E5M2, SOFT_CAST, MBITS, EMIN, BIAS, SUB_UP,
                    False, 0)
    if COL and not TILE:  # blocks along the rows: one per column of the tile, stored transposed
        bad, scale, inv = _scales(y, 0, EMAX)
        q = _cast(y * inv[None, :], E5M2, SOFT_CAST, MBITS, EMIN, BIAS, SUB_UP)
        q = tl.where(bad[None, :], 0x7F, q).to(tl.uint8)
        tl.store(qt_ptr + c[:, None].to(tl.int64) * R128 + r[None, :], tl.trans(q))
        tl.store(st_ptr + pid_r.to(tl.int64) * C + c, scale)


@triton.jit
def _slice(x_ptr, h_ptr, b, gam, mu_ptr, rs_ptr, rows, c, R, s_xr, s_hr, EPILOGUE: tl.constexpr,
           FAST_ERF: tl.constexpr, EVEN: tl.constexpr = False):
    """Rows ``rows`` (any) × columns ``c`` of ``x`` after the epilogue, fp32, zero past ``R``
    (``EVEN``: ``R`` a multiple of 128, no row past it, no mask). ``layer_norm``: ``b`` and ``gam``
    are the columns' shift and gain, ``mu_ptr`` / ``rs_ptr`` the rows' fp32 mean and 1/std."""
    m = None if EVEN else (rows < R)[:, None]
    zero = None if EVEN else 0.0
    y = tl.load(x_ptr + rows[:, None].to(tl.int64) * s_xr + c[None, :], mask=m, other=zero).to(tl.float32)
    if EPILOGUE == 1:
        y = _gelu(y + b[None, :], FAST_ERF)
    elif EPILOGUE == 2:
        h = tl.load(h_ptr + rows[:, None].to(tl.int64) * s_hr + c[None, :], mask=m, other=zero).to(tl.float32)
        y = y * _gelu_grad(h + b[None, :], FAST_ERF)
    elif EPILOGUE == 3:
        rm = None if EVEN else rows < R
        mu = tl.load(mu_ptr + rows, mask=rm, other=zero)
        rs = tl.load(rs_ptr + rows, mask=rm, other=zero)
        y = (y - mu[:, None]) * rs[:, None] * gam[None, :] + b[None, :]
    return y if EVEN else tl.where(m, y, 0.0)


@triton.jit
def _row_blocks(y, rows, c, pid_c, q_ptr, s_ptr, C, R128, EMAX: tl.constexpr, E5M2: tl.constexpr,
                SOFT_CAST: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                SUB_UP: tl.constexpr, PACK: tl.constexpr, CAST: tl.constexpr):
    """Row-wise blocks of the ``[NR, 128]`` slice ``y``: fp8 and the scales. ``PACK``: the 4
    elements of each group of 4 columns split in registers, cast 2 at a time and stored as one
    int32 (``q_ptr`` then the output as int32 ``[R128, C/4]``), as ``kernels.mxfp8``'s rows4."""
    if SOFT_CAST:  # the interpreter: its tl.reduce with a combine function loops in Python (10x slower)
        bad, scale, inv = _scales(y, 1, EMAX)
    else:  # one max.NaN of |y| an element (NaN/Inf still wins), not an integer mask and max
        bad, scale, inv = _code(tl.reduce(tl.abs(y), 1, _max_nan).to(tl.int32, bitcast=True), EMAX)
    if PACK:
        NR: tl.constexpr = y.shape[0]
        ys = y * inv[:, None]
        y02, y13 = tl.split(tl.reshape(ys, (NR, 32, 2, 2)))
        y0, y2 = tl.split(y02)
        y1, y3 = tl.split(y13)
        w = _word4(y0, y1, y2, y3, bad[:, None], E5M2, CAST, MBITS, EMIN, BIAS, SUB_UP)
        t = tl.arange(0, 32)
        wo = pid_c * 32 + ((t // 2) * 2 + t % 2)
        tl.store(q_ptr + rows[:, None].to(tl.int64) * (C // 4) + wo[None, :], w)
    else:
        q = _cast(y * inv[:, None], E5M2, SOFT_CAST, MBITS, EMIN, BIAS, SUB_UP)
        q = tl.where(bad[:, None], 0x7F, q).to(tl.uint8)
        tl.store(q_ptr + rows[:, None].to(tl.int64) * C + c[None, :], q)
    tl.store(s_ptr + pid_c.to(tl.int64) * R128 + rows, scale)


@triton.jit
def _dual4_kernel(x_ptr, h_ptr, b_ptr, g_ptr, mu_ptr, rs_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, db_ptr,
                  R, C, R128, s_xr, s_hr,
                  EPILOGUE: tl.constexpr, ROW: tl.constexpr, COL: tl.constexpr, DBIAS: tl.constexpr,
                  FAST_ERF: tl.constexpr, CAST: tl.constexpr, PACK: tl.constexpr, EVEN: tl.constexpr,
                  EMAX: tl.constexpr, E5M2: tl.constexpr, SOFT_CAST: tl.constexpr,
                  MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr, SUB_UP: tl.constexpr):
    """``_dual_kernel`` over a [128, 128] tile loaded as 4 row slices (rows ``4m + i``), so each
    thread holds 4 consecutive rows of its columns: the column-wise blocks are cast 2 at a time and
    packed 4 to an int32 in registers (``_word4``), and the transpose moves words, not bytes
    (``qt_ptr``: the transposed output as int32 ``[C, R128/4]``). One program a tile: a program
    that walked 4 row tiles in a software-pipelined loop (cp.async loads) was slower on every
    epilogue (NOTES.md, seventh session)."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    m = pid_r * 32 + tl.arange(0, 32)  # word rows: rows 4m .. 4m+3
    c = pid_c * 128 + tl.arange(0, 128)
    r0 = 4 * m
    b = tl.load(b_ptr + c).to(tl.float32) if EPILOGUE != 0 else 0.0
    gam = tl.load(g_ptr + c).to(tl.float32) if EPILOGUE == 3 else 0.0
    y0 = _slice(x_ptr, h_ptr, b, gam, mu_ptr, rs_ptr, r0, c, R, s_xr, s_hr, EPILOGUE, FAST_ERF, EVEN)
    y1 = _slice(x_ptr, h_ptr, b, gam, mu_ptr, rs_ptr, r0 + 1, c, R, s_xr, s_hr, EPILOGUE, FAST_ERF, EVEN)
    y2 = _slice(x_ptr, h_ptr, b, gam, mu_ptr, rs_ptr, r0 + 2, c, R, s_xr, s_hr, EPILOGUE, FAST_ERF, EVEN)
    y3 = _slice(x_ptr, h_ptr, b, gam, mu_ptr, rs_ptr, r0 + 3, c, R, s_xr, s_hr, EPILOGUE, FAST_ERF, EVEN)
    if DBIAS:
        tl.store(db_ptr + pid_r.to(tl.int64) * C + c, tl.sum((y0 + y1) + (y2 + y3), axis=0))
    if ROW:
        _row_blocks(y0, r0, c, pid_c, q_ptr, s_ptr, C, R128, EMAX, E5M2, SOFT_CAST, MBITS, EMIN, BIAS, SUB_UP,
                    PACK, CAST)
        _row_blocks(y1, r0 + 1, c, pid_c, q_ptr, s_ptr, C, R128, EMAX, E5M2, SOFT_CAST, MBITS, EMIN, BIAS, SUB_UP,
                    PACK, CAST)
        _row_blocks(y2, r0 + 2, c, pid_c, q_ptr, s_ptr, C, R128, EMAX, E5M2, SOFT_CAST, MBITS, EMIN, BIAS, SUB_UP,
                    PACK, CAST)
        _row_blocks(y3, r0 + 3, c, pid_c, q_ptr, s_ptr, C, R128, EMAX, E5M2, SOFT_CAST, MBITS, EMIN, BIAS, SUB_UP,
                    PACK, CAST)
    if COL:
        amax = tl.max(_absmax4(y0, y1, y2, y3).to(tl.int32, bitcast=True), axis=0)  # [128]
        bad, scale, inv = _code(amax, EMAX)
        s = inv[None, :]
        w = _word4(y0 * s, y1 * s, y2 * s, y3 * s, bad[None, :], E5M2, CAST, MBITS, EMIN, BIAS, SUB_UP)
        tl.store(qt_ptr + c[:, None].to(tl.int64) * (R128 // 4) + m[None, :], tl.trans(w))
        tl.store(st_ptr + pid_r.to(tl.int64) * C + c, scale)


def runs_triton(x: Tensor) -> bool:
    """The kernels take ``x``: on CUDA, or on CPU under the interpreter (``kernels.ffn.bias_gelu``'s rule)."""
    return _runs_triton(x)


# How ``dual`` launches: "four" is ``_dual4_kernel`` (4 row slices, column-wise blocks packed into
# words before the transpose; "cast": the inline-PTX pair conversion, or Triton's); "tile" is
# ``_dual_kernel`` over [128, 128] tiles (bytes transposed); "split" is two ``_dual_kernel``s, the
# row-wise one over [rows, 128] tiles (with the bias gradient) and the column-wise one over
# [128, cols]: fewer elements per thread, at the price of reading the input (and computing the
# epilogue) twice.
CONFIGS = {
    "four_w4": dict(kind="four", num_warps=4),
    "four_w8": dict(kind="four", num_warps=8),
    "four_w8_tcast": dict(kind="four", num_warps=8, cast="triton"),
    "four_w16": dict(kind="four", num_warps=16),
    "four_w4_pack": dict(kind="four", num_warps=4, pack=True),
    "four_w8_pack": dict(kind="four", num_warps=8, pack=True),
    "four_w16_pack": dict(kind="four", num_warps=16, pack=True),
    # at most 80 registers a thread (ptxas spills a little): 3 programs of 8 warps per SM instead of 2
    "four_w8_r80": dict(kind="four", num_warps=8, maxnreg=80),
    "four_w8_pack_r80": dict(kind="four", num_warps=8, pack=True, maxnreg=80),
    "tile_w4": dict(kind="tile", num_warps=4),
    "tile_w8": dict(kind="tile", num_warps=8),
    "split_32": dict(kind="split", rows=32, cols=32, num_warps=4),
    "split_16_64": dict(kind="split", rows=16, cols=64, num_warps=4),
    "split_64_32_w8": dict(kind="split", rows=64, cols=32, num_warps=8),
}
# per epilogue, the fastest measured inside the MLP block (H200, python -m kernels.fp8block.bench: the
# packed row-wise stores, a little faster alone in "quantize_configs", made the block's quantizers 3.49 ->
# 4.24 ms: hwmodels/data/measured/fp8_block_h200_2026-12-04.json)
DEFAULT = {"none": "four_w4", "bias_gelu": "four_w8", "bias_gelu_grad": "four_w8",
           "layer_norm": "four_w4"}  # layer_norm: the fastest of 6 configs on an H100 (NOTES.md, sixth session)


def dual(x: Tensor, elem: str = "e4m3", *, row: bool = True, col: bool = True, epilogue: str = "none",
         bias: Tensor | None = None, h: Tensor | None = None, dbias: bool = False,
         gain: Tensor | None = None, stats: tuple[Tensor, Tensor] | None = None,
         config: str | None = None) -> Dual:
    """Quantize ``x [R, C]`` (row-major, ``C % 128 == 0``) for a Linear, after the epilogue
    (module docstring). The Triton kernel on CUDA or under the interpreter, else ``dual_ref``.
    ``layer_norm``: ``gain`` and ``bias`` are the norm's weight and bias, ``stats`` the rows' fp32
    ``(mean, rstd)`` (``ln_stats``). ``config``: a key of ``CONFIGS`` (default: ``DEFAULT[epilogue]``)."""
    check_elem(elem)
    _check(x)
    check_epilogue(x, epilogue, bias, h, gain, stats)
    if not runs_triton(x):
        return dual_ref(x, elem, row=row, col=col, epilogue=epilogue, bias=bias, h=h, dbias=dbias, gain=gain,
                        stats=stats)
    R, C = x.shape
    R128 = padded(R)
    dev = x.device
    if x.stride(1) != 1:
        x = x.contiguous()
    if h is not None and h.stride(1) != 1:
        h = h.contiguous()
    if not x.is_cuda:  # the interpreter widens 16-bit subnormals wrongly: give it fp32
        x, h, bias = x.float(), None if h is None else h.float(), None if bias is None else bias.float()
        gain = None if gain is None else gain.float()
    mu, rs = stats if stats is not None else (None, None)
    q = torch.empty((R128, C), dtype=FP8[elem], device=dev) if row else None
    s = torch.empty((C // BLOCK, R128), dtype=torch.float32, device=dev) if row else None
    qt = torch.empty((C, R128), dtype=FP8[elem], device=dev) if col else None
    st = torch.empty((R128 // BLOCK, C), dtype=torch.float32, device=dev) if col else None
    if config is not None and config not in CONFIGS:
        raise ValueError(f"fp8_block quantize config '{config}' is unknown; use one of {', '.join(CONFIGS)}")
    cfg = CONFIGS[config or DEFAULT[epilogue]]
    db_rows = cfg["rows"] if cfg["kind"] == "split" and row else BLOCK  # rows per partial sum
    db = torch.empty((R128 // db_rows, C), dtype=torch.float32, device=dev) if dbias else None
    dummy = torch.empty(1, dtype=torch.float32, device=dev)

    def launch(do_row: bool, do_col: bool, do_db: bool, br: int, bc: int, warps: int) -> None:
        _dual_kernel[(R128 // br, C // bc)](
            x, h if h is not None else x, bias if bias is not None else dummy, gain if gain is not None else dummy,
            mu if mu is not None else dummy, rs if rs is not None else dummy,
            q.view(torch.uint8) if do_row else dummy, s if do_row else dummy,
            qt.view(torch.uint8) if do_col else dummy, st if do_col else dummy, db if do_db else dummy,
            R, C, R128, x.stride(0), h.stride(0) if h is not None else 0,
            EPILOGUE=EPILOGUES[epilogue], ROW=do_row, COL=do_col, DBIAS=do_db, TILE=False, FAST_ERF=x.is_cuda,
            **elem_constexprs(elem), SOFT_CAST=not x.is_cuda, BR=br, BC=bc, num_warps=warps)

    if R128 and C:
        w = cfg["num_warps"]
        if cfg["kind"] == "four":
            _dual4_kernel[(R128 // BLOCK, C // BLOCK)](
                x, h if h is not None else x, bias if bias is not None else dummy,
                gain if gain is not None else dummy, mu if mu is not None else dummy, rs if rs is not None else dummy,
                q.view(torch.int32 if cfg.get("pack") else torch.uint8) if row else dummy, s if row else dummy,
                qt.view(torch.int32) if col else dummy, st if col else dummy, db if dbias else dummy,
                R, C, R128, x.stride(0), h.stride(0) if h is not None else 0,
                EPILOGUE=EPILOGUES[epilogue], ROW=row, COL=col, DBIAS=dbias, FAST_ERF=2 if x.is_cuda else 0,
                CAST=2 if not x.is_cuda else (1 if cfg.get("cast", "asm") == "asm" else 0), PACK=cfg.get("pack", False),
                EVEN=R == R128,
                **elem_constexprs(elem), SOFT_CAST=not x.is_cuda, num_warps=w,
                **({"maxnreg": cfg["maxnreg"]} if "maxnreg" in cfg else {}))
        elif cfg["kind"] == "tile" or not (row or col):
            launch(row, col, dbias, BLOCK, BLOCK, w)
        else:
            if row:
                launch(True, False, dbias, cfg["rows"], BLOCK, w)
            if col:
                launch(False, True, dbias and not row, BLOCK, cfg["cols"], w)
    return Dual(q, s.t() if row else None, qt, st.t() if col else None,
                db.sum(0) if dbias else None, R)


@triton.jit
def _ln_stats_kernel(x_ptr, mu_ptr, rs_ptr, R, C, s_xr, eps, BR: tl.constexpr, BC: tl.constexpr):
    """fp32 mean and 1/sqrt(var + eps) of ``BR`` rows of ``x``, two passes over ``BC``-column chunks
    (``C % BC == 0``): the mean, then the squared deviations from it, as the reference."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    rm = (r < R)[:, None]
    base = x_ptr + r[:, None].to(tl.int64) * s_xr + tl.arange(0, BC)[None, :]
    acc = tl.zeros((BR, BC), tl.float32)
    for c0 in range(0, C, BC):
        acc += tl.load(base + c0, mask=rm, other=0.0).to(tl.float32)
    mu = tl.sum(acc, axis=1) / C
    acc = tl.zeros((BR, BC), tl.float32)
    for c0 in range(0, C, BC):
        d = tl.where(rm, tl.load(base + c0, mask=rm, other=0.0).to(tl.float32) - mu[:, None], 0.0)
        acc += d * d
    rs = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / C + eps)
    tl.store(mu_ptr + r, mu, mask=r < R)
    tl.store(rs_ptr + r, rs, mask=r < R)


def ln_stats(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The LayerNorm statistics of the rows of ``x [R, C]`` (``C % 128 == 0``): fp32 ``(mean, rstd)``,
    ``rstd = 1/sqrt(var + eps)`` with the biased variance, as ``torch.nn.functional.layer_norm``. One
    read of ``x`` writing 8 bytes a row (the ``layer_norm`` epilogue of ``dual`` reads ``x`` again
    and never writes the normalized rows). Triton on CUDA or under the interpreter, else ``ln_stats_ref``."""
    _check(x)
    if not runs_triton(x):
        return ln_stats_ref(x, eps)
    if x.stride(1) != 1:
        x = x.contiguous()
    if not x.is_cuda:
        x = x.float()
    R, C = x.shape
    mu = torch.empty(R, dtype=torch.float32, device=x.device)
    rs = torch.empty(R, dtype=torch.float32, device=x.device)
    bc = next(b for b in (1024, 512, 256, 128) if C % b == 0)
    br = max(1, 4096 // bc)
    if R:
        _ln_stats_kernel[(triton.cdiv(R, br),)](x, mu, rs, R, C, x.stride(0), float(eps), BR=br, BC=bc, num_warps=4)
    return mu, rs


def weight(w: Tensor, elem: str = "e4m3", *, num_warps: int = 8) -> tuple[Tensor, Tensor, Tensor]:
    """A weight ``w [N, K]`` (both multiples of 128) in 128×128 tiles, both orientations from one
    read: ``(q [N, K], qt [K, N], scale [N/128, K/128])`` (``qt``'s scales are ``scale.t()``)."""
    check_elem(elem)
    N, K = w.shape
    if N % BLOCK or K % BLOCK:
        raise ValueError(f"fp8_block: a weight of shape {tuple(w.shape)} needs both dims multiples of {BLOCK}")
    if not runs_triton(w):
        q, s = quantize_weight_ref(w, elem)
        return q, q.t().contiguous(), s
    if w.stride(1) != 1:
        w = w.contiguous()
    if not w.is_cuda:
        w = w.float()
    q = torch.empty((N, K), dtype=FP8[elem], device=w.device)
    qt = torch.empty((K, N), dtype=FP8[elem], device=w.device)
    s = torch.empty((N // BLOCK, K // BLOCK), dtype=torch.float32, device=w.device)
    if N and K:
        _dual_kernel[(N // BLOCK, K // BLOCK)](
            w, w, s, s, s, s, q.view(torch.uint8), s, qt.view(torch.uint8), s, s, N, K, N, w.stride(0), 0,
            EPILOGUE=0, ROW=True, COL=True, DBIAS=False, TILE=True, FAST_ERF=False,
            **elem_constexprs(elem), SOFT_CAST=not w.is_cuda, BR=BLOCK, BC=BLOCK, num_warps=num_warps)
    return q, qt, s


assert (E_MIN, E_MAX) == (-126, 127)  # the kernel's clamp

__all__ = ["CONFIGS", "DEFAULT", "EPILOGUES", "dual", "ln_stats", "runs_triton", "weight"]
