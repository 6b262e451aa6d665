"""``Cost``: the work of an op or a layer, forward and backward, as a value that adds and scales.

Torch-free and at the bottom of the dependency order, so that every cost function (``twin.flops``,
``kernels/*/cost.py``) returns the same small type instead of a positional tuple, and callers
sum it like torchrec's ``Perf``::

    layer = sum((op.cost for op in ops), Cost())      # or  a + b
    per_batch = per_sample * B                         # expectation × samples

FLOPs are FLOPs and bytes are HBM bytes (DESIGN rule 6); the backward is the gradient work only
(recomputation is priced apart, as ``twin.workload`` does).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Cost:
    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    fwd_bytes: float = 0.0
    bwd_bytes: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(self.fwd_flops + other.fwd_flops, self.bwd_flops + other.bwd_flops,
                    self.fwd_bytes + other.fwd_bytes, self.bwd_bytes + other.bwd_bytes)  # fmt: skip

    def __radd__(self, other: object) -> Cost:
        """``sum(costs)`` starts from 0."""
        if other == 0:
            return self
        return NotImplemented

    def __mul__(self, k: float) -> Cost:
        return Cost(self.fwd_flops * k, self.bwd_flops * k, self.fwd_bytes * k, self.bwd_bytes * k)

    __rmul__ = __mul__

    @property
    def flops(self) -> float:
        return self.fwd_flops + self.bwd_flops

    @property
    def bytes(self) -> float:
        return self.fwd_bytes + self.bwd_bytes

    @classmethod
    def of(cls, c: object) -> Cost:
        """A ``Cost`` from anything with the four fields (an ``AttentionCost``, say)."""
        return cls(c.fwd_flops, c.bwd_flops, c.fwd_bytes, c.bwd_bytes)  # type: ignore[attr-defined]
