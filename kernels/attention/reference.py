"""The PyTorch reference of the attention family (kernels/ATTENTION.md, "Semantics").

One function, ``attention_reference``, on the core's layout: ``q [Tq, H, D]`` packed sample after
sample with ``q_offsets [B+1]``, ``k, v [Tk, H, D]`` with ``kv_offsets [B+1]`` (a dense
``[B, N, H, D]`` side is the jagged tensor with offsets ``arange(B+1)·N``; the dispatcher makes
it so). Differentiable through autograd, any float dtype (float64 for a ground truth), any
device; every kind of the family is a choice of ``weight``, ``scale``, ``causal`` and ``block``.

Every matmul runs only over *attended* (query, key) pairs, so ``FlopCounterMode`` sees exactly
the analytic count (``cost.py``: ``4·H·D`` FLOPs per pair forward, ``L(L+1)/2`` pairs for a
causal sample of ``L`` tokens). How: a sample (for ``block``, each block of a sample) is a
*segment* with a query and a key range; segments are gathered into zero-padded
``[G, n, H, D]`` tensors (gathers are not matmuls), then

- non-causal: one ``bmm`` per distinct (query length, key length) over the segments of that
  shape (``m·n`` pairs each);
- causal (self attention): one ``bmm`` per query position ``i`` over the segments longer than
  ``i``, against their first ``i+1`` keys (``n(n+1)/2`` pairs per segment).

``padded=True`` (the default on CUDA tensors) runs the same function as padded, masked batched
matmuls instead (one launch per call rather than one per position or shape; the score matrices
are recomputed in backward through ``torch.utils.checkpoint`` so that long sequences fit). It
computes the padding too, so there ``FlopCounterMode`` sees more than the model FLOPs.
The offsets are read on the host: the reference syncs, and runs outside compiled graphs.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from kernels.flash.options import weight_code
from scenarios.vocab import ACTIVATIONS as _NAMES

#: GDPA's activations (name -> torch function; the names: ``scenarios.vocab``): the one table of
#: the family. The Triton kernels compute the same functions and their derivatives
#: (``kernels/flash/_kernels.py``, ``_act`` / ``_act_grad``); gelu is its tanh form everywhere.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "relu2": lambda x: F.relu(x).square(),
    "identity": lambda x: x,
}
assert tuple(ACTIVATIONS) == _NAMES


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
    weight: str, scale: float, causal: bool = False, block: int = 0, padded: bool | None = None,
) -> Tensor:  # fmt: skip
    """``O [Tq, H, D]``; per sample ``b`` and head: ``O = W V`` with ``S = Q Kᵀ`` (``[Lq, Lk]``).

    - ``weight="softmax"``: ``W = softmax(S · scale + mask)`` over keys (computed in at least
      fp32); a query row with no key to attend gives ``O = 0``, never NaN.
    - an activation (``silu``, ``gelu`` in its tanh form, ``relu``, ``relu2 = relu(x)²``,
      ``identity``): ``W = act(S) · scale · mask`` with a 0/1 mask, no normalisation.
    - ``causal``: query ``i`` sees keys ``j <= i``, positions counted from the sample's start.
    - ``block > 0``: query ``i`` sees keys ``j`` with ``i // block == j // block`` (the last
      block of a sample may be shorter); with ``causal`` both must hold.

    Masks are for self attention (one length per sample on both sides). A sample with ``Lq = 0``
    has no rows; a sample with ``Lk = 0`` gives zero rows; rows past ``q_offsets[-1]`` (a
    static-shape batch's padding) come back zero. Length 1 self attention: softmax gives
    ``O = v``; an activation gives ``O = act(q·k) · scale · v``.
    """
    weight_code(weight)  # a one-line error for an unknown weight
    seg = _segments(q_offsets, kv_offsets, q.shape[0], k.shape[0], causal=causal, block=block)
    if q.shape[0] == 0 or seg.shape[1] == 0:  # nothing attends: zeros, still in q's autograd graph
        return torch.cat([q[:0], q.new_zeros(q.shape)])
    weights = _weights(weight, scale)
    attend = _padded if (q.is_cuda if padded is None else padded) else _exact
    return attend(q, k, v, seg, causal=causal, weights=weights)


def attention_mask(n_q: int, n_k: int, *, causal: bool, block: int, device=None) -> Tensor:
    """Boolean ``[n_q, n_k]``: True where query ``i`` attends key ``j`` (positions from 0)."""
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    mask = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if causal:
        mask &= j <= i
    if block > 0:
        mask &= (i // block) == (j // block)
    return mask


# ---- weights: scores -> attention weights ----------------------------------------------------
# ``mask`` (bool, broadcastable to the scores, True = attend) is given on the padded path only.
def _weights(weight: str, scale: float) -> Callable[..., Tensor]:
    if weight == "softmax":
        return lambda s, mask=None: _softmax(s, scale, mask)
    act = ACTIVATIONS[weight]
    return lambda s, mask=None: act(s) * scale if mask is None else act(s) * scale * mask


def _softmax(s: Tensor, scale: float, mask: Tensor | None = None) -> Tensor:
    """Softmax over the last dim in at least fp32, returned in ``s``'s dtype; rows with no key
    to attend give zeros."""
    wide = torch.promote_types(s.dtype, torch.float32)
    x = s.to(wide) * scale
    if mask is None:
        return torch.softmax(x, dim=-1).to(s.dtype)
    p = torch.softmax(x.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.nan_to_num(p, nan=0.0).to(s.dtype)


# ---- the two matmuls, as explicit bmm over (segment, head) ---------------------------------
# (einsum would lower size-1 contractions to mul+sum, which FlopCounterMode does not count.)
def _scores(q: Tensor, k: Tensor) -> Tensor:
    """``q [G, m, H, D]``, ``k [G, n, H, D]`` -> ``Q Kᵀ`` as ``[G, H, m, n]``."""
    G, m, H, D = q.shape
    n = k.shape[1]
    qh = q.permute(0, 2, 1, 3).reshape(G * H, m, D)
    kh = k.permute(0, 2, 3, 1).reshape(G * H, D, n)
    return torch.bmm(qh, kh).view(G, H, m, n)


def _apply(p: Tensor, v: Tensor) -> Tensor:
    """``p [G, H, m, n]``, ``v [G, n, H, D]`` -> ``P V`` as ``[G, m, H, D]``."""
    G, H, m, n = p.shape
    D = v.shape[-1]
    vh = v.permute(0, 2, 1, 3).reshape(G * H, n, D)
    return torch.bmm(p.reshape(G * H, m, n), vh).view(G, H, m, D).permute(0, 2, 1, 3)


# ---- segments ----------------------------------------------------------------------------------
def _segments(q_offsets: Tensor, kv_offsets: Tensor, q_rows: int, kv_rows: int, *, causal: bool,
              block: int) -> Tensor:
    """``[4, G]`` int64 on the host: (query start, query length, key start, key length) of every
    segment with queries and keys (a sample; with ``block``, each block of a sample)."""
    qo, ko = q_offsets.cpu().long(), kv_offsets.cpu().long()
    seg = torch.stack([qo[:-1], qo[1:] - qo[:-1], ko[:-1], ko[1:] - ko[:-1]])
    for name, off, rows in (("q_offsets", qo, q_rows), ("kv_offsets", ko, kv_rows)):
        if len(off) < 1 or int(off[-1]) > rows or bool((off[1:] < off[:-1]).any()):
            raise ValueError(f"{name} must be [B+1], non-decreasing, ending at <= {rows} rows (rows past it are "
                             f"padding); got {off.tolist()[:8]}{' ...' if len(off) > 8 else ''}")
    if (causal or block) and not torch.equal(seg[1], seg[3]):
        raise ValueError("causal/block masks are for self attention: every sample needs as many keys as queries")
    if block > 0:
        seg = _blocks(seg, block)
    return seg[:, (seg[1] > 0) & (seg[3] > 0)]


def _blocks(seg: Tensor, block: int) -> Tensor:
    """Split each self-attention segment into blocks of ``block`` (the last may be shorter)."""
    starts, lens, kstarts = seg[0], seg[1], seg[2]
    nblocks = (lens + block - 1) // block
    sample = torch.repeat_interleave(torch.arange(len(lens)), nblocks)
    first = torch.repeat_interleave(torch.cumsum(nblocks, 0) - nblocks, nblocks)
    j = torch.arange(len(sample)) - first  # block index inside its sample
    b_len = torch.clamp(lens[sample] - j * block, max=block)
    return torch.stack([starts[sample] + j * block, b_len, kstarts[sample] + j * block, b_len])


def _index(starts: Tensor, lens: Tensor, total: int, device) -> Tensor:
    """``[G, max len]`` row index of each segment's rows, ``total`` (a zero row) past its end."""
    pos = torch.arange(int(lens.max()))
    idx = torch.where(pos < lens[:, None], starts[:, None] + pos, total)
    return idx.to(device)


def _pad(x: Tensor, idx: Tensor) -> Tensor:
    """Gather rows ``idx`` of ``x [T, ...]`` where index ``T`` means a zero row.

    ``index_select`` rather than ``x[idx]``: its backward is an ``index_add_``, where advanced
    indexing's backward is a sort-based ``index_put_`` (measured on H200: 82% of a GEM step).
    """
    padded = torch.cat([x, x.new_zeros((1, *x.shape[1:]))])
    return padded.index_select(0, idx.reshape(-1)).view(*idx.shape, *x.shape[1:])


def _unpad(out: Tensor, idx: Tensor, total: int) -> Tensor:
    """Inverse of ``_pad``: rows of ``out [*idx.shape, ...]`` back to ``[total, ...]`` (zeros elsewhere)."""
    flat = idx.reshape(-1)
    rows = torch.nonzero(flat < total).squeeze(1)
    values = out.reshape(flat.shape[0], *out.shape[idx.dim():]).index_select(0, rows)
    return values.new_zeros((total, *values.shape[1:])).index_copy(0, flat.index_select(0, rows), values)


def _exact(q: Tensor, k: Tensor, v: Tensor, seg: Tensor, *, causal: bool, weights) -> Tensor:
    """Exact pairs: per query position (causal) or per segment shape (otherwise)."""
    (Tq, H, D), dev = q.shape, q.device
    iq, ik = _index(seg[0], seg[1], Tq, dev), _index(seg[2], seg[3], k.shape[0], dev)
    qp, kp, vp = _pad(q, iq), _pad(k, ik), _pad(v, ik)  # [G, n, H, D]
    rows, outs = [], []
    if causal:
        for i in range(iq.shape[1]):  # query position i sees keys 0..i of segments longer than i
            g = torch.nonzero(seg[1] > i).squeeze(1).to(dev)
            s = _scores(qp[g, i : i + 1], kp[g, : i + 1])
            outs.append(_apply(weights(s), vp[g, : i + 1]).squeeze(1))
            rows.append(iq[g, i])
    else:
        for m, n in torch.unique(seg[[1, 3]], dim=1).t().tolist():  # segments of one shape in one bmm
            g = torch.nonzero((seg[1] == m) & (seg[3] == n)).squeeze(1).to(dev)
            o = _apply(weights(_scores(qp[g, :m], kp[g, :n])), vp[g, :n])
            outs.append(o.reshape(-1, H, D))
            rows.append(iq[g, :m].reshape(-1))
    out = torch.cat(outs)
    return out.new_zeros((Tq, H, D)).index_copy(0, torch.cat(rows), out)


def _padded(q: Tensor, k: Tensor, v: Tensor, seg: Tensor, *, causal: bool, weights) -> Tensor:
    """The same attention as ``_exact`` as padded, masked bmm (the GPU path)."""
    Tq, dev = q.shape[0], q.device
    iq, ik = _index(seg[0], seg[1], Tq, dev), _index(seg[2], seg[3], k.shape[0], dev)
    mask = (ik < k.shape[0])[:, None, None, :]  # [G, 1, 1, n]: real keys
    if causal:
        pos_q, pos_k = torch.arange(iq.shape[1], device=dev), torch.arange(ik.shape[1], device=dev)
        mask = mask & (pos_k[None, :] <= pos_q[:, None])[None, None]

    def core(qp: Tensor, kp: Tensor, vp: Tensor) -> Tensor:
        return _apply(weights(_scores(qp, kp), mask), vp)

    out = checkpoint(core, _pad(q, iq), _pad(k, ik), _pad(v, ik), use_reentrant=False)
    return _unpad(out, iq, Tq)
