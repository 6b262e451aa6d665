"""Fused kernels of the sequence FFN ``ffn2(gelu(ffn1(x)))``: ``bias_gelu.py`` adds ffn1's bias
and applies exact GELU in one pass, and its backward produces the bias gradient in the same pass."""
