"""The core's launch table: which tiles each problem gets (measurements: NOTES.md).

Every choice is a pure function of the problem (device, dtype, lengths, masks) and the
``FlashOptions`` of the call: a ``FlashOptions.tiles`` / ``block_fwd`` / ``block_bwd`` replaces
the table's (tests and tile sweeps), ``fused_short`` / ``block_local`` switch the two variants.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from kernels.flash.options import BlockTiles, Config, FlashOptions, Tiles

# Hand-picked for the H200 from the sweeps in NOTES.md (hwmodels/data/runs/h200-2026-11-30-flash/2026-11-30_v3_h200.json).
# Short inner loops (the other side's max length) want 64-row forward tiles, two or three
# programs per SM hiding each other's load latency; long ones want 128-row tiles. The backward
# keeps 128-key dK/dV tiles and 128-query dQ tiles at every length (every smaller variant measured
# slower). Head dim 64 shares D=128's shapes (not swept).
SHORT_NONCAUSAL, SHORT_CAUSAL = 512, 1024
_BWD = (Tiles(128, 64, 8, 3), Tiles(128, 64, 8, 3))  # dK/dV, dQ
LONG = Config(Tiles(128, 64, 8, 3), *_BWD)
# With TMA loads (``use_tma``) the long forward takes 64x64 tiles, 4 warps: at L = 2048 1.07x
# (GDPA), 1.13x (JFA causal), 1.15x (causal GDPA) the table's 128x64 pointer kernel; GDPA at
# L = 1024 1.07x (H100, ``tma_probe``, hwmodels/data/runs/h100-2026-12-05f-tma/probe2.log).
LONG_TMA = Config(Tiles(64, 64, 4, 3), *_BWD)
SHORT_NONCAUSAL_CONFIG = Config(Tiles(64, 32, 4, 3), *_BWD)
SHORT_CAUSAL_CONFIG = Config(Tiles(64, 64, 4, 3), *_BWD)
# Causal GDPA (activation weights) up to 1024 rows: 64-row tiles over 32-row inner tiles, 4 warps,
# everywhere. gem-h200-1gpu's layer (B=256, lengths 512-1024, H=4, D=128), the attention step bench
# on the H200 (hwmodels/data/runs/h200-2026-11-30-executor/s9-step-bench.log): forward + backward
# 2.344 ms against 2.529 with SHORT_CAUSAL_CONFIG (forward 0.567 / 0.607, backward 1.778 / 1.921).
SHORT_CAUSAL_ACT = Config(Tiles(64, 32, 4, 3), Tiles(64, 32, 4, 3), Tiles(64, 32, 4, 3))
# Cross attention with one side of at most 64 rows a sample (GEM's N non-sequence tokens against
# the sequence, both ways): the same 64x32 tiles for all three kernels. gem-h200-1gpu (N=32,
# lengths 512-1024), the step bench on the H200 (hwmodels/data/runs/h200-2026-11-30-executor/
# s11-step-bench.log, CUDA-graph replays): sequence <- non-sequence 0.972 ms forward + backward
# against 1.221 with the length table; non-sequence <- sequence 0.829 against 1.089.
# The backward in one kernel per (sample, head) (``fused_short``), 32 long-side rows a tile, 4
# warps, 3 stages: forward + backward 0.715 ms against 0.978 (sequence <- non-sequence) and 0.589
# against 0.831 (the other way), the fastest of 32/4/2, 32/4/3 and 64/8/2 (the step bench on the
# H200, hwmodels/data/runs/h200-2026-11-30-executor/s20-step-bench.log): 1.0 ms a step of two cross
# layers. sm_90 compile (compile_check): 223-228 registers, no spills, at 32 rows / 4 warps and 64
# rows / 8 warps with long queries; 64 rows / 4 warps spills.
SHORT_SIDE = 64
SHORT_SIDE_CONFIG = Config(Tiles(64, 32, 4, 3), Tiles(64, 32, 4, 3), Tiles(64, 32, 4, 3),
                           fused_short=Tiles(32, 0, 4, 3))
BLOCK = Config(Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 2))  # block <= 64
FP32 = Config(Tiles(64, 32, 4, 2), Tiles(64, 32, 4, 2), Tiles(64, 32, 4, 2))
# Under the interpreter: small tiles so tiny test shapes still cross tile boundaries.
CPU = Config(Tiles(32, 16, 4, 1), Tiles(32, 16, 4, 1), Tiles(32, 16, 4, 1))


def config(q: Tensor, inner_len: int, block: int, causal: bool, weight: str = "softmax",
           short_side: int = 1 << 30, flash: FlashOptions = FlashOptions()) -> Config:
    """Tiles for a problem whose kernels loop over at most ``inner_len`` rows and whose shorter
    side (queries or keys, per sample) has at most ``short_side`` rows."""
    if flash.tiles is not None:
        return flash.tiles
    if not q.is_cuda:
        return CPU
    if q.dtype == torch.float32:
        return FP32
    if 0 < block <= 64 and block & (block - 1) == 0:
        return BLOCK
    if short_side <= SHORT_SIDE:
        return SHORT_SIDE_CONFIG if flash.fused_short else dataclasses.replace(SHORT_SIDE_CONFIG, fused_short=None)
    long = LONG_TMA if use_tma(q, flash) else LONG
    if causal:
        if inner_len > SHORT_CAUSAL:
            return long
        return SHORT_CAUSAL_CONFIG if weight == "softmax" else SHORT_CAUSAL_ACT
    return SHORT_NONCAUSAL_CONFIG if inner_len <= SHORT_NONCAUSAL else long


def use_tma(q: Tensor, flash: FlashOptions = FlashOptions(), *tensors: Tensor) -> bool:
    """The FA2 forward and dK/dV kernels load their tiles through TMA descriptors (``_tma.py``):
    ``flash.tma`` is ``on``, or ``auto`` on a GPU of compute capability 9.0 or later; and every
    tensor (``q`` and ``tensors``) is 16-bit with contiguous heads (``[T, H·D]`` rows) whose row
    stride and base are 16-byte aligned, as a descriptor needs. Measured against the pointer
    kernels on the H100 (``tma_probe``): forward 1.00-1.15x, backward with TMA dK/dV 0.91-1.06x; the dQ kernel
    stays on pointer loads (a TMA one measured 0.90-1.04x)."""
    if flash.tma == "off" or q.dtype == torch.float32:
        return False
    if flash.tma == "auto" and not (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] >= 9):
        return False
    return all(t.stride(2) == 1 and t.stride(1) == t.shape[2] and (t.stride(0) * t.element_size()) % 16 == 0
               and t.data_ptr() % 16 == 0 and t.numel() > 0 for t in (q, *tensors))


# MXFP8 P·V (quant_p): the forward's key tiles and the dK/dV kernel's own key tiles are one MX
# block (32 keys) so that a block is a tile row / column; not yet timed on the GPU.
MX = Config(Tiles(64, 32, 4, 3), Tiles(32, 64, 4, 3), Tiles(64, 32, 4, 3))
MX_CPU = Config(Tiles(16, 32, 4, 1), Tiles(32, 16, 4, 1), Tiles(32, 16, 4, 1))


def mx_config(q: Tensor, flash: FlashOptions = FlashOptions()) -> Config:
    cfg = flash.tiles or (MX if q.is_cuda else MX_CPU)
    if cfg.fwd.other != 32 or cfg.dkdv.own != 32 or cfg.atomic_dq:
        raise ValueError(f"quant_p needs 32-key tiles (forward other, dK/dV own) and no atomic dQ; got {cfg}")
    return cfg


def block_clamped(t: Tiles, block: int) -> tuple[Tiles, bool]:
    """Clamp both tile sizes to ``block`` (a power of two >= 16) so that a tile never straddles
    two blocks; returns the tiles and whether they align with the blocks (no block mask needed
    on interior tiles)."""
    if block <= 0:
        return t, False
    if block >= 16 and block & (block - 1) == 0:
        return Tiles(min(t.own, block), min(t.other, block), t.warps, t.stages), True
    return t, False


# ---- block-local path (``_block.py``) -----------------------------------------------------------
#: The block-local kernels take ``block`` a power of two <= 128 in self attention (the same offsets
#: tensor on both sides) unless ``FlashOptions.block_local`` is off (then the generic FA2 kernels).
BLOCK_LOCAL_MAX = 128
# fwd, bwd: the fastest of gpu_check's sweep at every L in 256..2048 on the H200 (checked there
# too; hwmodels/data/runs/h200-2026-11-30-flash/2026-11-30_v4_block_h200.json): fwd 64 rows x 1 group, 4 warps,
# 1 stage; bwd 64 rows x 4 groups, 4 warps, 3 stages.
BLOCK_LOCAL_GPU = (BlockTiles(64, 1, 4, 1), BlockTiles(64, 4, 4, 3))
BLOCK_LOCAL_GPU_128 = (BlockTiles(128, 2, 8, 2), BlockTiles(128, 1, 8, 1))  # block = 128
BLOCK_LOCAL_FP32 = (BlockTiles(16, 2, 4, 1), BlockTiles(16, 1, 4, 1))
BLOCK_LOCAL_CPU = (BlockTiles(16, 2, 4, 1), BlockTiles(16, 2, 4, 1))


def block_local_tiles(q: Tensor, block: int, flash: FlashOptions = FlashOptions()) -> tuple[BlockTiles, BlockTiles]:
    """(forward, backward) tiles of the block-local kernels; ``flash.block_fwd`` / ``block_bwd``
    replace the GPU table's."""
    if flash.block_fwd is not None or flash.block_bwd is not None:
        return flash.block_fwd or BLOCK_LOCAL_GPU[0], flash.block_bwd or BLOCK_LOCAL_GPU[1]
    if not q.is_cuda:
        return BLOCK_LOCAL_CPU
    if q.dtype == torch.float32:
        return BLOCK_LOCAL_FP32
    return BLOCK_LOCAL_GPU_128 if block > 64 else BLOCK_LOCAL_GPU


def use_block_local(q_offsets: Tensor, kv_offsets: Tensor, block: int, flash: FlashOptions = FlashOptions()) -> bool:
    """Block-local kernels apply: switched on, ``block`` a power of two <= 128 and one offsets
    tensor on both sides (self attention; compared by identity or storage, no host sync)."""
    if not flash.block_local or not 0 < block <= BLOCK_LOCAL_MAX or block & (block - 1):
        return False
    return q_offsets is kv_offsets or (
        q_offsets.data_ptr() == kv_offsets.data_ptr() and q_offsets.dtype == kv_offsets.dtype
        and q_offsets.shape == kv_offsets.shape and q_offsets.stride() == kv_offsets.stride())


def block_tile_rows(t: BlockTiles, block: int) -> int:
    return max(t.rows, block, 16)
