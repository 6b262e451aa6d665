"""The Triton attention core (kernels/flash) against a float64 PyTorch computation.

On CPU the kernels run under Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1
before triton is imported), at tiny shapes with the interpreter's small tiles, so every tile
boundary case (ragged tails, causal diagonal, block edges, empty samples) shows up; the GPU
tests (marked) run real shapes in bf16. Outputs are poisoned with NaN before each launch.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels.attention.reference import ACTIVATIONS, attention_reference
from kernels.flash.core import attention_bwd, attention_fwd
from kernels.flash.options import BlockTiles, Config, FlashOptions, Tiles
from kernels.flash.work import WorkCache, work

WEIGHTS = ["softmax", *ACTIVATIONS]
POISON = dict(poison_outputs=True)  # every core call here: outputs filled with NaN first


def _offsets(lens, dtype=torch.int64):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=dtype)


def _rel(x, ref):
    ref = ref.double()
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def _check(q_lens, kv_lens, *, weight, causal=False, block=0, H=2, D=16, dtype=torch.float32,
           device="cpu", tol=None, off_dtype=torch.int64, seed=0, strided=False, flash=FlashOptions(),
           launched=None):
    """Forward and backward against float64; returns the relative errors. ``strided``: q, k, v
    (self attention) are views into one ``[T, 3, H, D]`` tensor and ``do`` a view too, as a fused
    qkv projection gives them."""
    gen = torch.Generator().manual_seed(seed)
    q_off, kv_off = _offsets(q_lens, off_dtype), _offsets(kv_lens, off_dtype)
    Tq, Tk = int(q_off[-1]), int(kv_off[-1])
    q = torch.randn(Tq, H, D, generator=gen, dtype=torch.float64)
    k = torch.randn(Tk, H, D, generator=gen, dtype=torch.float64)
    v = torch.randn(Tk, H, D, generator=gen, dtype=torch.float64)
    do = torch.randn(Tq, H, D, generator=gen, dtype=torch.float64)
    max_q, max_kv = max(q_lens, default=0), max(kv_lens, default=0)
    scale = 1 / math.sqrt(D) if weight == "softmax" else 1 / max(max_kv, 1)
    # Round the operands to the tested dtype first so the reference sees the same inputs.
    q, k, v, do = (t.to(dtype).double() for t in (q, k, v, do))
    # the float64 reference on the test's device: on CUDA its padded path (one bmm per shape; the
    # CPU's exact causal path loops over 4,096 query positions at the real shapes: minutes)
    qr, kr, vr = (t.clone().to(device).requires_grad_() for t in (q, k, v))
    ref = attention_reference(qr, kr, vr, q_off.to(device), kv_off.to(device), weight=weight, scale=scale,
                              causal=causal, block=block)
    if ref.requires_grad:  # (no sample with both queries and keys: no graph)
        ref.backward(do.to(device))
    ref = ref.detach().cpu()
    grads = [torch.zeros_like(t) if t.grad is None else t.grad.cpu() for t in (qr, kr, vr)]

    dev = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    qd, kd, vd, dod = dev(q), dev(k), dev(v), dev(do)
    if strided:
        qd, kd, vd = dev(torch.stack([q, k, v], dim=1)).unbind(1)
        dod = dev(torch.stack([do, do], dim=1))[:, 1]
        assert not qd.is_contiguous() and not dod.is_contiguous()
    args = (qd, kd, vd, q_off.to(device), kv_off.to(device), max_q, max_kv)
    kw = dict(weight=weight, scale=scale, causal=causal, block=block, flash=flash, launched=launched, **POISON)
    o, lse = attention_fwd(*args, **kw)
    dq, dk, dv = attention_bwd(dod, args[0], args[1], args[2], o, lse, *args[3:], **kw)
    outs = {"o": (o, ref), "dq": (dq, grads[0]), "dk": (dk, grads[1]), "dv": (dv, grads[2])}
    errs = {}
    for name, (x, r) in outs.items():
        assert x.shape == r.shape and x.dtype == dtype, name
        assert not torch.isnan(x).any(), f"{name} has unwritten (NaN) elements"
        errs[name] = _rel(x.cpu(), r.detach()) if r.numel() and r.abs().max() > 0 else (
            float(x.abs().max()) if x.numel() else 0.0)
    if weight == "softmax":
        assert lse.shape == (H, Tq) and lse.dtype == torch.float32
        assert not torch.isnan(lse).any()
    else:
        assert lse.numel() == 0
    if tol is None:
        tol = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1e-2}[dtype]
    assert all(e < tol for e in errs.values()), errs
    return errs


# ---- interpreter (CPU) and GPU alike: small shapes -------------------------------------------------
JAGGED = [17, 0, 40, 3]  # lengths across tile edges (CPU tiles: 32 query rows, 16 key rows)


def _small_device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("causal,block", [(False, 0), (True, 0), (False, 16), (True, 8)])
def test_self_attention(weight, causal, block):
    _check(JAGGED, JAGGED, weight=weight, causal=causal, block=block, device=_small_device())


@pytest.mark.parametrize("weight", ["softmax", "silu"])
def test_dense_kv_and_dense_q(weight):
    """Jagged queries over a dense K/V of 5 rows per sample, and dense queries (N=5) over a
    jagged K/V with an empty sample (its output rows are 0)."""
    _check([17, 0, 33, 1], [5, 5, 5, 5], weight=weight, device=_small_device())
    _check([5, 5, 5, 5], [17, 0, 33, 1], weight=weight, device=_small_device(),
           off_dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight", ["softmax", "gelu"])
def test_half_precision(weight, dtype):
    _check([1, 20, 35], [1, 20, 35], weight=weight, causal=True, D=32, dtype=dtype,
           device=_small_device())


def test_unaligned_block_and_other_tiles():
    """A block width that is not a power of two (every tile masked), and other tile shapes
    including the atomic-dQ variant."""
    dev = _small_device()
    _check(JAGGED, JAGGED, weight="softmax", block=5, device=dev)
    cfg = Config(Tiles(16, 32, 4, 1), Tiles(16, 32, 4, 1), Tiles(16, 32, 4, 1), atomic_dq=True)
    _check(JAGGED, JAGGED, weight="softmax", causal=True, device=dev, flash=FlashOptions(tiles=cfg))
    _check(JAGGED, JAGGED, weight="relu2", block=16, device=dev, flash=FlashOptions(tiles=cfg))


# the one-kernel short-side backward; under the interpreter its long-side tiles are 16 rows
FUSED_SHORT = Config(Tiles(32, 16, 4, 1), Tiles(32, 16, 4, 1), Tiles(32, 16, 4, 1), fused_short=Tiles(16, 0, 4, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weight", ["softmax", "silu", "gelu"])
@pytest.mark.parametrize("short_q", [False, True])
def test_fused_short_side_backward(short_q, weight, dtype):
    """Cross attention with a short side (``Config.fused_short``): one program per (sample,
    head) gives every gradient of the float64 reference, both ways round, with a sample whose
    long side is empty (its short side's gradients are zero, not left unwritten: outputs are
    poisoned) and one whose short side is empty; softmax's delta comes from P and dP (long
    queries) or from O and dO (short queries)."""
    long, short = [17, 0, 40, 3, 5], [5, 3, 0, 7, 1]
    q_lens, kv_lens = (short, long) if short_q else (long, short)
    launched = {}
    _check(q_lens, kv_lens, weight=weight, dtype=dtype, device=_small_device(), flash=FlashOptions(tiles=FUSED_SHORT),
           launched=launched)
    assert "short_bwd" in launched


def test_fused_short_side_backward_leaves_self_attention_to_the_two_kernels():
    """Causal self attention and sides longer than ``SHORT_SIDE`` never take the fused path."""
    launched, flash = {}, FlashOptions(tiles=FUSED_SHORT)
    _check(JAGGED, JAGGED, weight="softmax", causal=True, device=_small_device(), flash=flash, launched=launched)
    _check([70, 3], [65, 2], weight="silu", device=_small_device(), flash=flash, launched=launched)
    assert "short_bwd" not in launched


@pytest.mark.parametrize("weight,causal,block", [("softmax", True, 0), ("silu", True, 0), ("softmax", False, 8)])
def test_strided_views_of_a_fused_qkv(weight, causal, block):
    """q, k, v as views into one [T, 3, H, D] projection (head dim contiguous, no copy made)."""
    _check(JAGGED, JAGGED, weight=weight, causal=causal, block=block, device=_small_device(), strided=True)


def test_empty_and_single():
    dev = _small_device()
    _check([0, 0], [0, 0], weight="softmax", device=dev)
    _check([1], [1], weight="softmax", causal=True, device=dev)
    _check([1, 0], [1, 0], weight="silu", device=dev)


@pytest.mark.parametrize("reverse", [False, True])
def test_work_list_covers_every_tile_once_longest_first(reverse):
    """The plan: every (sample, tile) exactly once, samples by the other side's length
    descending, records past the last item marked -1 (the grid is a bound, no host sync)."""
    q_lens, kv_lens = [5, 0, 70, 33, 1, 64], [9, 3, 2, 40, 0, 7]
    q_off, kv_off = _offsets(q_lens), _offsets(kv_lens)
    n_items, plan = work(q_off, kv_off, 32, max(q_lens), sum(q_lens), reverse=reverse)
    recs = plan[:, :5].tolist()
    assert n_items == len(recs) >= sum(-(-n // 32) for n in q_lens)
    valid = [r for r in recs if r[4] >= 0]
    assert all(r[4] < 0 for r in recs[len(valid):])  # invalid records only at the end
    expect = {(int(q_off[b]), q_lens[b], int(kv_off[b]), kv_lens[b], t)
              for b in range(len(q_lens)) for t in range(-(-q_lens[b] // 32))}
    assert sorted(map(tuple, valid)) == sorted(expect)
    other = [r[3] for r in valid]
    assert other == sorted(other, reverse=True)
    tiles = [r[4] for r in valid if r[0] == int(q_off[2])]  # sample 2: 3 tiles
    assert tiles == ([2, 1, 0] if reverse else [0, 1, 2])


def test_work_lists_are_reused_for_the_same_offsets_and_rebuilt_after_a_write():
    """The core builds a work list once per offsets tensors (a step's layers share them), and
    never serves a list for offsets whose contents may have changed: an in-place write, or other
    tensors at the same address."""
    lens = [5, 40, 17]
    off = _offsets(lens)
    for cache in (WorkCache(), WorkCache.of(off)):  # one the caller holds; the one off carries (the ops')
        _work = lambda o, tile=16: work(o, o, tile, 40, sum(lens), reverse=False, cache=cache)  # noqa: E731
        first = _work(off)
        assert _work(off) is first  # reused
        assert _work(off, 32) is not first  # other tiles: its own
        off.copy_(_offsets([40, 5, 17]))  # same tensor, new contents
        again = _work(off)
        assert again is not first
        assert again[1][0, 1].item() == 40  # the longest sample (now the first) leads
        clone = off.clone()  # equal contents, another tensor: not served from the cache
        assert _work(clone) is not again
        with cache.scope():  # a capture's own lists: cleared on entry and exit
            inner = _work(off)
            assert inner is not again and _work(off) is inner
        assert _work(off) is not inner
        off.copy_(_offsets(lens))
    with torch.inference_mode():  # inference tensors have no version counter: built, not cached
        inf = _offsets(lens)
        assert WorkCache.of(inf) is None
        cache = WorkCache()
        assert work(inf, inf, 16, 40, sum(lens), False, cache) is not work(inf, inf, 16, 40, sum(lens), False, cache)


def test_errors():
    q = torch.zeros(4, 2, 16)
    off = torch.tensor([0, 4])
    with pytest.raises(ValueError, match="weight 'tanh' is unknown"):
        attention_fwd(q, q, q, off, off, 4, 4, weight="tanh", scale=1.0)
    with pytest.raises(ValueError, match="head dim D=24"):
        z = torch.zeros(4, 2, 24)
        attention_fwd(z, z, z, off, off, 4, 4, weight="softmax", scale=1.0)
    with pytest.raises(ValueError, match="causal/block masks are for self attention"):
        attention_fwd(q, q[:3], q[:3], off, torch.tensor([0, 3]), 4, 3, weight="softmax",
                      scale=1.0, causal=True)


def test_flash_options_round_trip_through_ints():
    """``FlashOptions.to_ints`` / ``from_ints`` (a custom op's ``int[]``) keep every field."""
    cfg = Config(Tiles(64, 32, 4, 3), Tiles(64, 32, 4, 2), Tiles(128, 64, 8, 3), fused_short=Tiles(32, 0, 4, 3))
    for opts in (FlashOptions(), FlashOptions(False, False, cfg, poison=True, tma="off"),
                 FlashOptions(block_fwd=BlockTiles(64, 1, 4, 1), block_bwd=BlockTiles(64, 4, 4, 3), tma="on")):
        assert FlashOptions.from_ints(opts.to_ints()) == opts
    with pytest.raises(ValueError, match="FlashOptions.tma 'yes' is unknown; use one of auto, on, off"):
        FlashOptions(tma="yes")


# ---- TMA tile loads (kernels/flash/_tma.py) -------------------------------------------------------
@pytest.mark.parametrize("weight,causal,kv", [("softmax", True, None), ("silu", True, None), ("silu", False, None),
                                              ("gelu", False, None), ("softmax", False, [5, 33, 0, 16])])
def test_tma_loads_match_the_reference_and_the_pointer_kernels(weight, causal, kv):
    """The TMA forward and dK/dV kernels (forced under the interpreter with ``tma="on"``) against
    float64, and equal to the pointer kernels: a tile that runs past its sample reads the next
    sample's rows, which the masks must drop."""
    kv = kv or JAGGED
    on = _check(JAGGED, kv, weight=weight, causal=causal, dtype=torch.bfloat16, flash=FlashOptions(tma="on"))
    off = _check(JAGGED, kv, weight=weight, causal=causal, dtype=torch.bfloat16, flash=FlashOptions(tma="off"))
    assert on == off


@pytest.mark.parametrize("block", [16, 12])
def test_tma_loads_with_block_masks(block):
    """Block masks on the tiled path (aligned blocks clamp the tiles, unaligned ones mask every tile)."""
    flash = dict(block_local=False)
    on = _check(JAGGED, JAGGED, weight="softmax", block=block, dtype=torch.bfloat16, flash=FlashOptions(tma="on", **flash))
    assert on == _check(JAGGED, JAGGED, weight="softmax", block=block, dtype=torch.bfloat16,
                        flash=FlashOptions(tma="off", **flash))


def test_tma_loads_of_strided_views_of_a_fused_qkv():
    """Views into one [T, 3, H, D] projection: the descriptor's row stride is 3·H·D."""
    _check(JAGGED, JAGGED, weight="silu", causal=True, dtype=torch.bfloat16, strided=True, flash=FlashOptions(tma="on"))


def test_which_calls_take_tma_loads():
    """``use_tma``: 16-bit tensors whose rows a descriptor can address, on a sm_90+ GPU (``auto``)
    or anywhere (``on``); never with ``off`` or in fp32."""
    from kernels.flash.tiles import use_tma

    q = torch.zeros(8, 2, 16, dtype=torch.bfloat16)
    assert use_tma(q, FlashOptions(tma="on")) and not use_tma(q, FlashOptions(tma="off"))
    assert use_tma(q, FlashOptions()) == (q.is_cuda and torch.cuda.get_device_capability()[0] >= 9)
    assert not use_tma(q.float(), FlashOptions(tma="on"))
    odd_rows = torch.zeros(8, 2 * 16 + 1, dtype=torch.bfloat16)[:, :32].view(8, 2, 16)  # 66-byte row stride
    assert not use_tma(q, FlashOptions(tma="on"), odd_rows)
    assert not use_tma(q, FlashOptions(tma="on"), q[:0])


# ---- GPU, real shapes ----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("weight,causal,block", [
    ("softmax", True, 0), ("softmax", False, 0), ("softmax", False, 64), ("silu", False, 0),
    ("gelu", True, 0), ("relu2", False, 0),
])
def test_gpu_real_shapes(weight, causal, block, D):
    lens = [4096, 1, 0, 777, 2048, 130]
    _check(lens, lens, weight=weight, causal=causal, block=block, H=2, D=D,
           dtype=torch.bfloat16, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("weight,causal", [("softmax", True), ("silu", False), ("gelu", True)])
def test_gpu_pointer_loads(weight, causal):
    """The pointer-load kernels (``tma="off"``; on a GPU without TMA they are the default)."""
    lens = [1024, 1, 0, 777, 130, 300]
    _check(lens, lens, weight=weight, causal=causal, H=2, D=128, dtype=torch.bfloat16, device="cuda",
           flash=FlashOptions(tma="off"))


@pytest.mark.gpu
@pytest.mark.parametrize("weight,causal,block", [
    ("silu", False, 0), ("softmax", False, 0), ("softmax", True, 0), ("softmax", False, 64),
])
def test_gpu_short_lengths(weight, causal, block):
    """Max length <= 512 / 1024: the table's short-tile configs."""
    lens = [512, 1, 0, 300, 130, 257, 64]
    _check(lens, lens, weight=weight, causal=causal, block=block, H=2, D=128,
           dtype=torch.bfloat16, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("weight", ["silu", "gelu"])
def test_gpu_causal_activation_up_to_1024(weight):
    """Causal GDPA with lengths <= 1024: the table's 64x32 tiles for activation weights
    (``_SHORT_CAUSAL_ACT``), ragged tails, a length-0 and a length-1 sample."""
    lens = [1024, 1, 0, 700, 513, 64, 1000]
    _check(lens, lens, weight=weight, causal=True, H=2, D=128, dtype=torch.bfloat16, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("short_q", [False, True])
def test_gpu_cross_with_a_short_side(short_q):
    """Cross attention with 32 rows a sample on one side and up to 1024 on the other (GEM's
    non-sequence tokens against the sequence, both ways): the table's ``SHORT_SIDE_CONFIG`` tiles."""
    long = [1024, 0, 700, 513, 1, 900]
    short = [32] * len(long)
    q_lens, kv_lens = (short, long) if short_q else (long, short)
    launched = {}
    _check(q_lens, kv_lens, weight="softmax", H=2, D=128, dtype=torch.bfloat16, device="cuda", launched=launched)
    assert "short_bwd" in launched  # the table's one-kernel backward


@pytest.mark.gpu
@pytest.mark.parametrize("short_q", [False, True])
def test_gpu_cross_with_a_short_side_two_kernel_backward(short_q):
    """The same shapes through the two-kernel backward (``FlashOptions(fused_short=False)``; the
    table's ``SHORT_SIDE_CONFIG`` runs the one-kernel ``fused_short`` backward)."""
    long = [1024, 0, 700, 513, 1, 900]
    short = [32] * len(long)
    q_lens, kv_lens = (short, long) if short_q else (long, short)
    launched = {}
    _check(q_lens, kv_lens, weight="softmax", H=2, D=128, dtype=torch.bfloat16, device="cuda",
           flash=FlashOptions(fused_short=False), launched=launched)
    assert "short_bwd" not in launched


@pytest.mark.gpu
def test_gpu_dense_kv():
    _check([1500, 0, 700, 3000], [256] * 4, weight="silu", H=2, D=128, dtype=torch.bfloat16,
           device="cuda")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("weight,causal,block,cross,fused", [
    ("silu", True, 0, None, False), ("softmax", True, 0, None, False), ("softmax", False, 4, None, False),
    ("softmax", False, 0, "q", False), ("softmax", False, 0, "kv", False),
    ("softmax", False, 0, "q", True), ("silu", False, 0, "kv", True),
])  # fmt: skip
def test_rows_outside_every_sample_come_back_zero(weight, causal, block, cross, fused, device):
    """A static-shape batch pads its jagged side with rows that belong to no sample: the core
    returns zeros there in o, dq, dk and dv (outputs are poisoned with NaN first), and the
    samples' rows exactly as without the padding."""
    gen = torch.Generator().manual_seed(3)
    lens, pad, H, D, N = [5, 0, 9, 3], 7, 2, 16, 4
    off = _offsets(lens)
    T = int(off[-1])
    dense_off = torch.arange(len(lens) + 1) * N
    q_off, kv_off = (off, dense_off) if cross == "q" else (dense_off, off) if cross == "kv" else (off, off)
    rows = lambda o: int(o[-1]) + (pad if o is off else 0)  # noqa: E731
    q, do = (torch.randn(rows(q_off), H, D, generator=gen).to(device) for _ in range(2))
    k, v = (torch.randn(rows(kv_off), H, D, generator=gen).to(device) for _ in range(2))
    off, dense_off = off.to(device), dense_off.to(device)
    q_off, kv_off = (off, dense_off) if cross == "q" else (dense_off, off) if cross == "kv" else (off, off)
    tiles = Tiles(32, 16, 4, 1) if device == "cpu" else Tiles(64, 32, 4, 3)
    fused_cfg = Config(tiles, tiles, tiles, fused_short=Tiles(16 if device == "cpu" else 32, 0, 4, 1))
    launched = {}
    kw = dict(weight=weight, scale=0.25, causal=causal, block=block, launched=launched, **POISON,
              flash=FlashOptions(tiles=fused_cfg) if fused else FlashOptions())
    res = {}
    for padded in (True, False):
        cut = lambda t, o: t if padded or o is not off else t[:T]  # noqa: E731
        args = (cut(q, q_off), cut(k, kv_off), cut(v, kv_off), q_off, kv_off, 9, 9)
        o, lse = attention_fwd(*args, **kw)
        res[padded] = (o, *attention_bwd(cut(do, q_off), *args[:3], o, lse, *args[3:], **kw))
    assert fused == ("short_bwd" in launched)
    for name, x, y, o in zip(("o", "dq", "dk", "dv"), res[True], res[False], (q_off, q_off, kv_off, kv_off)):
        if o is off:
            assert torch.equal(x[T:], torch.zeros_like(x[T:])), f"{name}: padding rows not zero"
        torch.testing.assert_close(x[: y.shape[0]], y, rtol=0, atol=0, msg=name)
