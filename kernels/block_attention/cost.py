"""Kept for the twin's import (``twin/flops.py``): the family's cost is ``kernels/attention/cost.py``."""

from __future__ import annotations

from kernels.attention.cost import self_pairs


def pairs(n, *, block: int, causal: bool):
    """Pairs attended in a length-``n`` sequence cut into blocks (``kernels.attention.cost.self_pairs``)."""
    return self_pairs(n, causal=causal, block=block)
