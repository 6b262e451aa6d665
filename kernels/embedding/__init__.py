"""Table-batched embedding lookups (TBE): many tables, one launch.

- ``layout``: torch-only helpers — the tables of one group stored in one fused buffer
  (``FusedTables``) and the packed (KJT-style, table-major) id layout (``pack_bags``).
- ``reference``: PyTorch references (``F.embedding_bag`` / ``index_select`` + segment sum).
- ``tbe``: the Triton kernels (pooled sum/mean bags, unpooled jagged lookups, a deterministic
  sparse backward) and their autograd wrappers.
- ``cost``: bytes moved and FLOPs, torch-free (the twin imports it).

This package stays importable without torch; only ``layout``, ``reference`` and ``tbe`` need it.
"""
