"""Jagged flash attention: attended (query, key) pairs of one sequence of length ``n``."""

from __future__ import annotations


def pairs(n, *, causal: bool):
    """Pairs attended in a length-``n`` sequence (works on floats and numpy arrays)."""
    return n * (n + 1) / 2 if causal else n * n
