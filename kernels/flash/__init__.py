"""The Triton core shared by the jagged attention ops (``core.attention_fwd`` / ``attention_bwd``).

Importing this package needs neither torch nor triton; ``kernels.flash.core`` needs both.
"""
