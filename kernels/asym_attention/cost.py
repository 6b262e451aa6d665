"""Kept for the twin's import (``twin/flops.py``): the family's cost is ``kernels/attention/cost.py``."""

from kernels.attention.cost import cross_pairs as pairs

__all__ = ["pairs"]
