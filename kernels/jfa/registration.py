"""Kept for ``executor/model.py``'s import: the family's registration is ``kernels/attention/op.py``."""

from kernels.attention.op import dense_offsets

__all__ = ["dense_offsets"]
