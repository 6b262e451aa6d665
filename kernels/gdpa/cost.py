"""GDPA, ``O = (act(Q Kᵀ)·scale) V``: the same matmuls as softmax attention over the same
pairs (the activation replaces softmax and is element-wise, left out of FLOPs)."""

from __future__ import annotations

from kernels.jfa.cost import pairs

__all__ = ["pairs"]
