"""Shared helpers of the attention-op tests: jagged inputs, poisoned allocations, comparison.

``compare`` runs an op and its float64 reference on the same values and returns the relative
errors ``‖out − ref‖ / ‖ref‖`` of the output and of the gradients w.r.t. q, k, v, with every
float tensor the op allocates (``torch.empty*``) filled with NaN first, so an element the
kernels never write shows up as NaN. ``opcheck_attention`` runs ``torch.library.opcheck`` on
the family's registered ops (forward and backward), keeping each op and its fake in sync.
"""

from __future__ import annotations

import contextlib
import math

import torch

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@contextlib.contextmanager
def poisoned_allocations():
    """Within the block, ``torch.empty``, ``torch.empty_like`` and ``Tensor.new_empty`` return
    NaN-filled float tensors (correct code never reads what it did not write)."""
    originals = {"empty": torch.empty, "empty_like": torch.empty_like}
    new_empty = torch.Tensor.new_empty

    def poison(t):
        if t.dtype in FLOATS and t.numel():
            t.fill_(math.nan)
        return t

    torch.empty = lambda *a, **k: poison(originals["empty"](*a, **k))
    torch.empty_like = lambda *a, **k: poison(originals["empty_like"](*a, **k))
    torch.Tensor.new_empty = lambda self, *a, **k: poison(new_empty(self, *a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = originals["empty"], originals["empty_like"]
        torch.Tensor.new_empty = new_empty


def offsets_of(lengths, device="cpu", dtype=torch.int64) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=dtype, device=device)


def randn(gen: torch.Generator, *shape, device="cpu") -> torch.Tensor:
    """Float64 normal values drawn on the CPU with ``gen`` (reproducible), moved to ``device``."""
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (absolute error when ref is 0); NaN anywhere gives NaN."""
    out, ref = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out).all():
        return math.nan
    diff, norm = float((out - ref).norm()), float(ref.norm())
    return diff / norm if norm > 0 else diff


def compare(op, ref, q, k, v, *, dtype, gen) -> dict[str, float]:
    """Errors of ``op(q, k, v)`` in ``dtype`` against ``ref`` in float64 on the same values.

    ``q, k, v``: float64 tensors; ``op``/``ref``: callables of ``(q, k, v)``.
    """
    low = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    high = [t.to(dtype).double().requires_grad_() for t in (q, k, v)]  # the same values
    with poisoned_allocations():
        out = op(*low)
    g = randn(gen, *out.shape, device=out.device)
    with poisoned_allocations():
        grads = torch.autograd.grad(out, low, g.to(dtype), materialize_grads=True)
    expected = ref(*high)
    ref_grads = torch.autograd.grad(expected, high, g, allow_unused=True, materialize_grads=True)
    errs = {"out": rel_err(out, expected)}
    for name, a, b in zip(("dq", "dk", "dv"), grads, ref_grads):
        errs[name] = rel_err(a, b)
    return errs


def opcheck_attention(kind, a, b, c, layout, q_off, kv_off, max_q, max_kv, weight, scale, causal=False,
                      block=0, recompute=False, flash=None):
    """``torch.library.opcheck`` of ``gemtwin::attention_<kind>_fwd`` (schema, fake, autograd
    registration, AOT dispatch: its traced graph includes the backward) and of ``_bwd`` (schema
    and fake) on these inputs, as ``kernels.attention.dispatch`` calls them."""
    from kernels.attention.op import OPS
    from kernels.attention.spec import FlashOptions

    flash = flash or FlashOptions()
    rest = (layout, q_off, kv_off, max_q, max_kv, weight, scale, causal, block, recompute, flash.to_ints())
    leaves = tuple(None if t is None else t.detach().requires_grad_() for t in (a, b, c))
    torch.library.opcheck(OPS[kind], (*leaves, *rest))
    o, lse = OPS[kind](a, b, c, *rest)
    bwd = getattr(torch.ops.gemtwin, f"attention_{kind}_bwd").default
    torch.library.opcheck(bwd, (torch.randn_like(o), a, b, c, o, lse, *rest), test_utils=("test_schema", "test_faketensor"))
