"""Pieces shared by several kernel folders (so that none imports another's internals).

``mx_triton.py``: the MX format's exact fp8 rounding and E8M0 scale code as ``@triton.jit``
helpers, used by ``kernels/mxfp8`` (the quantizers) and ``kernels/flash`` (MXFP8 P·V).
``timing.py``: ``replay_ms``, the benches' CUDA-graph replay timer. ``bench.py``: the kernel
benches' clock, step runner, timer and sm_90 resource report.
Importing this package needs neither torch nor triton.
"""
