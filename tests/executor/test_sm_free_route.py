"""The SM-free route is taken or refused in one line, never silently replaced (executor.collectives)."""

from __future__ import annotations

import pytest
import torch

import scenarios
from executor.collectives import SmFreeUnavailable, collective_path, process_group_options


def _scenario(sm_free: bool):
    return scenarios.load("gem-h200-2gpu", [f"parallelism.sm_free_collectives={str(sm_free).lower()}"])


def test_without_sm_free_the_group_takes_default_options():
    assert process_group_options(_scenario(False), "nccl") is None
    assert collective_path(_scenario(False), "nccl") == "nccl"
    assert collective_path(_scenario(True), "nccl") == "nccl-zero-cta"
    assert collective_path(_scenario(True), "gloo") == "gloo"


def test_sm_free_off_nccl_is_refused_in_one_line():
    with pytest.raises(SmFreeUnavailable, match=r"^parallelism.sm_free_collectives is true, but this run's "
                       r"collectives are gloo's .*: set parallelism.sm_free_collectives=false, or run on CUDA GPUs$"):
        process_group_options(_scenario(True), "gloo")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA build has NCCL: this checks a build without it")
def test_sm_free_without_nccl_names_the_version_it_needs():
    with pytest.raises(SmFreeUnavailable, match=r"^parallelism.sm_free_collectives needs NCCL >= 2.28, and this "
                       r"torch has NCCL none: set parallelism.sm_free_collectives=false"):
        process_group_options(_scenario(True), "nccl")
