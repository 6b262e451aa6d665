"""What one attention call computes, torch-free: ``AttentionSpec`` (kernels/ATTENTION.md).

The four kinds of the family are one computation with different flags:

| kind | weights | masks | sides |
|---|---|---|---|
| ``jfa`` | softmax, scale ``1/sqrt(D)`` | ``causal`` | both jagged (self attention) |
| ``gdpa`` | ``activation``, scale ``1/max_kv`` (``1/N`` dense) | ``causal`` | self, jagged/jagged, or dense short K/V (``jagged="q"``) |
| ``block`` | softmax, ``1/sqrt(D)`` | blocks of ``block`` tokens (+ ``causal``) | self attention |
| ``asym`` | softmax, ``1/sqrt(D)`` | none | one side dense ``[B, N, H, D]``: ``jagged="q"`` or ``"kv"`` |

``jagged`` says which side is jagged (``values [T, H, D]`` with ``offsets [B+1]``): ``"both"``,
``"q"`` (keys/values dense and short) or ``"kv"`` (a few dense queries over a long history).
The twin prices a spec with ``cost.py``; the dispatcher (``dispatch.py``) runs it on the Triton
core or the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from kernels.flash.options import WEIGHTS, FlashOptions
from scenarios.vocab import ACTIVATIONS, AttentionKind

Kind = Literal["jfa", "gdpa", "block", "asym"]
#: The family's kinds: the shared vocabulary's attention kinds but dense SDPA (the benchmarks' anchor).
KINDS = tuple(k.value for k in AttentionKind if k is not AttentionKind.SDPA)
Jagged = Literal["both", "q", "kv"]
Kernel = Literal["triton", "reference"]
KERNELS = ("triton", "reference")
_SIDES = {"jfa": ("both",), "block": ("both",), "gdpa": ("both", "q"), "asym": ("q", "kv")}


@dataclass(frozen=True)
class AttentionSpec:
    """One attention computation: its kind and flags (validated on construction, one-line errors)."""

    kind: Kind = "jfa"
    causal: bool = False
    activation: str = "silu"  # gdpa: the element-wise act replacing softmax
    block: int = 0  # block: tokens per block (>= 1); others: 0
    jagged: Jagged = "both"  # which side is jagged (the other dense [B, N, H, D])
    scale: float | None = None  # None: the kind's default (``default_scale``)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"attention kind '{self.kind}' is unknown; use one of {', '.join(KINDS)}")
        if self.jagged not in _SIDES[self.kind]:
            raise ValueError(f"attention kind '{self.kind}': jagged='{self.jagged}' is not a layout it has; "
                             f"use {' or '.join(_SIDES[self.kind])}")
        if self.kind == "gdpa" and self.activation not in ACTIVATIONS:
            raise ValueError(f"gdpa activation '{self.activation}' is unknown; use one of {', '.join(ACTIVATIONS)}")
        if self.kind == "block" and (isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1):
            raise ValueError(f"block attention: block is {self.block!r}; pass a block size in tokens >= 1, e.g. 64")
        if self.kind != "block" and self.block:
            raise ValueError(f"attention kind '{self.kind}': block={self.block} is for kind 'block'; pass block=0")
        if self.causal and self.jagged != "both":
            raise ValueError(f"causal=True needs jagged self attention; a dense side (jagged='{self.jagged}') "
                             "takes causal=False")

    @property
    def weight(self) -> str:
        """The core's weight function: ``softmax`` or GDPA's activation."""
        return self.activation if self.kind == "gdpa" else "softmax"

    def default_scale(self, head_dim: int, max_kv: int) -> float:
        """``scale`` when none is given: ``1/sqrt(D)`` for softmax; for GDPA ``1/max_kv`` (the
        keys' length bound, HSTU's SiLU attention; ``N`` for dense K/V)."""
        if self.scale is not None:
            return float(self.scale)
        if self.kind == "gdpa":
            return 1.0 / max(int(max_kv), 1)
        return 1.0 / math.sqrt(head_dim)


__all__ = ["ACTIVATIONS", "KERNELS", "KINDS", "WEIGHTS", "AttentionSpec", "FlashOptions", "Jagged", "Kernel", "Kind"]
