"""Kernels, one folder per op: PyTorch reference, Triton kernel, torch-free ``cost.py``.

This package must stay importable without torch: the twin imports ``kernels.<op>.cost``.
"""
