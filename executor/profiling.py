"""Profiler events → per-step time by op class (``twin.runrecord.OP_CLASSES``).

Each CPU-side event's *self* time (CPU self time on CPU; on CUDA the device time of the kernels
it launched itself) goes to one class:

1. ``optimizer``: inside a ``record_function("optimizer")`` region;
2. ``attention``: inside a ``record_function("attention")`` region, or the backward of an op
   that ran there (autograd nodes carry the forward op's ``sequence_nr``);
3. otherwise by the nearest self-or-ancestor name: ``gemm`` (mm, addmm, bmm, baddbmm, matmul,
   linear, einsum and their backward nodes), ``embedding`` (embedding, embedding_bag and their
   backward), ``norm`` (layer_norm and its backward);
4. ``elementwise`` for element-wise and reduction ops (activations, arithmetic, softmax, copies,
   BCE), ``other`` for the rest (indexing, cat, top-k, autograd bookkeeping).
"""

from __future__ import annotations

import re

from torch.autograd import DeviceType

from twin.runrecord import OP_CLASSES

_BY_NAME = [
    ("gemm", re.compile(r"^(aten::)?(mm|addmm|bmm|baddbmm|matmul|linear|einsum|_addmm_activation)$"
                        r"|^(Mm|Addmm|Bmm|Baddbmm|Matmul|Linear)Backward", re.I)),
    ("embedding", re.compile(r"embedding", re.I)),
    ("norm", re.compile(r"layer_norm|LayerNormBackward", re.I)),
]
_ELEMENTWISE = re.compile(
    r"^(aten::)?_?(add|sub|rsub|mul|div|neg|abs|exp|log|pow|sqrt|rsqrt|square|clamp|where|threshold|"
    r"relu|gelu|silu|sigmoid|tanh|softmax|log_softmax|erf|fill|zero|copy|to|_to_copy|masked_fill|"
    r"binary_cross_entropy|maximum|minimum|sum|mean|lerp|addcmul|addcdiv)",
    re.I,
)


def _ancestors(e):
    while e is not None:
        yield e
        e = e.cpu_parent


def _is_backward(e) -> bool:
    return any("Backward" in a.name or a.name.startswith("autograd::engine") for a in _ancestors(e))


def _attention_seq(events) -> set[int]:
    """Sequence numbers of autograd nodes created inside the attention region.

    A forward op that creates no node reports the *next* number, so a number belongs to the
    last forward op (by start time) that reports it.
    """
    creator: dict[int, object] = {}
    for e in events:
        if e.sequence_nr >= 0 and not _is_backward(e):
            c = creator.get(e.sequence_nr)
            if c is None or e.time_range.start >= c.time_range.start:
                creator[e.sequence_nr] = e
    return {s for s, e in creator.items() if any(a.name == "attention" for a in _ancestors(e))}


def classify(e, attention_seq: set[int]) -> str:
    names = [a.name for a in _ancestors(e)]
    if "optimizer" in names:
        return "optimizer"
    if "attention" in names:
        return "attention"
    if any(a.sequence_nr in attention_seq and "Backward" in a.name for a in _ancestors(e)):
        return "attention"
    for name in names:
        for cls, pattern in _BY_NAME:
            if pattern.search(name):
                return cls
    return "elementwise" if _ELEMENTWISE.search(e.name) else "other"


def op_class_times(prof, *, per_steps: int, device: str = "cpu") -> dict[str, float]:
    """Seconds per step by op class over the profiled ``per_steps`` steps (all classes present)."""
    events = prof.events()
    seqs = _attention_seq(events)
    out = {c: 0.0 for c in OP_CLASSES}
    for e in events:
        if e.device_type != DeviceType.CPU:
            # GPU-side ranges (user annotations such as "attention") span kernels that their
            # CPU-side launchers already count: skip them, or time is counted twice.
            continue
        us = e.self_device_time_total if device == "cuda" else e.self_cpu_time_total
        if us > 0:
            out[classify(e, seqs)] += us * 1e-6 / max(per_steps, 1)
    return out
