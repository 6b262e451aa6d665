"""The jagged attention family: JFA, GDPA, BlockAttention and asymmetric attention as one op.

- ``spec.py`` (torch-free): ``AttentionSpec`` (kind, causal, activation, block, which side is
  jagged, scale), ``FlashOptions`` (the Triton core's variants), the names.
- ``dispatch.py``: ``attention(..., spec=..., kernel="triton" | "reference")``, the packed
  entry ``attention_packed`` (fused projections in, whole gradients out) and one entry point
  per kind (``jagged_flash_attention``, ``gdpa``, ``block_attention``, ``jagged_q_dense_kv``,
  ``dense_q_jagged_kv``).
- ``op.py``: the ``torch.library`` ops ``gemtwin::attention_<kind>_fwd`` / ``_bwd`` over the
  Triton core (``kernels/flash``), with fakes and autograd.
- ``reference.py``: the one PyTorch reference (exact pairs, or padded on CUDA) and the
  activation table.
- ``checks.py``: one-line input errors. ``cost.py`` (torch-free): FLOPs and bytes, for the twin.
- ``bench.py``: the family against padded SDPA, FlexAttention and the reference (one H200 call).

Contract: ``kernels/ATTENTION.md``. Importing this package (and ``spec``, ``cost``) needs no torch.
"""

from kernels.attention.spec import ACTIVATIONS, KERNELS, KINDS, WEIGHTS, AttentionSpec, FlashOptions

__all__ = ["ACTIVATIONS", "KERNELS", "KINDS", "WEIGHTS", "AttentionSpec", "FlashOptions"]
