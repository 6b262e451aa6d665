"""Fused kernels of the sequence FFN ``ffn2(gelu(ffn1(x)))``: ``bias_gelu.py`` adds ffn1's bias
and applies exact GELU in one pass, and its backward produces the bias gradient in the same pass;
``epilogue.py`` puts the (tanh) GELU and its gradient into cuBLASLt's GEMM epilogues instead (a C++
extension, ``gelu_epilogue.cpp``), with no pass of its own."""
