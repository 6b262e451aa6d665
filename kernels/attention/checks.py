"""Input checks of the attention family: one line naming the op, the field, the value and the fix.

No check reads a tensor's values (that would need a host sync): shapes, dtypes and devices only.
"""

from __future__ import annotations

import torch
from torch import Tensor

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_tensors(op: str, **tensors: Tensor) -> None:
    """Same dtype (bf16/fp16/fp32), device, heads and head dim (a power of two in 16..128):
    what the Triton core takes."""
    first_name, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        if t.dtype not in DTYPES:
            raise ValueError(f"{op}: {name}.dtype is {t.dtype}; use bfloat16, float16 or float32")
        if t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"{op}: {name} is {t.dtype} on {t.device} but {first_name} is "
                             f"{first.dtype} on {first.device}; give all of them one dtype and device")  # fmt: skip
        if t.shape[-2:] != first.shape[-2:]:
            raise ValueError(f"{op}: {name} has heads, head dim {tuple(t.shape[-2:])} but "
                             f"{first_name} has {tuple(first.shape[-2:])}; they must match")  # fmt: skip
    d = first.shape[-1]
    if d < 16 or d > 128 or d & (d - 1):
        raise ValueError(f"{op}: head dim {d} is not a power of two in 16..128; pad it to one")


def check_dims(op: str, name: str, t: Tensor, dims: int, layout: str) -> None:
    if t.dim() != dims:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; it must be {layout}")


def check_same(op: str, k: Tensor, v: Tensor, layout: str = "they must match") -> None:
    if v.shape != k.shape:
        raise ValueError(f"{op}: k, v have shapes {tuple(k.shape)}, {tuple(v.shape)}; {layout}")


def check_offsets(op: str, name: str, offsets: Tensor, like: Tensor, batch: int | None = None) -> None:
    """1-D int32/int64 ``[B+1]`` on ``like``'s device (``B`` checked when known); its values are
    not read (that would need a host sync)."""
    if offsets.device != like.device:
        raise ValueError(f"{op}: {name} is on {offsets.device} but the values are on {like.device}; "
                         "move it there")  # fmt: skip
    if offsets.dim() != 1 or offsets.shape[0] < 1 or offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: {name} is {offsets.dtype} of shape {tuple(offsets.shape)}; "
                         "it must be a 1-D int32 or int64 tensor [B+1]")  # fmt: skip
    if batch is not None and offsets.shape[0] != batch + 1:
        raise ValueError(f"{op}: {name} has {offsets.shape[0]} entries for a batch of {batch}; "
                         f"it must have B+1 = {batch + 1}")  # fmt: skip


def check_max_len(op: str, name: str, value) -> None:
    if not isinstance(value, (int, torch.SymInt)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{op}: {name} is {value!r}; pass an int >= the longest sample's length")
