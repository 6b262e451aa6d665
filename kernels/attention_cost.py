"""FLOPs and HBM bytes of one attention call, shared by every attention kind's ``cost.py``.

Counts the matmuls of the *attended* (query, key) pairs only: ``Q Kᵀ`` and ``P V`` are
``2·H·Dh`` FLOPs each per pair forward; backward recomputes nothing in the model-FLOP count and
does four matmuls (dV, dP, dQ, dK), twice the forward. Bytes assume a fused (flash-style)
kernel: Q, K, V and O move once forward; backward reads Q, K, V, O, dO and writes dQ, dK, dV.
Element-wise work (softmax, activation, masks) is left out of FLOPs, as FlopCounterMode does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AttentionCost:
    fwd_flops: float
    bwd_flops: float
    fwd_bytes: float
    bwd_bytes: float


def attention_cost(
    *, pairs: float, q_tokens: float, kv_tokens: float, heads: int, head_dim: int, elem_bytes: float
) -> AttentionCost:
    """Cost of attention over ``pairs`` attended (q, k) pairs with the given token counts."""
    fwd = 4.0 * heads * head_dim * pairs
    width = heads * head_dim * elem_bytes
    fwd_bytes = width * (2 * q_tokens + 2 * kv_tokens)  # read Q, K, V; write O
    bwd_bytes = width * (4 * q_tokens + 4 * kv_tokens)  # read Q,K,V,O,dO; write dQ,dK,dV
    return AttentionCost(fwd, 2.0 * fwd, fwd_bytes, bwd_bytes)
