"""Jagged reference attention against a per-sample dense float64 formula, lengths 0 and 1 included."""

import math

import pytest
import torch

from executor.attention import cross_attention, jagged_attention
from kernels.attention.reference import ACTIVATIONS

LENGTHS = [0, 1, 5, 3, 0, 9, 1]
H, D = 2, 4


def _jagged(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(total, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    offsets = torch.tensor([0] + lengths).cumsum(0)
    return q, k, v, offsets


def _dense_reference(q, k, v, offsets, *, kind, causal, block_size, activation, max_len):
    """Per sample: full L×L scores, mask, softmax (jfa/block) or act·mask/max_len (gdpa)."""
    out = torch.zeros_like(q)
    for b in range(len(offsets) - 1):
        s, e = int(offsets[b]), int(offsets[b + 1])
        L = e - s
        if L == 0:
            continue
        scores = torch.einsum("ihd,jhd->hij", q[s:e], k[s:e])
        i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
        mask = torch.ones(L, L, dtype=torch.bool)
        if causal:
            mask &= j <= i
        if kind == "block":
            mask &= (i // block_size) == (j // block_size)
        if kind == "gdpa":
            p = ACTIVATIONS[activation](scores) * mask / max_len
        else:
            p = torch.softmax((scores / math.sqrt(D)).masked_fill(~mask, -math.inf), dim=-1)
        out[s:e] = torch.einsum("hij,jhd->ihd", p, v[s:e])
    return out


CASES = [
    ("jfa", True, 64, "silu"), ("jfa", False, 64, "silu"),
    ("block", True, 2, "silu"), ("block", False, 4, "silu"), ("block", True, 64, "silu"),
    *[("gdpa", c, 64, act) for c in (True, False) for act in ACTIVATIONS],
]


@pytest.mark.parametrize("kind,causal,block_size,activation", CASES)
def test_matches_dense_formula(kind, causal, block_size, activation):
    q, k, v, offsets = _jagged(LENGTHS)
    args = dict(kind=kind, causal=causal, block_size=block_size, activation=activation, max_len=max(LENGTHS))
    got = jagged_attention(q, k, v, offsets, **args)
    assert got.shape == q.shape
    torch.testing.assert_close(got, _dense_reference(q, k, v, offsets, **args), rtol=1e-10, atol=1e-12)


def test_length_one_softmax_returns_its_value():
    q, k, v, offsets = _jagged([1])
    for kind in ("jfa", "block"):
        torch.testing.assert_close(jagged_attention(q, k, v, offsets, kind=kind, max_len=1), v)


def test_all_empty_and_gradients_flow():
    q, k, v, offsets = _jagged([0, 0])
    assert jagged_attention(q, k, v, offsets, max_len=0).shape == (0, H, D)
    q, k, v, offsets = _jagged(LENGTHS)
    for t in (q, k, v):
        t.requires_grad_(True)
    for kind in ("jfa", "gdpa", "block"):
        assert torch.autograd.gradcheck(
            lambda q, k, v: jagged_attention(q, k, v, offsets, kind=kind, block_size=2, max_len=9),
            (q, k, v),
        )


def test_unknown_kind_is_one_line():
    q, k, v, offsets = _jagged([2])
    with pytest.raises(ValueError, match="attention kind 'flash' is unknown; use jfa, gdpa or block"):
        jagged_attention(q, k, v, offsets, kind="flash")


def test_cross_attention_both_directions():
    q, k, v, offsets = _jagged(LENGTHS)
    B, N = len(LENGTHS), 3
    g = torch.Generator().manual_seed(1)
    qd, kd, vd = (torch.randn(B, N, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    got_q = cross_attention(q, kd, vd, offsets, jagged="q", max_len=9)
    got_kv = cross_attention(qd, k, v, offsets, jagged="kv", max_len=9)
    for b in range(B):
        s, e = int(offsets[b]), int(offsets[b + 1])
        p = torch.softmax(torch.einsum("ihd,jhd->hij", q[s:e], kd[b]) / math.sqrt(D), -1)
        torch.testing.assert_close(got_q[s:e], torch.einsum("hij,jhd->ihd", p, vd[b]))
        if e == s:
            assert torch.equal(got_kv[b], torch.zeros(N, H, D, dtype=torch.float64))
            continue
        p = torch.softmax(torch.einsum("ihd,jhd->hij", qd[b], k[s:e]) / math.sqrt(D), -1)
        torch.testing.assert_close(got_kv[b], torch.einsum("hij,jhd->ihd", p, v[s:e]))


@pytest.mark.parametrize("kind", ["jfa", "gdpa", "block"])
@pytest.mark.parametrize("causal", [True, False])
def test_padded_path_equals_exact_pairs(kind, causal):
    """The GPU path (padded, masked, recomputed in backward) has the same outputs and gradients."""
    q, k, v, offsets = _jagged(LENGTHS)
    for t in (q, k, v):
        t.requires_grad_(True)
    kw = dict(kind=kind, causal=causal, block_size=4, activation="silu", max_len=9)
    exact = jagged_attention(q, k, v, offsets, padded=False, **kw)
    padded = jagged_attention(q, k, v, offsets, padded=True, **kw)
    torch.testing.assert_close(padded, exact)
    g = torch.randn_like(exact)
    for a, b in zip(torch.autograd.grad(exact, (q, k, v), g), torch.autograd.grad(padded, (q, k, v), g)):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize("jagged", ["q", "kv"])
def test_padded_cross_attention_equals_exact(jagged):
    q, k, v, offsets = _jagged(LENGTHS)
    B, N = len(LENGTHS), 3
    g = torch.Generator().manual_seed(2)
    dense = [torch.randn(B, N, H, D, generator=g, dtype=torch.float64) for _ in range(3)]
    args = (q, dense[1], dense[2]) if jagged == "q" else (dense[0], k, v)
    for t in args:
        t.requires_grad_(True)
    exact = cross_attention(*args, offsets, jagged=jagged, max_len=9, padded=False)
    padded = cross_attention(*args, offsets, jagged=jagged, max_len=9, padded=True)
    torch.testing.assert_close(padded, exact)
    go = torch.randn_like(exact)
    for a, b in zip(torch.autograd.grad(exact, args, go), torch.autograd.grad(padded, args, go)):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("case", ["gdpa", "jfa", "block", "cross_q", "cross_kv"])
def test_packed_attention_equals_the_ops_on_views(case, recompute, device):
    """The executor's Triton path (``packed_*_attention``: fused projections in, one packed
    gradient out, optional recompute) gives exactly the ops' outputs and gradients on unbound
    views, with a length-0 sample and padding rows (zero gradient there)."""
    from executor.attention import packed_cross_attention, packed_self_attention

    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the Triton interpreter is off where CUDA is present")
    g = torch.Generator().manual_seed(1)
    lens, pad, N = [5, 0, 9, 3], 6, 4
    offsets = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()]).to(device)
    rows = sum(lens) + pad
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(device)  # noqa: E731
    if case in ("gdpa", "jfa", "block"):
        inputs = [rnd(rows, 3, 2, 16).requires_grad_()]
        grad = rnd(rows, 2, 16)
        kw = dict(kind=case, causal=True, block_size=4, activation="silu", max_len=9)
        packed = lambda x: packed_self_attention(x, offsets, recompute=recompute, **kw)  # noqa: E731
        plain = lambda x: jagged_attention(*x.unbind(1), offsets, kernel="triton", **kw)  # noqa: E731
    else:
        jagged = case[-1] if case == "cross_q" else "kv"
        shapes = ((rows, 2, 16), (4, N, 2, 2, 16)) if jagged == "q" else ((4, N, 2, 16), (rows, 2, 2, 16))
        inputs = [rnd(*s).requires_grad_() for s in shapes]
        grad = rnd(*shapes[0])
        packed = lambda q, kv: packed_cross_attention(q, kv, offsets, jagged=jagged, max_len=9,  # noqa: E731
                                                      recompute=recompute)
        plain = lambda q, kv: cross_attention(q, *kv.unbind(-3), offsets, jagged=jagged, max_len=9,  # noqa: E731
                                              kernel="triton")
    res = []
    for fn in (packed, plain):
        out = fn(*inputs)
        grads = torch.autograd.grad((out * grad).sum(), inputs)
        res.append((out, *grads))
    for x, y in zip(*res):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    jagged_input = res[0][1] if case != "cross_kv" else res[0][2]
    assert not jagged_input[sum(lens):].any()  # padding rows: zero gradient


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["gdpa", "cross_q", "cross_kv"])
def test_a_captured_attention_step_follows_new_offsets_on_replay(case):
    """CUDA graphs: the attention kernels' work lists (cached per offsets tensor) are rebuilt on
    every replay (lists cached before the capture are not used in it, kernels/flash/work.py), so a graph captured on
    one batch's offsets gives, replayed after new offsets and inputs are copied in, exactly what
    eager calls give on the new batch (outputs and gradients), for each of three batches."""
    from executor.attention import packed_cross_attention, packed_self_attention

    B, N, Hh, Dd, rows, max_len = 6, 4, 2, 64, 512, 128
    g = torch.Generator(device="cuda").manual_seed(0)

    def batch(lens):
        off = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda")
        if case == "gdpa":
            a, b = torch.randn(rows, 3, Hh, Dd, generator=g, device="cuda").bfloat16(), None
        elif case == "cross_q":
            a = torch.randn(rows, Hh, Dd, generator=g, device="cuda").bfloat16()
            b = torch.randn(B, N, 2, Hh, Dd, generator=g, device="cuda").bfloat16()
        else:
            a = torch.randn(B, N, Hh, Dd, generator=g, device="cuda").bfloat16()
            b = torch.randn(rows, 2, Hh, Dd, generator=g, device="cuda").bfloat16()
        return off, a, b, torch.randn(rows if case != "cross_kv" else B * N, Hh, Dd, generator=g, device="cuda")

    def step(off, a, b, go):
        ins = [t.requires_grad_() for t in (a, b) if t is not None]
        if case == "gdpa":
            o = packed_self_attention(a, off, kind="gdpa", causal=True, block_size=0, activation="silu",
                                      max_len=max_len)
        else:
            o = packed_cross_attention(a, b, off, jagged="q" if case == "cross_q" else "kv", max_len=max_len)
        return [o.detach(), *torch.autograd.grad(o, ins, go.view(o.shape).to(o.dtype))]

    lens = [[128, 3, 90, 0, 77, 100], [5, 128, 128, 60, 1, 120], [100, 100, 100, 100, 50, 2]]
    batches = [batch(l) for l in lens]
    static = [t.clone() if t is not None else None for t in batches[0]]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # on the static tensors themselves: their work lists are cached
        step(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step(*static)
    for new in batches[1:] + batches[:1]:
        for s_, n_ in zip(static, new):
            if s_ is not None:
                s_.detach().copy_(n_)
        graph.replay()
        expect = step(*[t.detach().clone() if t is not None else None for t in new])
        for got, want in zip(outs, expect):
            assert torch.equal(got, want)
