"""Small Triton kernels on jagged tensors (``values [T, ...]`` with ``offsets [B+1]``)."""
