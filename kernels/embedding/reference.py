"""PyTorch references of the table-batched lookups (any dtype; float64 for checks)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def pooled_reference(tables: Sequence[Tensor], bags: Sequence[tuple[Tensor, Tensor]], *,
                     mode: str = "sum", dtype: torch.dtype | None = None) -> Tensor:
    """``[B, T·dim]``: table ``t``'s pooled bags in columns ``t·dim : (t+1)·dim`` (``F.embedding_bag``)."""
    outs = []
    for w, (values, offsets) in zip(tables, bags):
        w = w if dtype is None else w.to(dtype)
        outs.append(F.embedding_bag(values, w, offsets, mode=mode, include_last_offset=True))
    return torch.cat(outs, dim=1)


def pooled_index_select(tables: Sequence[Tensor], bags: Sequence[tuple[Tensor, Tensor]], *,
                        mode: str = "sum") -> Tensor:
    """The same by ``index_select`` + a segment sum (``index_add_``), an independent route."""
    outs = []
    for w, (values, offsets) in zip(tables, bags):
        B = len(offsets) - 1
        counts = offsets.diff()
        bag = torch.repeat_interleave(torch.arange(B, device=w.device), counts, output_size=len(values))
        rows = w.index_select(0, values).float()
        out = torch.zeros(B, w.shape[1], dtype=torch.float32, device=w.device).index_add_(0, bag, rows)
        if mode == "mean":
            out = out / counts.clamp(min=1).unsqueeze(1).float()
        outs.append(out)
    return torch.cat(outs, dim=1)


def unpooled_reference(tables: Sequence[Tensor], ids: Sequence[Tensor], *,
                       dtype: torch.dtype | None = None) -> Tensor:
    """``[N, Σ dims]``: one row per token, the tables' rows side by side."""
    return torch.cat([(w if dtype is None else w.to(dtype))[i] for w, i in zip(tables, ids)], dim=1)
