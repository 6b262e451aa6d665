"""Profiler events → op classes (executor.profiling.classify), by name and region."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from executor.profiling import classify


@dataclass
class Event:  # the fields classify reads from a torch.profiler FunctionEvent
    name: str
    cpu_parent: "Event | None" = None
    sequence_nr: int = -1


def _chain(*names: str) -> Event:
    """The last name's event, each earlier name its parent."""
    e = None
    for n in names:
        e = Event(n, e)
    return e


@pytest.mark.parametrize("names,cls", [
    (("CompiledFunction", "## Call CompiledFxGraph fabc ##", "triton_poi_fused_gelu_4"), "elementwise"),
    (("CompiledFunctionBackward", "## Call CompiledFxGraph f1 ##", "triton_red_fused_sum_4"), "elementwise"),
    (("CompiledFunction", "## Call CompiledFxGraph f2 ##", "triton_per_fused__to_copy_native_layer_norm_0"), "norm"),
    (("CompiledFunction", "## Call CompiledFxGraph f3 ##", "aten::mm"), "gemm"),
    (("attention.gdpa", "gemtwin::gdpa_fwd"), "attention"),
    (("optimizer", "aten::_fused_adamw_"), "optimizer"),
    (("aten::index_select",), "other"),
    (("aten::add_",), "elementwise"),
])  # fmt: skip
def test_compiled_kernels_get_their_class(names, cls):
    assert classify(_chain(*names), {}) == cls
