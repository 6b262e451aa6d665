"""The Triton core of the jagged attention suite: ``attention_fwd`` and ``attention_bwd``.

Semantics and calling convention: ``kernels/ATTENTION.md``; design, tiles and measurements:
``NOTES.md`` beside this file. The four public ops (JFA, GDPA, BlockAttention, asymmetric
attention) call these two functions; dense sides reach them as jagged tensors with
``offsets = arange(B+1) * N``.

On CPU tensors the kernels run under Triton's interpreter, which must be switched on
(``TRITON_INTERPRET=1``) before this module is imported (``tests/conftest.py`` does it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import weakref
from dataclasses import dataclass
from typing import Iterator

import torch
import triton
from torch import Tensor

from kernels.flash import _block as KB
from kernels.flash import _kernels as K

WEIGHTS = {"softmax": 0, "silu": 1, "gelu": 2, "relu": 3, "relu2": 4, "identity": 5}
DTYPES = (torch.bfloat16, torch.float16, torch.float32)

#: Fill every output with NaN before the kernels run (tests set it: unwritten rows then show).
poison_outputs = False


# ---- tiles --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tiles:
    """One kernel's launch shape: rows of its own tile, rows of the tiles it loops over."""

    own: int  # BM of the forward / dQ kernel (query rows); BN of the dK/dV kernel (key rows)
    other: int  # the tiles the inner loop walks over
    warps: int
    stages: int


@dataclass(frozen=True)
class Config:
    fwd: Tiles
    dkdv: Tiles
    dq: Tiles
    atomic_dq: bool = False  # dQ by atomics inside the dK/dV kernel instead of its own kernel
    # cross attention with a short side (<= SHORT_SIDE rows a sample), no mask: one backward
    # kernel per (sample, head), the short side in registers, walking the long side in tiles of
    # ``fused_short.own`` rows (``_short_bwd``). sm_90 compile (compile_check): 223-228
    # registers, no spills, at 32 rows / 4 warps and 64 rows / 8 warps with long queries; 64 rows
    # / 4 warps spills. ``_SHORT_SIDE`` uses it (timed below)
    fused_short: Tiles | None = None


# Hand-picked for the H200 from the sweeps in NOTES.md (hwmodels/data/runs/h200-2026-11-30-flash/2026-11-30_v3_h200.json).
# Short inner loops (the other side's max length) want 64-row forward tiles, two or three
# programs per SM hiding each other's load latency; long ones want 128-row tiles. The backward
# keeps 128-key dK/dV tiles and 128-query dQ tiles at every length (every smaller variant measured
# slower). Head dim 64 shares D=128's shapes (not swept).
SHORT_NONCAUSAL, SHORT_CAUSAL = 512, 1024
_BWD = (Tiles(128, 64, 8, 3), Tiles(128, 64, 8, 3))  # dK/dV, dQ
_LONG = Config(Tiles(128, 64, 8, 3), *_BWD)
_SHORT_NONCAUSAL = Config(Tiles(64, 32, 4, 3), *_BWD)
_SHORT_CAUSAL = Config(Tiles(64, 64, 4, 3), *_BWD)
# Causal GDPA (activation weights) up to 1024 rows: 64-row tiles over 32-row inner tiles, 4 warps,
# everywhere. gem-h200-1gpu's layer (B=256, lengths 512-1024, H=4, D=128), kernels.flash.step_bench
# on the H200 (hwmodels/data/runs/h200-2026-11-30-executor/s9-step-bench.log): forward + backward
# 2.344 ms against 2.529 with _SHORT_CAUSAL (forward 0.567 / 0.607, backward 1.778 / 1.921).
_SHORT_CAUSAL_ACT = Config(Tiles(64, 32, 4, 3), Tiles(64, 32, 4, 3), Tiles(64, 32, 4, 3))
# Cross attention with one side of at most 64 rows a sample (GEM's N non-sequence tokens against
# the sequence, both ways): the same 64x32 tiles for all three kernels. gem-h200-1gpu (N=32,
# lengths 512-1024), step_bench on the H200 (hwmodels/data/runs/h200-2026-11-30-executor/
# s11-step-bench.log, CUDA-graph replays): sequence <- non-sequence 0.972 ms forward + backward
# against 1.221 with the length table; non-sequence <- sequence 0.829 against 1.089.
# The backward in one kernel per (sample, head) (``fused_short``), 32 long-side rows a tile, 4
# warps, 3 stages: forward + backward 0.715 ms against 0.978 (sequence <- non-sequence) and 0.589
# against 0.831 (the other way), the fastest of 32/4/2, 32/4/3 and 64/8/2 (step_bench on the
# H200, hwmodels/data/runs/h200-2026-11-30-executor/s20-step-bench.log): 1.0 ms a step of two cross layers.
SHORT_SIDE = 64
_SHORT_SIDE = Config(Tiles(64, 32, 4, 3), Tiles(64, 32, 4, 3), Tiles(64, 32, 4, 3), fused_short=Tiles(32, 0, 4, 3))
#: ``GEMTWIN_FLASH_FUSED_SHORT=0`` keeps the short-side cross attention's two-kernel backward
#: even where ``_SHORT_SIDE`` names ``fused_short`` tiles (side-by-side timing of whole steps).
fused_short = os.environ.get("GEMTWIN_FLASH_FUSED_SHORT", "1") != "0"
_BLOCK = Config(Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2))  # block <= 64
_FP32_CONFIG = Config(Tiles(64, 32, 4, 2), Tiles(64, 32, 4, 2), Tiles(64, 32, 4, 2))
# Under the interpreter: small tiles so tiny test shapes still cross tile boundaries.
_CPU_CONFIG = Config(Tiles(32, 16, 4, 1), Tiles(32, 16, 4, 1), Tiles(32, 16, 4, 1))

_override: Config | None = None


@contextlib.contextmanager
def use_config(config: Config) -> Iterator[None]:
    """Run the core with ``config`` instead of the table (tests and tile sweeps)."""
    global _override
    saved, _override = _override, config
    try:
        yield
    finally:
        _override = saved


def _config(q: Tensor, inner_len: int, block: int, causal: bool, weight: str = "softmax",
            short_side: int = 1 << 30) -> Config:
    """Tiles for a problem whose kernels loop over at most ``inner_len`` rows and whose shorter
    side (queries or keys, per sample) has at most ``short_side`` rows."""
    if _override is not None:
        return _override
    if not q.is_cuda:
        return _CPU_CONFIG
    if q.dtype == torch.float32:
        return _FP32_CONFIG
    if 0 < block <= 64 and block & (block - 1) == 0:
        return _BLOCK
    if short_side <= SHORT_SIDE:
        return _SHORT_SIDE if fused_short else dataclasses.replace(_SHORT_SIDE, fused_short=None)
    if causal:
        if inner_len > SHORT_CAUSAL:
            return _LONG
        return _SHORT_CAUSAL if weight == "softmax" else _SHORT_CAUSAL_ACT
    return _SHORT_NONCAUSAL if inner_len <= SHORT_NONCAUSAL else _LONG


# MXFP8 P·V (quant_p): the forward's key tiles and the dK/dV kernel's own key tiles are one MX
# block (32 keys) so that a block is a tile row / column; not yet timed on the GPU.
_MX_CONFIG = Config(Tiles(64, 32, 4, 3), Tiles(32, 64, 4, 3), Tiles(64, 32, 4, 3))
_MX_CPU_CONFIG = Config(Tiles(16, 32, 4, 1), Tiles(32, 16, 4, 1), Tiles(32, 16, 4, 1))


def _mx_config(q: Tensor) -> Config:
    cfg = _override or (_MX_CONFIG if q.is_cuda else _MX_CPU_CONFIG)
    if cfg.fwd.other != 32 or cfg.dkdv.own != 32 or cfg.atomic_dq:
        raise ValueError(f"quant_p needs 32-key tiles (forward other, dK/dV own) and no atomic dQ; got {cfg}")
    return cfg


def _block_tiles(t: Tiles, block: int) -> tuple[Tiles, bool]:
    """Clamp both tile sizes to ``block`` (a power of two >= 16) so that a tile never straddles
    two blocks; returns the tiles and whether they align with the blocks (no block mask needed
    on interior tiles)."""
    if block <= 0:
        return t, False
    if block >= 16 and block & (block - 1) == 0:
        return Tiles(min(t.own, block), min(t.other, block), t.warps, t.stages), True
    return t, False


# ---- block-local path (``_block.py``) -----------------------------------------------------------
@dataclass(frozen=True)
class BlockTiles:
    """Launch shape of a block-local kernel: a tile of ``max(rows, block)`` rows (several
    blocks when ``rows > block``), ``groups`` consecutive tiles per program."""

    rows: int
    groups: int
    warps: int
    stages: int


#: Use the block-local kernels for ``block`` a power of two <= 128 in self attention (the same
#: offsets tensor on both sides). ``GEMTWIN_FLASH_BLOCK_LOCAL=0`` or ``use_block_local(False)``
#: selects the generic FA2 kernels instead (side-by-side timing in gpu_check / the benchmark).
block_local = os.environ.get("GEMTWIN_FLASH_BLOCK_LOCAL", "1") != "0"
BLOCK_LOCAL_MAX = 128
# Not yet measured on the GPU (NOTES.md "Block-local path"): one 64-row block per tile, a few
# tiles per program so the pipeliner prefetches the next tile's rows.
# fwd, bwd: the fastest of gpu_check's sweep at every L in 256..2048 on the H200 (checked there
# too; hwmodels/data/runs/h200-2026-11-30-flash/2026-11-30_v4_block_h200.json): fwd 64 rows x 1 group, 4 warps,
# 1 stage; bwd 64 rows x 4 groups, 4 warps, 3 stages.
_BLOCK_LOCAL_GPU = (BlockTiles(64, 1, 4, 1), BlockTiles(64, 4, 4, 3))
_BLOCK_LOCAL_GPU_128 = (BlockTiles(128, 2, 8, 2), BlockTiles(128, 1, 8, 1))  # block = 128
_BLOCK_LOCAL_FP32 = (BlockTiles(16, 2, 4, 1), BlockTiles(16, 1, 4, 1))
_BLOCK_LOCAL_CPU = (BlockTiles(16, 2, 4, 1), BlockTiles(16, 2, 4, 1))
_block_override: tuple[BlockTiles, BlockTiles] | None = None


@contextlib.contextmanager
def use_block_local(on: bool = True, fwd: BlockTiles | None = None,
                    bwd: BlockTiles | None = None) -> Iterator[None]:
    """Switch the block-local path on/off (and override its tiles) inside the block."""
    global block_local, _block_override
    saved = block_local, _block_override
    block_local = on
    if fwd is not None or bwd is not None:
        _block_override = (fwd or _BLOCK_LOCAL_GPU[0], bwd or _BLOCK_LOCAL_GPU[1])
    try:
        yield
    finally:
        block_local, _block_override = saved


def _block_local_tiles(q: Tensor, block: int) -> tuple[BlockTiles, BlockTiles]:
    if _block_override is not None:
        return _block_override
    if not q.is_cuda:
        return _BLOCK_LOCAL_CPU
    if q.dtype == torch.float32:
        return _BLOCK_LOCAL_FP32
    return _BLOCK_LOCAL_GPU_128 if block > 64 else _BLOCK_LOCAL_GPU


def _use_block_local(q_offsets: Tensor, kv_offsets: Tensor, block: int) -> bool:
    """Block-local kernels apply: switched on, ``block`` a power of two <= 128 and one offsets
    tensor on both sides (self attention; compared by identity or storage, no host sync)."""
    if not block_local or not 0 < block <= BLOCK_LOCAL_MAX or block & (block - 1):
        return False
    return q_offsets is kv_offsets or (
        q_offsets.data_ptr() == kv_offsets.data_ptr() and q_offsets.dtype == kv_offsets.dtype
        and q_offsets.shape == kv_offsets.shape and q_offsets.stride() == kv_offsets.stride())


def _block_tile_rows(t: BlockTiles, block: int) -> int:
    return max(t.rows, block, 16)


# ---- work lists ---------------------------------------------------------------------------------
# Work lists already built, for the offsets they were built from: a training step calls the core
# ~30 times (each layer's forward, dK/dV and dQ kernels) over one or two offsets tensors, and each
# list costs an argsort, a cumsum and a plan kernel. An entry is used only for the very tensors
# (weak references) at the very versions (``_version``: every in-place write bumps it) it was
# built from. Under CUDA graph capture a list made before the capture must not be reused (the
# graph would replay a fixed list while the offsets change), so capture uses the cache only inside
# ``work_cache_scope()`` (cleared on entry and exit) and bypasses it otherwise.
_WORK_CACHE: dict[tuple, tuple] = {}
_WORK_CACHE_MAX = 64
_capture_scopes = 0


@contextlib.contextmanager
def work_cache_scope() -> Iterator[None]:
    """Around a CUDA graph capture: work lists built inside are shared by the captured kernels
    (the graph rebuilds them on every replay) and forgotten afterwards."""
    global _capture_scopes
    _WORK_CACHE.clear()
    _capture_scopes += 1
    try:
        yield
    finally:
        _capture_scopes -= 1
        _WORK_CACHE.clear()


def _work(own_off: Tensor, other_off: Tensor, tile: int, max_len: int, total: int,
          reverse: bool) -> tuple[int, Tensor] | None:
    """Work list over tiles of ``tile`` rows of each sample's own side, ordered by the other
    side's length (the cost of a tile), descending: ``(n_items, plan [n_items, 8] int32)``
    (records: see ``_plan_kernel``). ``reverse``: a sample's last tile first (causal: the last
    query tiles are the heaviest). No host sync: the grid is sized by a bound from ``max_len``
    and the row count; programs past the last item exit at once. Cached (``_WORK_CACHE``)."""
    use_cache = not (own_off.is_cuda and torch.cuda.is_current_stream_capturing()) or _capture_scopes > 0
    use_cache = use_cache and not (own_off.is_inference() or other_off.is_inference())  # (no version counter)
    if use_cache:
        key = (own_off.data_ptr(), other_off.data_ptr(), own_off._version, other_off._version, own_off.numel(),
               other_off.numel(), tile, max_len, total, reverse)
        hit = _WORK_CACHE.get(key)
        if hit is not None and hit[0]() is own_off and hit[1]() is other_off:
            return hit[2]
    work = _build_work(own_off, other_off, tile, max_len, total, reverse)
    if use_cache:
        if len(_WORK_CACHE) >= _WORK_CACHE_MAX:
            _WORK_CACHE.clear()
        _WORK_CACHE[key] = (weakref.ref(own_off), weakref.ref(other_off), work)
    return work


def _build_work(own_off: Tensor, other_off: Tensor, tile: int, max_len: int, total: int,
                reverse: bool) -> tuple[int, Tensor] | None:
    B = own_off.numel() - 1
    n_items = min(B * -(-max_len // tile), (total + B * (tile - 1)) // tile)
    if n_items <= 0:
        return None
    own_len = own_off[1:] - own_off[:-1]
    key_len = own_len if other_off is own_off else other_off[1:] - other_off[:-1]
    order = torch.argsort(key_len, descending=True, stable=True)
    ntiles = torch.div(own_len.index_select(0, order) + (tile - 1), tile, rounding_mode="floor")
    ends = torch.cumsum(ntiles, 0)
    plan = torch.empty((n_items, 8), dtype=torch.int32, device=own_off.device)
    BLOCK = 256
    K._plan_kernel[(-(-n_items // BLOCK),)](
        plan, ends, order, ntiles, own_off, other_off, n_items, B, B.bit_length() + 1,
        REVERSE=reverse, BLOCK=BLOCK, num_warps=4,
    )
    return n_items, plan


# ---- checks -------------------------------------------------------------------------------------
def _check(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, weight: str,
           causal: bool, block: int, quant_p: bool = False) -> None:
    if weight not in WEIGHTS:
        raise ValueError(f"weight '{weight}' is unknown; use one of {', '.join(WEIGHTS)}")
    if quant_p and (weight == "softmax" or block):
        raise ValueError(f"quant_p (MXFP8 P·V) is for activation weights without a block mask; got weight "
                         f"'{weight}', block {block}")
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or q.shape[1:] != k.shape[1:]:
        raise ValueError(
            f"q must be [Tq, H, D] and k, v [Tk, H, D] with the same H, D; got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    D = q.shape[2]
    if D < 16 or D > 128 or D & (D - 1):
        raise ValueError(f"head dim D={D} is not supported; use a power of two in 16..128")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            f"q, k, v dtypes {q.dtype}, {k.dtype}, {v.dtype} must be one of bf16, fp16, fp32"
        )
    for name, off in (("q_offsets", q_offsets), ("kv_offsets", kv_offsets)):
        if off.dim() != 1 or off.numel() < 1 or off.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"{name} must be a 1-D int32/int64 tensor [B+1]; got {off.dtype} of shape "
                f"{tuple(off.shape)}"
            )
        if off.device != q.device:
            raise ValueError(f"{name} is on {off.device}; put it on q's device {q.device}")
    if q_offsets.numel() != kv_offsets.numel():
        raise ValueError(
            f"q_offsets has {q_offsets.numel() - 1} samples and kv_offsets "
            f"{kv_offsets.numel() - 1}; both must describe the same batch"
        )
    if block < 0:
        raise ValueError(f"block={block} must be >= 0 (0 = no block mask)")
    if (causal or block) and q.shape[0] != k.shape[0]:
        raise ValueError(
            f"causal/block masks are for self attention (q_offsets == kv_offsets); got "
            f"{q.shape[0]} query rows and {k.shape[0]} key rows"
        )
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"q is on {q.device}: the Triton core runs on CUDA, or on CPU with TRITON_INTERPRET=1 "
            "set before kernels.flash is imported"
        )


def _flags(q: Tensor, weight: str, causal: bool, block: int) -> dict:
    interp = not q.is_cuda
    return dict(
        WEIGHT=WEIGHTS[weight], CAUSAL=bool(causal), BLOCK_W=int(block),
        USE_ASM=not interp and q.dtype != torch.float32,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "upcast" if interp else "default",
    )


def _rows(t: Tensor) -> Tensor:
    """``t [T, H, D]`` as the kernels take it: any row and head strides, head dim contiguous
    (so q, k, v can be views into one fused qkv projection without a copy)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _empty(shape_like: Tensor, dtype=None) -> Tensor:
    out = torch.empty_like(shape_like, dtype=dtype)
    return out.fill_(float("nan")) if poison_outputs else out


def _zero_outside(t: Tensor, offsets: Tensor) -> Tensor:
    """Zero, in place, the rows of ``t [T, H, D]`` outside ``offsets[0]:offsets[-1]``: rows that
    belong to no sample (a static-shape batch's padding) come back as zeros, never as whatever the
    allocator held, so padded rows carry finite values forward and zero gradients backward. One
    small launch; no host sync."""
    T = t.shape[0]
    if T == 0 or t.numel() == 0:
        return t
    W = t.shape[1] * t.shape[2]
    if t.stride(2) != 1 or t.stride(1) != t.shape[2]:  # rows not contiguous inside: never for our outputs
        rows = torch.arange(T, device=t.device)
        outside = (rows < offsets[0]) | (rows >= offsets[-1])
        return t.masked_fill_(outside[:, None, None], 0)
    BR = 64
    K._zero_outside_kernel[(-(-T // BR),)](t, offsets, offsets.numel(), T, t.stride(0), W=W, BR=BR,
                                           BW=min(triton.next_power_of_2(W), 512), num_warps=4)
    return t


_last_kernels: dict[str, object] = {}  # name -> compiled kernel of the last launch (resources)


# ---- forward ------------------------------------------------------------------------------------
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
                  max_q: int, max_kv: int, *, weight: str, scale: float, causal: bool = False,
                  block: int = 0, quant_p: bool = False) -> tuple[Tensor, Tensor]:
    """Attention of jagged queries over jagged keys/values, sample by sample.

    ``q [Tq, H, D]``, ``k, v [Tk, H, D]`` (bf16/fp16/fp32, D a power of two 16..128); sample ``b``
    owns query rows ``q_offsets[b]:q_offsets[b+1]`` and key rows ``kv_offsets[b]:kv_offsets[b+1]``
    (``[B+1]`` int32/int64; a dense side of N rows per sample is ``arange(B+1) * N``).
    ``max_q``/``max_kv`` bound the lengths (they size the grid; no host sync).

    ``weight="softmax"``: ``O = softmax(Q Kᵀ · scale + mask) V``; a row with no key gets 0.
    Otherwise ``O = (act(Q Kᵀ) · scale · mask) V`` with act = weight (silu, gelu in its tanh
    form, relu, relu2 = relu², identity). Masks, self attention only: ``causal`` (key j <= query
    i, positions from the sample's start) and ``block=W>0`` (``i // W == j // W``).

    Returns ``(o [Tq, H, D] in q.dtype, lse [H, Tq] fp32)``; ``lse`` is the natural-log
    log-sum-exp of each row's scaled scores (-inf for a row with no key) for softmax, and an
    empty tensor for the activation weights. fp32 accumulation throughout.

    ``quant_p`` (activation weights only): P is MX-quantized (E4M3, E8M0 scales) per 32 keys of
    each row, counted from the sample's first key, and dequantized before P·V — the MXFP8 P·V of
    ``kernels.mxfp8.gdpa`` (which quantizes q, k, v itself). Key tiles are then 32 rows.
    """
    _check(q, k, v, q_offsets, kv_offsets, weight, causal, block, quant_p)
    q, k, v = _rows(q), _rows(k), _rows(v)
    Tq, H, D = q.shape
    o = _empty(q)
    softmax = weight == "softmax"
    lse = (_empty(q.new_empty((H, Tq), dtype=torch.float32)) if softmax
           else q.new_empty((0,), dtype=torch.float32))
    if _use_block_local(q_offsets, kv_offsets, block):
        bt = _block_local_tiles(q, block)[0]
        bm = _block_tile_rows(bt, block)
        work = _work(q_offsets, q_offsets, bm * bt.groups, int(max_q), Tq, reverse=False)
        if work is None or H == 0:
            return _zero_outside(o, q_offsets), lse
        _last_kernels["block_fwd"] = KB._block_fwd_kernel[(work[0], H)](
            q, k, v, o, lse, work[1], Tq,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            o.stride(0), o.stride(1), float(scale), float(scale) * 1.4426950408889634,
            BM=bm, G=bt.groups, D=D, num_warps=bt.warps, num_stages=bt.stages,
            **_flags(q, weight, causal, block),
        )
        return _zero_outside(o, q_offsets), lse
    short = min(int(max_q), int(max_kv))
    cfg = _mx_config(q) if quant_p else _config(q, int(max_kv), block, causal, weight, short)
    tiles, aligned = _block_tiles(cfg.fwd, block)
    work = _work(q_offsets, kv_offsets, tiles.own, int(max_q), Tq, reverse=causal)
    if work is None or H == 0:
        return _zero_outside(o, q_offsets), lse
    kern = K._fwd_kernel[(work[0], H)](
        q, k, v, o, lse, work[1], Tq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        o.stride(0), o.stride(1), float(scale), float(scale) * 1.4426950408889634,
        ALIGNED=aligned, BM=tiles.own, BN=tiles.other, D=D, QUANT_P=quant_p,
        num_warps=tiles.warps, num_stages=tiles.stages, **_flags(q, weight, causal, block),
    )
    _last_kernels["fwd"] = kern
    return _zero_outside(o, q_offsets), lse


# ---- backward -----------------------------------------------------------------------------------
def attention_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                  q_offsets: Tensor, kv_offsets: Tensor, max_q: int, max_kv: int, *,
                  weight: str, scale: float, causal: bool = False, block: int = 0,
                  out: tuple[Tensor, Tensor, Tensor] | None = None, quant_p: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients ``(dq, dk, dv)`` of ``attention_fwd`` (same arguments) for the output gradient
    ``do [Tq, H, D]``; ``o`` and ``lse`` are the forward's outputs (used for softmax only; pass
    anything, e.g. empty tensors, for the activation weights).

    FlashAttention-2 style: softmax first computes ``delta = rowsum(dO ∘ O)``; one kernel walks
    the key tiles (longest sample first) and accumulates dK, dV over the query tiles that attend
    to them, a second walks the query tiles for dQ (deterministic, no atomics). Activation
    weights need no lse/delta: ``dS = (dO Vᵀ) ∘ act'(S) · scale ∘ mask`` with the exact
    derivatives (gelu: of its tanh form). Gradients come back in the inputs' dtype.

    Block masks (``block`` a power of two <= 128, one offsets tensor for both sides) take the
    block-local path instead (``_block.py``): one pass per block, softmax recomputed from the
    scores, so ``o`` and ``lse`` are not read.

    ``out``: write ``(dq, dk, dv)`` there (shapes of q, k, v; any row and head strides, head dim
    contiguous), e.g. views into one packed ``[T, 3, H, D]`` gradient, so nothing is stacked after.
    """
    _check(q, k, v, q_offsets, kv_offsets, weight, causal, block, quant_p)
    if do.shape != q.shape:
        raise ValueError(f"do has shape {tuple(do.shape)}; it must match q {tuple(q.shape)}")
    q, k, v, do = _rows(q), _rows(k), _rows(v), _rows(do)
    Tq, H, D = q.shape
    Tk = k.shape[0]
    softmax = weight == "softmax"
    short = min(int(max_q), int(max_kv))
    cfg = _mx_config(q) if quant_p else _config(q, int(max_q), block, causal, weight, short)  # dK/dV loop over queries
    dq_tiles = cfg.dq if quant_p else _config(q, int(max_kv), block, causal, weight, short).dq  # dQ over keys
    flags = _flags(q, weight, causal, block)
    scale = float(scale)
    qk_scale = scale * 1.4426950408889634
    if out is None:
        dq, dk, dv = _empty(q), _empty(k), _empty(v)
    else:
        dq, dk, dv = out
        for name, t, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
            if t.shape != like.shape or t.dtype != like.dtype or t.stride(-1) != 1:
                raise ValueError(f"out {name}: {tuple(t.shape)} {t.dtype} stride {t.stride()}; expected "
                                 f"{tuple(like.shape)} {like.dtype} with the head dim contiguous")
            if poison_outputs:
                t.fill_(float("nan"))
    if cfg.atomic_dq:
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    if H == 0 or (Tq == 0 and Tk == 0):
        return dq, dk, dv
    if cfg.fused_short is not None and short <= SHORT_SIDE and not causal and not block and not quant_p:
        return _short_bwd(do, q, k, v, o, lse, q_offsets, kv_offsets, int(max_q), int(max_kv), dq, dk, dv,
                          cfg.fused_short, flags, scale, qk_scale)
    if _use_block_local(q_offsets, kv_offsets, block):
        if softmax and lse.shape != (H, Tq):
            raise ValueError(f"lse has shape {tuple(lse.shape)}; softmax needs [H, Tq] = {(H, Tq)}")
        bt = _block_local_tiles(q, block)[1]
        bm = _block_tile_rows(bt, block)
        work = _work(q_offsets, q_offsets, bm * bt.groups, int(max_q), Tq, reverse=False)
        if work is not None:
            _last_kernels["block_bwd"] = KB._block_bwd_kernel[(work[0], H)](
                q, k, v, do, dq, dk, dv, work[1], Tq,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                do.stride(0), do.stride(1), dq.stride(0), dq.stride(1), dk.stride(0),
                dk.stride(1), dv.stride(0), dv.stride(1), scale, qk_scale,
                BM=bm, G=bt.groups, D=D, num_warps=bt.warps, num_stages=bt.stages, **flags,
            )
        return _zero_outside(dq, q_offsets), _zero_outside(dk, kv_offsets), _zero_outside(dv, kv_offsets)

    if softmax:
        if lse.shape != (H, Tq):
            raise ValueError(f"lse has shape {tuple(lse.shape)}; softmax needs [H, Tq] = {(H, Tq)}")
        o = o.contiguous()
        delta = torch.empty((H, Tq), dtype=torch.float32, device=q.device)
        if Tq:
            K._delta_kernel[(-(-Tq // 64), H)](
                o, do, delta, Tq, o.stride(0), o.stride(1), do.stride(0), do.stride(1),
                BR=64, D=D, num_warps=4,
            )
    else:
        lse = delta = torch.empty((1,), dtype=torch.float32, device=q.device)

    dq_target = dq_acc if cfg.atomic_dq else dq
    tiles, aligned = _block_tiles(cfg.dkdv, block)
    work = _work(kv_offsets, q_offsets, tiles.own, int(max_kv), Tk, reverse=False)
    if work is not None:
        _last_kernels["dkdv"] = K._dkdv_kernel[(work[0], H)](
            q, k, v, do, lse, delta, dk, dv, dq_target, work[1], Tq,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            dq_target.stride(0), dq_target.stride(1), scale, qk_scale,
            ALIGNED=aligned, ATOMIC_DQ=cfg.atomic_dq, BN=tiles.own, BM=tiles.other, D=D, QUANT_P=quant_p,
            num_warps=tiles.warps, num_stages=tiles.stages, **flags,
        )
    if cfg.atomic_dq:
        dq.copy_(dq_acc)
        return _zero_outside(dq, q_offsets), _zero_outside(dk, kv_offsets), _zero_outside(dv, kv_offsets)

    tiles, aligned = _block_tiles(dq_tiles, block)
    work = _work(q_offsets, kv_offsets, tiles.own, int(max_q), Tq, reverse=causal)
    if work is not None:
        _last_kernels["dq"] = K._dq_kernel[(work[0], H)](
            q, k, v, do, lse, delta, dq, work[1], Tq,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), dq.stride(0), dq.stride(1), scale, qk_scale,
            ALIGNED=aligned, BM=tiles.own, BN=tiles.other, D=D,
            num_warps=tiles.warps, num_stages=tiles.stages, **flags,
        )
    return _zero_outside(dq, q_offsets), _zero_outside(dk, kv_offsets), _zero_outside(dv, kv_offsets)


def _short_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, q_offsets: Tensor,
               kv_offsets: Tensor, max_q: int, max_kv: int, dq: Tensor, dk: Tensor, dv: Tensor, tiles: Tiles,
               flags: dict, scale: float, qk_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """``attention_bwd`` for a cross attention whose shorter side has at most ``SHORT_SIDE`` rows
    a sample (``Config.fused_short``): ``_short_bwd_kernel``, one program per (sample, head),
    walking the long side in ``tiles.own``-row tiles."""
    Tq, H, D = q.shape
    long_q = max_q >= max_kv
    max_long, max_short = max(max_q, max_kv), min(max_q, max_kv)
    S = max(16, 1 << max(max_short - 1, 0).bit_length())
    softmax = flags["WEIGHT"] == 0
    if softmax and lse.shape != (H, Tq):
        raise ValueError(f"lse has shape {tuple(lse.shape)}; softmax needs [H, Tq] = {(H, Tq)}")
    if not softmax or long_q:  # O is read only for the short query side's delta
        o = q
    if not softmax:
        lse = torch.empty((1,), dtype=torch.float32, device=q.device)
    # a sample whose long side is empty has no work item: its short side's gradients stay zero
    for t in (dk, dv) if long_q else (dq,):
        t.zero_()
    long_off, short_off = (q_offsets, kv_offsets) if long_q else (kv_offsets, q_offsets)
    work = _work(long_off, short_off, max(max_long, 1), max_long, Tq if long_q else k.shape[0], reverse=False)
    if work is not None:
        _last_kernels["short_bwd"] = K._short_bwd_kernel[(work[0], H)](
            q, k, v, do, o, lse, dq, dk, dv, work[1], Tq,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1), o.stride(0), o.stride(1), dq.stride(0), dq.stride(1),
            dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), scale, qk_scale,
            WEIGHT=flags["WEIGHT"], USE_ASM=flags["USE_ASM"], DOT_PREC=flags["DOT_PREC"], LONG_Q=long_q,
            BL=tiles.own, S=S, D=D, num_warps=tiles.warps, num_stages=tiles.stages,
        )
    return _zero_outside(dq, q_offsets), _zero_outside(dk, kv_offsets), _zero_outside(dv, kv_offsets)
