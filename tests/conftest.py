"""Shared fixtures. GPU tests are marked ``gpu`` and skip without CUDA.

Without CUDA, Triton kernels run under the interpreter: ``TRITON_INTERPRET=1`` is set here,
before any test module imports triton (the ``@triton.jit`` decorator reads it), unless the
caller already chose a value.

Hypothesis runs derandomized (the same examples on every run, so a CI run that passed once
passes again) and without hypothesis's per-example deadline (200 ms by default: a timed test
that a loaded machine fails); `HYPOTHESIS_PROFILE=explore pytest` draws fresh examples to hunt
for new cases.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None)  # no timed examples in CI
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
