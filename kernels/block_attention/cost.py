"""BlockAttention: softmax attention inside blocks of ``block`` consecutive tokens."""

from __future__ import annotations


def pairs(n, *, block: int, causal: bool):
    """Pairs attended in a length-``n`` sequence cut into blocks (the last may be shorter)."""
    full, rest = n // block, n % block
    if causal:
        return full * block * (block + 1) / 2 + rest * (rest + 1) / 2
    return full * block * block + rest * rest
