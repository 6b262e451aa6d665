"""Benchmark of the jagged attention suite against padded SDPA, FlexAttention and the reference.

One device call runs it end to end (issue 5)::

    python3 -m kernels.attention.bench --out $OUT/attention_bench.json

Shapes: ``B=1152, H=4, d=128``, lengths uniform in ``[L/2, L]`` for ``L`` in 256..2048, plus a
heavy-tailed lognormal law (mean 512, max 4,096: ``kernels.attention.cost.heavy_tail_law``); cross
attention has 256 dense tokens per sample. For every case: correctness of our op at the bench
shape (poisoned outputs) against an exact baseline where one exists and against the float32
reference on a few samples, then forward and backward times (``triton.testing.do_bench``,
median; inputs are GBs, far beyond the 50 MB L2, and do_bench flushes L2 between calls).

TFLOP/s count the attended pairs of the *valid* tokens only (``kernels.attention.cost``:
``4·H·d`` FLOPs per pair forward, ``8·H·d`` backward — no recompute counted), for every
implementation alike, so a baseline's rate is its useful rate. Baselines, measured in the
same run:

- ``sdpa``: padded dense ``scaled_dot_product_attention`` on the flash backend (causal where
  the kernel is causal). Padding/unpadding is not timed. Exact for causal JFA and for jagged
  queries over dense K/V; for the others it attends padded keys (GDPA: softmax, not the
  activation) — the same work as a padded implementation, marked ``exact: false``.
- ``sdpa_masked``: dense queries over a padded jagged history with a key-padding mask
  (efficient backend; flash takes no mask): the exact padded baseline of ``dense_q_jagged_kv``.
- ``flex``: compiled FlexAttention over the padded batch ``[B, H, L_max, d]`` with a block
  mask from each sample's length (and causal / same-block rules), so fully padded tiles are
  skipped. (A document mask over the packed ``[1, H, ΣL, d]`` sequence would need
  ``create_block_mask`` to evaluate ``(ΣL)²`` ≈ 3·10¹² pairs at L=2048.) GDPA: FlexAttention
  always normalises with softmax, so the nearest is a ``silu`` score_mod — ``exact: false``.
- ``reference``: the family's reference (``kernel="reference"``: padded, masked bmm on CUDA)
  on the first 128 samples, TFLOP/s over those samples' pairs.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
import triton
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from kernels.attention import cost as costs
from kernels.attention import dispatch as family
from kernels.attention.spec import AttentionSpec as Spec
from kernels.attention.spec import FlashOptions

FA2_INDEX_LIMIT = 2**31 - 1  # see _sdpa
POISON = FlashOptions(poison=True)  # the checks: outputs filled with NaN before the kernels run
TARGETS = {  # issue 5
    "gdpa_fwd_tflops": 450.0, "gdpa_bwd_tflops": 300.0,
    "jfa_speedup_vs_sdpa": 2.0, "block_speedup_vs_flex": 2.0, "asym_speedup_vs_sdpa": 1.5,
}  # fmt: skip
torch._dynamo.config.cache_size_limit = 64  # one flex compile per mask/score_mod variant
torch._dynamo.config.accumulated_cache_size_limit = 512
# The backward is timed by calling autograd.grad repeatedly on one graph (retain_graph=True);
# compiled graphs that donate their saved buffers refuse that (H200 run of 2026-11-30: every flex
# row failed so), so buffer donation is off for this benchmark.
import torch._functorch.config as _functorch_config  # noqa: E402
_functorch_config.donated_buffer = False
_flex = torch.compile(flex_attention, dynamic=True)


# ---- inputs --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """The benchmark's shapes and device; every batch carries its own (``Batch.shape``)."""

    B: int = 1152
    H: int = 4
    D: int = 128
    n_dense: int = 256  # dense tokens a sample on the dense side
    block: int = 64
    device: str = "cuda"
    ref_samples: int = 128  # the reference is timed on this many samples
    check_samples: int = 6  # samples checked against the float32 reference (the longest among them)


FULL = Shape()
SMOKE = Shape(B=3, H=2, D=16, n_dense=4, block=16, device="cpu", ref_samples=2, check_samples=2)  # --smoke


@dataclass
class Batch:
    """One jagged batch: values ``[T, H, D]`` (q, k, v), offsets, and their padded forms."""

    lengths: list[int]
    q: Tensor
    k: Tensor
    v: Tensor
    offsets: Tensor
    max_len: int
    valid: Tensor  # [B, L_max] bool
    lens: Tensor  # [B] int32 on the device
    kd: Tensor  # dense K/V [B, N, H, D]
    vd: Tensor
    qd: Tensor  # dense queries [B, N, H, D]
    shape: Shape

    @classmethod
    def make(cls, lengths: list[int], seed: int, shape: Shape) -> Batch:
        dev, H, D, N = shape.device, shape.H, shape.D, shape.n_dense
        g = torch.Generator(device=dev).manual_seed(seed)
        T = sum(lengths)
        rnd = lambda *s: torch.randn(*s, generator=g, device=dev, dtype=torch.bfloat16)  # noqa: E731
        off = torch.tensor([0, *np.cumsum(lengths).tolist()], device=dev, dtype=torch.int64)
        L = max(lengths)
        lens = torch.tensor(lengths, device=dev, dtype=torch.int32)
        valid = torch.arange(L, device=dev)[None, :] < lens[:, None]
        B = len(lengths)
        return cls(lengths, rnd(T, H, D), rnd(T, H, D), rnd(T, H, D), off, L, valid, lens,
                   rnd(B, N, H, D), rnd(B, N, H, D), rnd(B, N, H, D), shape)  # fmt: skip

    def pad(self, x: Tensor) -> Tensor:
        """Jagged ``[T, H, D]`` → padded ``[B, H, L_max, D]`` (zeros past each length)."""
        out = x.new_zeros(len(self.lengths), self.max_len, *x.shape[1:])
        out[self.valid] = x
        return out.transpose(1, 2).contiguous()

    def unpad(self, x: Tensor) -> Tensor:
        return x.transpose(1, 2)[self.valid]

    def blocks(self, x: Tensor) -> Tensor:
        """Jagged → ``[n_blocks, H, block, D]``: every sample cut in blocks, zero-padded."""
        W = self.shape.block
        nb = -(-self.max_len // W)
        out = x.new_zeros(len(self.lengths), nb * W, *x.shape[1:])
        out[:, : self.max_len][self.valid] = x
        out = out.view(len(self.lengths) * nb, W, *x.shape[1:])
        used = (torch.arange(nb, device=x.device)[None, :] * W < self.lens[:, None]).reshape(-1)
        return out[used].transpose(1, 2).contiguous()


# ---- implementations of one case -------------------------------------------------------------
@dataclass
class Impl:
    """``args()`` makes fresh leaf inputs; ``run(*args)`` the output; ``jagged(out)`` maps the
    output to our op's layout for comparison (None: not comparable row by row)."""

    name: str
    args: Callable[[], tuple]
    run: Callable[..., Tensor]
    exact: bool
    jagged: Callable[[Tensor], Tensor] | None = None
    flops_scale: float = 1.0  # fraction of the batch the impl runs (the reference's subset)
    note: str = ""


@dataclass
class Lazy:
    """An implementation built only when measured (FlexAttention block masks, the reference)."""

    name: str
    make: Callable[[], Impl]


@dataclass
class Case:
    name: str
    kernel: str  # jfa | gdpa | block | asym
    L: int | str
    batch: Batch
    cost: object  # AttentionCost of the whole batch
    ours: Impl
    baselines: list[Impl] = field(default_factory=list)
    check: Callable[[], dict] | None = None  # vs the float32 reference on a few samples

    @property
    def lengths(self) -> list[int]:
        return self.batch.lengths


def _leaves(*ts: Tensor) -> tuple[Tensor, ...]:
    return tuple(t.detach().clone().requires_grad_() for t in ts)


def _sdpa(q, k, v, *, causal=False, mask=None, backend=SDPBackend.FLASH_ATTENTION, scale=None):
    """Padded SDPA ``[B, H, L, d]``, in batch chunks that keep FlashAttention-2's backward under
    ``B·H·round_up(L_q, 128)·max(d, 32) <= 2³¹`` (past it, its int32 ``dq_accum`` offsets
    overflow: illegal memory access; github.com/Dao-AILab/flash-attention/pull/1500,
    github.com/PriorLabs/TabPFN/pull/1184) — the lognormal case pads to 4,096."""
    Bq, Hq, Lq, d = q.shape
    per_sample = Hq * (-(-Lq // 128) * 128) * max(d, 32)
    chunk = max(1, FA2_INDEX_LIMIT // per_sample)
    with sdpa_kernel(backend if q.is_cuda else SDPBackend.MATH):
        outs = [F.scaled_dot_product_attention(
            q[i : i + chunk], k[i : i + chunk], v[i : i + chunk],
            attn_mask=None if mask is None else mask[i : i + chunk], is_causal=causal, scale=scale)
            for i in range(0, Bq, chunk)]  # fmt: skip
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _length_mask(lens: Tensor, *, causal=False, block=0, q_dense=False, kv_dense=False):
    """FlexAttention mask_mod: valid query and key rows of each sample (+ causal / block)."""

    def mask(b, h, qi, ki):
        ok = (qi < lens[b]) if not q_dense else (qi >= 0)
        ok = ok & ((ki < lens[b]) if not kv_dense else (ki >= 0))
        if causal:
            ok = ok & (ki <= qi)
        if block:
            ok = ok & (qi // block == ki // block)
        return ok

    return mask


def _flex_impl(bt: Batch, *, q_len, kv_len, mask_mod, score_mod=None, exact=True, q, kv,
               jagged=None, block_size=128) -> Impl:  # fmt: skip
    bm = create_block_mask(mask_mod, len(bt.lengths), None, q_len, kv_len, device=bt.shape.device,
                           BLOCK_SIZE=block_size, _compile=True)  # fmt: skip
    impl = Impl("flex", lambda: _leaves(*q(), *kv()),
                lambda q, k, v: _flex(q, k, v, score_mod=score_mod, block_mask=bm),
                exact, jagged, note=f"block mask of {block_size}-token tiles")  # fmt: skip
    if block_size != 128:  # flex's kernels may not take tiles finer than theirs: probe once
        try:
            impl.run(*impl.args()).sum().backward()
        except Exception as e:  # noqa: BLE001
            print(f"flex with BLOCK_SIZE={block_size} failed ({type(e).__name__}); using 128")
            return _flex_impl(bt, q_len=q_len, kv_len=kv_len, mask_mod=mask_mod,
                              score_mod=score_mod, exact=exact, q=q, kv=kv, jagged=jagged)  # fmt: skip
    return impl


def _silu_score(score, b, h, qi, ki):
    return score * torch.sigmoid(score)


def _subset(bt: Batch, n: int):
    """The first ``n`` samples' rows: (q, k, v, offsets, kd, vd, qd)."""
    n = min(n, len(bt.lengths))
    end = int(bt.offsets[n])
    return (bt.q[:end], bt.k[:end], bt.v[:end], bt.offsets[: n + 1], bt.kd[:n], bt.vd[:n],
            bt.qd[:n])  # fmt: skip


def _ref_impl(bt: Batch, f: Callable, total_pairs_fn: Callable[[list[int]], float],
              full_pairs: float) -> Impl:  # fmt: skip
    q, k, v, off, kd, vd, qd = _subset(bt, bt.shape.ref_samples)
    sub = bt.lengths[: len(off) - 1]
    return Impl("reference", lambda: _leaves(q, k, v, kd, vd, qd),
                lambda q, k, v, kd, vd, qd: f(q, k, v, off, kd, vd, qd, max(sub)), True, None,
                total_pairs_fn(sub) / full_pairs, note=f"first {len(sub)} samples")  # fmt: skip


def _ref(f: Callable) -> Callable:
    """The family's entry point ``f`` on the reference instead of the Triton core."""
    return functools.partial(f, kernel="reference")


def _checker(bt: Batch, call: Callable, dense_out=False) -> Callable[[], dict]:
    """Errors of our op (full batch, outputs poisoned with NaN first) vs the float32 reference
    (``call(..., kernel="reference")``) on the longest of a few samples."""

    def check():
        qd, kd, vd = bt.qd, bt.kd, bt.vd
        args = _leaves(bt.q, bt.k, bt.v, kd, vd, qd)
        out = call(*args, bt.offsets, bt.max_len, flash=POISON)
        do = torch.randn_like(out)
        grads = torch.autograd.grad(out, args, do, allow_unused=True, materialize_grads=True)
        picks = sorted(range(len(bt.lengths)), key=lambda b: -bt.lengths[b])[:1]
        picks += list(range(bt.shape.check_samples - 1))
        errs: dict[str, float] = {}
        for b in picks:
            s, e = int(bt.offsets[b]), int(bt.offsets[b + 1])
            one = torch.tensor([0, e - s], device=bt.shape.device)
            sub = [t.detach().float().requires_grad_() for t in (bt.q[s:e], bt.k[s:e], bt.v[s:e], kd[b:b+1], vd[b:b+1], qd[b:b+1])]  # fmt: skip
            r = call(*sub, one, bt.max_len, kernel="reference")
            if dense_out:
                o_ours, d_one = out[b : b + 1], do[b : b + 1]
            else:
                o_ours, d_one = out[s:e], do[s:e]
            rg = torch.autograd.grad(r, sub, d_one.float(), allow_unused=True, materialize_grads=True)
            pieces = {"out": (o_ours, r)}
            for name, i, sl in (("dq", 0, (s, e)), ("dk", 1, (s, e)), ("dv", 2, (s, e)),
                                ("dkd", 3, (b, b + 1)), ("dvd", 4, (b, b + 1)), ("dqd", 5, (b, b + 1))):  # fmt: skip
                pieces[name] = (grads[i][sl[0] : sl[1]], rg[i])
            for name, (a, want) in pieces.items():
                if want.abs().sum() == 0 and a.abs().sum() == 0:
                    continue
                err = _rel(a, want)
                errs[name] = max(errs.get(name, 0.0), err)
        return errs

    return check


def _rel(a: Tensor, b: Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    if not torch.isfinite(a).all():
        return math.nan
    n = float(b.norm())
    return float((a - b).norm()) / n if n else float((a - b).norm())


# ---- the cases ---------------------------------------------------------------------------------
def jfa_case(bt: Batch, L) -> Case:
    cost = costs.batch_cost(Spec("jfa", causal=True), bt.lengths, heads=bt.shape.H, head_dim=bt.shape.D)
    full = costs.self_pairs(np.array(bt.lengths, float), causal=True).sum()
    ours = Impl("ours", lambda: _leaves(bt.q, bt.k, bt.v),
                lambda q, k, v: family.jagged_flash_attention(q, k, v, bt.offsets, bt.max_len, causal=True), True)  # fmt: skip
    padded = lambda: (bt.pad(bt.q), bt.pad(bt.k), bt.pad(bt.v))  # noqa: E731
    base = [
        Impl("sdpa", lambda: _leaves(*padded()), lambda q, k, v: _sdpa(q, k, v, causal=True), True, bt.unpad),
        Lazy("flex", lambda: _flex_impl(bt, q_len=bt.max_len, kv_len=bt.max_len, mask_mod=_length_mask(bt.lens, causal=True),
                           q=padded, kv=lambda: (), jagged=bt.unpad)),
        Lazy("reference", lambda: _ref_impl(bt, lambda q, k, v, off, kd, vd, qd, n: _ref(family.jagged_flash_attention)(q, k, v, off, n, causal=True),
                          lambda ls: costs.self_pairs(np.array(ls, float), causal=True).sum(), full)),
    ]  # fmt: skip
    check = _checker(bt, lambda q, k, v, kd, vd, qd, off, n, **kw: family.jagged_flash_attention(q, k, v, off, n, **kw))  # fmt: skip
    return Case("jfa_causal", "jfa", L, bt, cost, ours, base, check)


def gdpa_case(bt: Batch, L) -> Case:
    cost = costs.batch_cost(Spec("gdpa"), bt.lengths, heads=bt.shape.H, head_dim=bt.shape.D)
    full = np.square(np.array(bt.lengths, float)).sum()
    ours = Impl("ours", lambda: _leaves(bt.q, bt.k, bt.v),
                lambda q, k, v: family.gdpa(q, k, v, bt.offsets, bt.max_len, activation="silu"), True)  # fmt: skip
    padded = lambda: (bt.pad(bt.q), bt.pad(bt.k), bt.pad(bt.v))  # noqa: E731
    base = [
        Impl("sdpa", lambda: _leaves(*padded()), lambda q, k, v: _sdpa(q, k, v), False, bt.unpad),
        Lazy("flex", lambda: _flex_impl(bt, q_len=bt.max_len, kv_len=bt.max_len, mask_mod=_length_mask(bt.lens),
                           score_mod=_silu_score, exact=False, q=padded, kv=lambda: (), jagged=bt.unpad)),
        Lazy("reference", lambda: _ref_impl(bt, lambda q, k, v, off, kd, vd, qd, n: _ref(family.gdpa)(q, k, v, off, n, activation="silu"),
                          lambda ls: np.square(np.array(ls, float)).sum(), full)),
    ]  # fmt: skip
    check = _checker(bt, lambda q, k, v, kd, vd, qd, off, n, **kw: family.gdpa(q, k, v, off, n, **kw))  # fmt: skip
    return Case("gdpa_silu", "gdpa", L, bt, cost, ours, base, check)


def gdpa_dense_case(bt: Batch, L) -> Case:
    cost = costs.batch_cost(Spec("gdpa", jagged="q"), bt.lengths, heads=bt.shape.H, head_dim=bt.shape.D, n_dense=bt.shape.n_dense)
    ours = Impl("ours", lambda: _leaves(bt.q, bt.kd, bt.vd),
                lambda q, k, v: family.gdpa(q, k, v, bt.offsets, bt.max_len, activation="silu"), True)  # fmt: skip
    base = [
        Impl("sdpa", lambda: _leaves(bt.pad(bt.q), bt.kd.transpose(1, 2).contiguous(), bt.vd.transpose(1, 2).contiguous()),
             lambda q, k, v: _sdpa(q, k, v), False, bt.unpad),
    ]  # fmt: skip
    check = _checker(bt, lambda q, k, v, kd, vd, qd, off, n, **kw: family.gdpa(q, kd, vd, off, n, **kw))  # fmt: skip
    return Case("gdpa_silu_dense_kv256", "gdpa", L, bt, cost, ours, base, check)


def block_case(bt: Batch, L) -> Case:
    cost = costs.batch_cost(Spec("block", block=bt.shape.block), bt.lengths, heads=bt.shape.H, head_dim=bt.shape.D)
    pairs = lambda ls: costs.self_pairs(np.array(ls, float), block=bt.shape.block, causal=False).sum()  # noqa: E731
    ours = Impl("ours", lambda: _leaves(bt.q, bt.k, bt.v),
                lambda q, k, v: family.block_attention(q, k, v, bt.offsets, bt.max_len, block=bt.shape.block), True)  # fmt: skip
    padded = lambda: (bt.pad(bt.q), bt.pad(bt.k), bt.pad(bt.v))  # noqa: E731
    base = [
        Lazy("flex", lambda: _flex_impl(bt, q_len=bt.max_len, kv_len=bt.max_len, mask_mod=_length_mask(bt.lens, block=bt.shape.block),
                           q=padded, kv=lambda: (), jagged=bt.unpad, block_size=bt.shape.block)),
        Impl("sdpa_blocks", lambda: _leaves(bt.blocks(bt.q), bt.blocks(bt.k), bt.blocks(bt.v)),
             lambda q, k, v: _sdpa(q, k, v), False, None),
        Lazy("reference", lambda: _ref_impl(bt, lambda q, k, v, off, kd, vd, qd, n: _ref(family.block_attention)(q, k, v, off, n, block=bt.shape.block),
                          pairs, pairs(bt.lengths))),
    ]  # fmt: skip
    check = _checker(bt, lambda q, k, v, kd, vd, qd, off, n, **kw: family.block_attention(q, k, v, off, n, block=bt.shape.block, **kw))  # fmt: skip
    return Case(f"block{bt.shape.block}", "block", L, bt, cost, ours, base, check)


def asym_q_case(bt: Batch, L) -> Case:
    cost = costs.batch_cost(Spec("asym", jagged="q"), bt.lengths, n_dense=bt.shape.n_dense, heads=bt.shape.H, head_dim=bt.shape.D)
    ours = Impl("ours", lambda: _leaves(bt.q, bt.kd, bt.vd),
                lambda q, k, v: family.jagged_q_dense_kv(q, k, v, bt.offsets, bt.max_len), True)  # fmt: skip
    dense_kv = lambda: (bt.kd.transpose(1, 2).contiguous(), bt.vd.transpose(1, 2).contiguous())  # noqa: E731
    total = float(np.sum(bt.lengths))
    base = [
        Impl("sdpa", lambda: _leaves(bt.pad(bt.q), *dense_kv()), lambda q, k, v: _sdpa(q, k, v), True, bt.unpad),
        Lazy("flex", lambda: _flex_impl(bt, q_len=bt.max_len, kv_len=bt.shape.n_dense, mask_mod=_length_mask(bt.lens, kv_dense=True),
                           q=lambda: (bt.pad(bt.q),), kv=dense_kv, jagged=bt.unpad)),
        Lazy("reference", lambda: _ref_impl(bt, lambda q, k, v, off, kd, vd, qd, n: _ref(family.jagged_q_dense_kv)(q, kd, vd, off, n),
                          lambda ls: float(np.sum(ls)), total)),
    ]  # fmt: skip
    check = _checker(bt, lambda q, k, v, kd, vd, qd, off, n, **kw: family.jagged_q_dense_kv(q, kd, vd, off, n, **kw))  # fmt: skip
    return Case("jagged_q_dense_kv256", "asym", L, bt, cost, ours, base, check)


def asym_kv_case(bt: Batch, L) -> Case:
    cost = costs.batch_cost(Spec("asym", jagged="kv"), bt.lengths, n_dense=bt.shape.n_dense, heads=bt.shape.H, head_dim=bt.shape.D)
    ours = Impl("ours", lambda: _leaves(bt.qd, bt.k, bt.v),
                lambda q, k, v: family.dense_q_jagged_kv(q, k, v, bt.offsets, bt.max_len), True,
                None)  # fmt: skip
    dense_q = lambda: (bt.qd.transpose(1, 2).contiguous(),)  # noqa: E731
    padded_kv = lambda: (bt.pad(bt.k), bt.pad(bt.v))  # noqa: E731
    key_mask = bt.valid[:, None, None, :]
    back = lambda o: o.transpose(1, 2)  # [B, H, N, D] -> [B, N, H, D]  # noqa: E731
    total = float(np.sum(bt.lengths))
    base = [
        Impl("sdpa", lambda: _leaves(*dense_q(), *padded_kv()), lambda q, k, v: _sdpa(q, k, v), False, back),
        Impl("sdpa_masked", lambda: _leaves(*dense_q(), *padded_kv()),
             lambda q, k, v: _sdpa(q, k, v, mask=key_mask, backend=SDPBackend.EFFICIENT_ATTENTION), True, back),
        Lazy("flex", lambda: _flex_impl(bt, q_len=bt.shape.n_dense, kv_len=bt.max_len, mask_mod=_length_mask(bt.lens, q_dense=True),
                           q=dense_q, kv=padded_kv, jagged=back)),
        Lazy("reference", lambda: _ref_impl(bt, lambda q, k, v, off, kd, vd, qd, n: _ref(family.dense_q_jagged_kv)(qd, k, v, off, n),
                          lambda ls: float(np.sum(ls)), total)),
    ]  # fmt: skip
    check = _checker(bt, lambda q, k, v, kd, vd, qd, off, n, **kw: family.dense_q_jagged_kv(qd, k, v, off, n, **kw), dense_out=True)  # fmt: skip
    return Case("dense_q256_jagged_kv", "asym", L, bt, cost, ours, base, check)


CASES = [jfa_case, gdpa_case, gdpa_dense_case, block_case, asym_q_case, asym_kv_case]
HEAVY_TAIL_CASES = [jfa_case, gdpa_case, block_case, asym_q_case]


# ---- timing --------------------------------------------------------------------------------
def _bench(fn, rep_ms: int, device: str) -> float:
    if device == "cuda":
        return triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")
    t = time.perf_counter()  # --smoke only: no device events on the CPU
    fn()
    return (time.perf_counter() - t) * 1e3


def measure(impl: Impl, rep_ms: int, device: str) -> dict:
    """Forward and backward (autograd of the output) medians in ms, grad enabled."""
    args = impl.args()
    fwd = _bench(lambda: impl.run(*args), rep_ms, device)
    out = impl.run(*args)
    do = torch.randn_like(out)
    leaves = [a for a in args if a.requires_grad]
    bwd = _bench(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True, allow_unused=True), rep_ms, device)
    return {"fwd_ms": fwd, "bwd_ms": bwd}


def compare_rows(ours_out: Tensor, impl: Impl) -> float | None:
    if impl.jagged is None:
        return None
    with torch.no_grad():
        return _rel(ours_out, impl.jagged(impl.run(*impl.args())))


def new_row(case: Case) -> dict:
    """A case's row with its correctness check (our op at the bench shape, poisoned outputs)."""
    c, shape = case.cost, case.batch.shape
    return {"case": case.name, "kernel": case.kernel, "L": case.L, "B": len(case.lengths), "H": shape.H,
            "d": shape.D, "tokens": int(sum(case.lengths)), "max_len": int(max(case.lengths)),
            "fwd_flops": c.fwd_flops, "bwd_flops": c.bwd_flops,
            "check_vs_fp32_reference": case.check() if case.check else None, "impls": {}}  # fmt: skip


def measure_impls(case: Case, row: dict, names: set[str], rep_ms: int) -> None:
    """Time the implementations of ``case`` named in ``names`` into ``row["impls"]``."""
    c = case.cost
    ours_out = None
    for impl in [case.ours, *case.baselines]:
        if impl.name not in names:
            continue
        try:
            impl = impl.make() if isinstance(impl, Lazy) else impl
            r = measure(impl, rep_ms, case.batch.shape.device)
            r["fwd_tflops"] = c.fwd_flops * impl.flops_scale / r["fwd_ms"] / 1e9
            r["bwd_tflops"] = c.bwd_flops * impl.flops_scale / r["bwd_ms"] / 1e9
            r["exact"] = impl.exact
            if impl.name != "ours":
                if ours_out is None:
                    with torch.no_grad():
                        ours_out = case.ours.run(*case.ours.args())
                r["rel_err_vs_ours"] = compare_rows(ours_out, impl)
            if impl.note:
                r["note"] = impl.note
            row["impls"][impl.name] = r
        except Exception as e:  # a baseline that cannot run this shape is recorded, not fatal
            row["impls"][impl.name] = {"error": f"{type(e).__name__}: {e}"[:400]}
        torch.cuda.empty_cache()
    ours = row["impls"].get("ours", {})
    for name, r in row["impls"].items():
        if name != "ours" and "fwd_ms" in r and "fwd_ms" in ours:
            r["speedup_fwd"] = r["fwd_ms"] / ours["fwd_ms"]
            r["speedup_bwd"] = r["bwd_ms"] / ours["bwd_ms"]


# ---- environment, ceilings, report --------------------------------------------------------
def env() -> dict:
    def smi(q):
        try:
            return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20).stdout.strip()  # fmt: skip
        except Exception as e:  # noqa: BLE001
            return f"unavailable ({e})"

    p = torch.cuda.get_device_properties(0)
    return {"gpu_name": p.name, "sms": p.multi_processor_count, "driver": smi("driver_version"),
            "sm_clock_max_mhz": smi("clocks.max.sm"), "power_limit_w": smi("power.limit"),
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "date": datetime.date.today().isoformat()}  # fmt: skip


def ceilings() -> dict:
    """The two ceilings of METHOD.md, measured here: a bf16 matmul and a device copy."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm = triton.testing.do_bench(lambda: a @ a, return_mode="median")
    x = torch.empty(2**30, device="cuda", dtype=torch.uint8).fill_(1)
    y = torch.empty_like(x)
    cp = triton.testing.do_bench(lambda: y.copy_(x), return_mode="median")
    return {"matmul_bf16_8192_tflops": 2 * 8192**3 / mm / 1e9, "copy_GBps": 2 * 2**30 / cp / 1e6}


def lengths_for(L, rng, B: int) -> list[int]:
    if L == "lognormal":
        return costs.heavy_tail_law().sample(rng, B).tolist()
    return rng.integers(L // 2, L + 1, B).tolist()


def table(rows: list[dict]) -> str:
    head = ("| case | L | ours fwd / bwd TFLOP/s | baseline fwd / bwd TFLOP/s (speed-up of ours) | "
            "check (max rel err) |\n|---|---|---|---|---|")  # fmt: skip
    lines = [head]
    for r in rows:
        o = r["impls"].get("ours", {})
        ours = f"{o.get('fwd_tflops', math.nan):.0f} / {o.get('bwd_tflops', math.nan):.0f}"
        base = []
        for name, b in r["impls"].items():
            if name in ("ours", "skipped"):
                continue
            if "error" in b:
                base.append(f"{name}: error")
                continue
            star = "" if b["exact"] else "*"
            base.append(f"{name}{star} {b['fwd_tflops']:.0f} / {b['bwd_tflops']:.0f} "
                        f"({b['speedup_fwd']:.2f}× / {b['speedup_bwd']:.2f}×)")  # fmt: skip
        chk = r.get("check_vs_fp32_reference") or {}
        worst = max(chk.values()) if chk else math.nan
        lines.append(f"| {r['case']} | {r['L']} | {ours} | {'; '.join(base)} | {worst:.1e} |")
    return "\n".join(lines) + "\n(* not the same function: the padded baseline's work, see the docstring)"


def targets(rows: list[dict], block: int = FULL.block) -> dict:
    """Each issue-5 target: the worst value over the uniform-length cases, and whether it is met
    (``block``: the block case's size, in its name)."""
    out = {}

    def worst(case, impl, key):
        vals = [r["impls"].get(impl, {}).get(key) for r in rows if r["case"] == case and r["L"] != "lognormal"]
        vals = [v for v in vals if v is not None]
        return min(vals) if vals else None

    for key, case, impl, field_, goal in [
        ("gdpa_fwd_tflops", "gdpa_silu", "ours", "fwd_tflops", TARGETS["gdpa_fwd_tflops"]),
        ("gdpa_bwd_tflops", "gdpa_silu", "ours", "bwd_tflops", TARGETS["gdpa_bwd_tflops"]),
        ("jfa_fwd_speedup_vs_sdpa", "jfa_causal", "sdpa", "speedup_fwd", TARGETS["jfa_speedup_vs_sdpa"]),
        ("jfa_bwd_speedup_vs_sdpa", "jfa_causal", "sdpa", "speedup_bwd", TARGETS["jfa_speedup_vs_sdpa"]),
        ("block_fwd_speedup_vs_flex", f"block{block}", "flex", "speedup_fwd", TARGETS["block_speedup_vs_flex"]),
        ("block_bwd_speedup_vs_flex", f"block{block}", "flex", "speedup_bwd", TARGETS["block_speedup_vs_flex"]),
        ("asym_q_fwd_speedup_vs_sdpa", "jagged_q_dense_kv256", "sdpa", "speedup_fwd", TARGETS["asym_speedup_vs_sdpa"]),
        ("asym_q_bwd_speedup_vs_sdpa", "jagged_q_dense_kv256", "sdpa", "speedup_bwd", TARGETS["asym_speedup_vs_sdpa"]),
        ("asym_kv_fwd_speedup_vs_sdpa", "dense_q256_jagged_kv", "sdpa", "speedup_fwd", TARGETS["asym_speedup_vs_sdpa"]),
        ("asym_kv_bwd_speedup_vs_sdpa", "dense_q256_jagged_kv", "sdpa", "speedup_bwd", TARGETS["asym_speedup_vs_sdpa"]),
        ("asym_kv_fwd_speedup_vs_sdpa_masked", "dense_q256_jagged_kv", "sdpa_masked", "speedup_fwd", TARGETS["asym_speedup_vs_sdpa"]),
        ("asym_kv_bwd_speedup_vs_sdpa_masked", "dense_q256_jagged_kv", "sdpa_masked", "speedup_bwd", TARGETS["asym_speedup_vs_sdpa"]),
    ]:  # fmt: skip
        v = worst(case, impl, field_)
        out[key] = {"worst": v, "goal": goal, "met": v is not None and v >= goal}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON results file")
    ap.add_argument("--lengths", default="256,512,1024,2048,lognormal", help="L values (and 'lognormal')")
    ap.add_argument("--cases", default="", help="comma-separated case functions to run (default: all)")
    ap.add_argument("--skip", default="", help="implementations to leave out, e.g. reference,flex")
    ap.add_argument("--rep-ms", type=int, default=200, help="do_bench repeat time per measurement")
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop starting measurements after this")
    ap.add_argument("--smoke", action="store_true", help="CPU dry run at tiny shapes (TRITON_INTERPRET=1)")
    ap.add_argument("--append", action="store_true",
                    help="add the rows to an existing --out file (a CUDA error ends a process: run "
                         "risky shapes as a second invocation)")  # fmt: skip
    ap.add_argument("--table", action="store_true", help="print the table of --out and exit")
    a = ap.parse_args()
    if a.table:
        with open(a.out) as f:
            rows = json.load(f)["rows"]
        print(table(rows))
        print(json.dumps(targets(rows), indent=1))
        return
    shape = SMOKE if a.smoke else FULL
    t0 = time.monotonic()
    deadline = t0 + a.budget_s
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    cuda = shape.device == "cuda"
    result = {"env": env() if cuda else {}, "ceilings": ceilings() if cuda else {},
              "targets_goal": TARGETS,
              "method": __doc__, "rows": []}  # fmt: skip
    if a.append:
        with open(a.out) as f:
            result = {**json.load(f), "appended_env": result["env"]}
    skip = {s for s in a.skip.split(",") if s}
    cases = []  # (case, row), every length first, so that no L loses our own numbers
    for L in a.lengths.split(","):
        L = L if L == "lognormal" else int(L)
        bt = Batch.make(lengths_for(L, rng, shape.B), seed=len(cases), shape=shape)
        for make in HEAVY_TAIL_CASES if L == "lognormal" else CASES:
            if not a.cases or make.__name__ in a.cases.split(","):
                cases.append((make(bt, L), None))

    def save():
        result["wall_s" if not a.append else "appended_wall_s"] = time.monotonic() - t0
        result["targets"] = targets(result["rows"], shape.block)
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)

    # Phase 1: check + ours + the padded SDPA baselines; phase 2: FlexAttention (compiles);
    # phase 3: the reference. Later phases stop starting measurements past --budget-s.
    phases = [{"ours", "sdpa", "sdpa_masked", "sdpa_blocks"}, {"flex"}, {"reference"}]
    for i, names in enumerate(phases):
        for j, (case, row) in enumerate(cases):
            if i > 0 and time.monotonic() > deadline:
                row["skipped"] = sorted(set(row.get("skipped", [])) | names)
                continue
            if row is None:
                row = new_row(case)
                cases[j] = (case, row)
                result["rows"].append(row)
            measure_impls(case, row, names - skip, a.rep_ms)
            o = row["impls"].get("ours", {})
            if i == 0:
                print(f"[{time.monotonic() - t0:6.1f}s] {row['case']:>22} L={row['L']}: ours "
                      f"{o.get('fwd_tflops', math.nan):.0f}/{o.get('bwd_tflops', math.nan):.0f} "
                      f"TFLOP/s, check {row['check_vs_fp32_reference']}", flush=True)  # fmt: skip
            else:
                print(f"[{time.monotonic() - t0:6.1f}s] {row['case']:>22} L={row['L']}: "
                      f"{sorted(names)} done", flush=True)  # fmt: skip
            save()
    print(table(result["rows"]))
    print(json.dumps(result["targets"], indent=1))


if __name__ == "__main__":
    main()
