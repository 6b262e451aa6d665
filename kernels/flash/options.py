"""The core's vocabulary and launch options, torch-free: weight names, tile shapes, variants.

- ``WEIGHTS``: what turns the scores into attention weights (``softmax`` or an element-wise
  activation); a weight's code in the kernels (``WEIGHT``) is its index here.
- ``Tiles`` / ``Config`` / ``BlockTiles``: launch shapes (the table that picks them is
  ``tiles.py``; a ``Config`` passed in replaces the table, for tests and tile sweeps).
- ``FlashOptions``: the core's variants, passed with every call (nothing is read from the
  environment or kept between calls). Its first two fields mirror the Scenario's
  ``execution.flash`` (``scenarios.schema.FlashOptions``); ``FlashOptions.of`` takes that.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from scenarios.vocab import ACTIVATIONS

#: What turns the scores into attention weights: softmax, or one of GDPA's activations (the
#: names are defined once, in ``scenarios.vocab``, which the Scenario validates against too).
WEIGHTS = ("softmax", *ACTIVATIONS)


#: ``FlashOptions.tma``: TMA tile loads where the GPU has them, everywhere (the interpreter too), never.
TMA = ("auto", "on", "off")


def weight_code(weight: str) -> int:
    """The kernels' ``WEIGHT`` constexpr of ``weight``: 0 softmax, 1 silu, ..., 5 identity."""
    if weight not in WEIGHTS:
        raise ValueError(f"weight '{weight}' is unknown; use one of {', '.join(WEIGHTS)}")
    return WEIGHTS.index(weight)


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
    # ``fused_short.own`` rows (``_short_bwd``; tiles.py times it)
    fused_short: Tiles | None = None

    def to_ints(self) -> list[int]:
        """Flat ints (a custom op's ``int[]`` argument): 12 tile ints, atomic, then 4 or none."""
        out = [*_astuple(self.fwd), *_astuple(self.dkdv), *_astuple(self.dq), int(self.atomic_dq)]
        return out + ([] if self.fused_short is None else _astuple(self.fused_short))

    @classmethod
    def from_ints(cls, v: list[int]) -> Config:
        short = Tiles(*v[13:17]) if len(v) == 17 else None
        return cls(Tiles(*v[0:4]), Tiles(*v[4:8]), Tiles(*v[8:12]), bool(v[12]), short)


@dataclass(frozen=True)
class BlockTiles:
    """Launch shape of a block-local kernel: a tile of ``max(rows, block)`` rows (several
    blocks when ``rows > block``), ``groups`` consecutive tiles per program."""

    rows: int
    groups: int
    warps: int
    stages: int


@dataclass(frozen=True)
class FlashOptions:
    """Variants of the core, for side-by-side runs; the defaults are the measured best.

    ``fused_short``: cross attention with a short side (<= 64 rows a sample) runs its backward
    in one kernel per (sample, head) where the table names such tiles; false: two kernels.
    ``block_local``: block masks of a power of two <= 128 in self attention take the one-pass
    block-local kernels (``_block.py``); false: the general FA2 kernels.
    ``tiles`` / ``block_fwd`` / ``block_bwd``: launch shapes instead of the table's (tests, sweeps).
    ``poison``: outputs filled with NaN before the kernels run, so that a row they never write
    shows (the core's ``poison_outputs``; correctness checks at bench shapes).
    ``tma``: how the FA2 forward and dK/dV kernels load their tiles (``tiles.use_tma``): ``auto``
    through TMA descriptors (``_tma.py``) on a GPU that has them (compute capability 9.0 on),
    pointer loads elsewhere; ``on`` also under the CPU interpreter (tests); ``off`` pointer loads.
    """

    fused_short: bool = True
    block_local: bool = True
    tiles: Config | None = None
    block_fwd: BlockTiles | None = None
    block_bwd: BlockTiles | None = None
    poison: bool = False
    tma: str = "auto"

    def __post_init__(self):
        if self.tma not in TMA:
            raise ValueError(f"FlashOptions.tma '{self.tma}' is unknown; use one of {', '.join(TMA)}")

    @classmethod
    def of(cls, flash) -> FlashOptions:
        """From anything with ``fused_short``, ``block_local`` and ``tma`` (a bool: the Scenario's
        ``execution.flash``, whose true is ``auto``); None gives the defaults."""
        if flash is None or isinstance(flash, cls):
            return flash or cls()
        return cls(fused_short=bool(flash.fused_short), block_local=bool(flash.block_local),
                   tma="auto" if flash.tma else "off")

    def to_ints(self) -> list[int]:
        """Flat ints, a custom op's ``int[]`` argument: the four switches (``tma`` as its index in
        ``TMA``), the block-local tiles (8 ints, zeros for the table's), then ``tiles`` (none for the
        table's)."""
        none = BlockTiles(0, 0, 0, 0)
        return [int(self.fused_short), int(self.block_local), int(self.poison), TMA.index(self.tma),
                *_astuple(self.block_fwd or none), *_astuple(self.block_bwd or none),
                *([] if self.tiles is None else self.tiles.to_ints())]  # fmt: skip

    @classmethod
    def from_ints(cls, v: list[int]) -> FlashOptions:
        """The inverse of ``to_ints``: what a custom op receives."""
        fwd = BlockTiles(*v[4:8]) if v[4] else None
        bwd = BlockTiles(*v[8:12]) if v[8] else None
        tiles = Config.from_ints(v[12:]) if len(v) > 12 else None
        return cls(bool(v[0]), bool(v[1]), tiles, fwd, bwd, bool(v[2]), TMA[v[3]])


def _astuple(t) -> list[int]:
    return [int(x) for x in dataclasses.astuple(t)]
