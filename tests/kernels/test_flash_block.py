"""The core's block-local path (kernels/flash/_block.py) against float64.

Block attention with one offsets tensor on both sides and ``block`` a power of two <= 128 runs
the block-local kernels (one pass per block; the backward recomputes the softmax, reads no o or
lse). Under the interpreter (CPU) the tiles are 16 rows, so block 8 puts two blocks in a tile
(block-diagonal mask) and block 16 one; lengths 0, 1 and ones not a multiple of the block.
Outputs are poisoned with NaN before each launch.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels.attention.reference import attention_reference
from kernels.flash import tiles
from kernels.flash.core import attention_bwd, attention_fwd
from kernels.flash.options import BlockTiles, FlashOptions

LENS = [17, 0, 40, 3, 1, 16]
LAUNCHED: dict = {}  # the kernels each test's core calls launched (``launched=``)


@pytest.fixture(autouse=True)
def _launched():
    LAUNCHED.clear()


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _run(lens, *, weight, causal, block, dtype=torch.float32, H=2, D=16, seed=0, same=True, flash=FlashOptions()):
    """(o, lse, dq, dk, dv) of the core and the float64 reference's (o, lse, grads)."""
    gen = torch.Generator().manual_seed(seed)
    off = torch.tensor([0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()])
    T = int(off[-1])
    q, k, v, do = (torch.randn(T, H, D, generator=gen, dtype=torch.float64).to(dtype).double()
                   for _ in range(4))
    scale = 1 / math.sqrt(D) if weight == "softmax" else 1 / max(max(lens, default=0), 1)
    kw = dict(weight=weight, scale=scale, causal=causal, block=block)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    ref = attention_reference(qr, kr, vr, off, off, **kw)
    if ref.requires_grad:
        ref.backward(do)
    grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in (qr, kr, vr)]
    dev = lambda t: t.to(device=_device(), dtype=dtype)  # noqa: E731
    q_off = off.to(_device())
    kv_off = q_off if same else q_off.clone()
    args = (dev(q), dev(k), dev(v), q_off, kv_off, max(lens, default=0), max(lens, default=0))
    run = dict(flash=flash, poison_outputs=True, launched=LAUNCHED)  # outputs poisoned with NaN
    o, lse = attention_fwd(*args, **kw, **run)
    dq, dk, dv = attention_bwd(dev(do), *args[:3], o, lse, *args[3:], **kw, **run)
    # reference lse: log-sum-exp of each row's masked scaled scores
    ref_lse = torch.full((H, T), float("-inf"), dtype=torch.float64)
    for b in range(len(lens)):
        s0, n = int(off[b]), lens[b]
        s = torch.einsum("ihd,jhd->hij", q[s0:s0 + n], k[s0:s0 + n]) * scale
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        m = (i // block) == (j // block)
        if causal:
            m = m & (j <= i)
        ref_lse[:, s0:s0 + n] = torch.logsumexp(s.masked_fill(~m, float("-inf")), -1)
    return (o, lse, dq, dk, dv), (ref.detach(), ref_lse, *grads)


def _check(lens, *, weight, causal, block, dtype=torch.float32, tol=None, **kw):
    got, ref = _run(lens, weight=weight, causal=causal, block=block, dtype=dtype, **kw)
    if tol is None:
        tol = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1e-2}[dtype]
    for name, x, r in zip(("o", "lse", "dq", "dk", "dv"), got, ref):
        if name == "lse":
            if weight != "softmax":
                assert x.numel() == 0
                continue
            assert x.shape == r.shape and x.dtype == torch.float32
            assert torch.allclose(x.cpu().double(), r, atol=1e-4, rtol=1e-4), (x, r)
            continue
        assert x.shape == r.shape and x.dtype == dtype, name
        assert not torch.isnan(x).any(), f"{name} has unwritten (NaN) elements"
        if r.numel() == 0:
            continue
        err = float((x.cpu().double() - r).norm() / r.norm().clamp_min(1e-30))
        assert err < tol, (name, err)


@pytest.mark.parametrize("weight", ["softmax", "silu"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [8, 16])
def test_block_local(weight, causal, block):
    _check(LENS, weight=weight, causal=causal, block=block)
    assert set(LAUNCHED) == {"block_fwd", "block_bwd"}


def test_block_local_bf16_gelu_and_wide_tiles():
    """bf16 operands; and a 32-row tile over four 8-token blocks, one tile per program."""
    _check(LENS, weight="softmax", causal=True, block=16, dtype=torch.bfloat16)
    wide = FlashOptions(block_fwd=BlockTiles(32, 1, 4, 1), block_bwd=BlockTiles(32, 1, 4, 1))
    _check(LENS, weight="gelu", causal=False, block=8, flash=wide)


def test_block_local_empty_and_single():
    _check([0, 0], weight="softmax", causal=False, block=16)
    _check([1], weight="softmax", causal=True, block=8)
    _check([1, 0], weight="relu2", causal=False, block=8)
    assert "block_bwd" in LAUNCHED


def test_generic_path_when_switched_off_or_offsets_differ():
    """The switch and distinct offsets tensors select the FA2 kernels; same results."""
    _check(LENS, weight="softmax", causal=False, block=16, flash=FlashOptions(block_local=False))
    assert "block_fwd" not in LAUNCHED and "dkdv" in LAUNCHED
    LAUNCHED.clear()
    _check(LENS, weight="silu", causal=True, block=8, same=False)
    assert "block_fwd" not in LAUNCHED
    assert not tiles.use_block_local(torch.zeros(3), torch.zeros(3), 16)  # distinct storages
    off = torch.zeros(3)
    assert tiles.use_block_local(off, off, 64) and not tiles.use_block_local(off, off, 48)
    assert not tiles.use_block_local(off, off, 256)
