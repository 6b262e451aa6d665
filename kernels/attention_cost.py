"""Kept for the twin's import (``twin/flops.py``): the family's cost is ``kernels/attention/cost.py``."""

from kernels.attention.cost import AttentionCost, attention_cost

__all__ = ["AttentionCost", "attention_cost"]
