"""Triton table-batched embedding lookups, forward and a deterministic sparse backward.

The tables of one launch share ``dim`` and dtype and live in one buffer ``[Σ rows, dim]``
(``layout.FusedTables``); ``row_starts [T]`` gives each table's first row. Ids are checked by
the caller (``executor.data.Batch.validate``), not here: an id out of range reads another
table's row.

- ``pooled_forward``: bags in the packed layout (``layout.pack_bags``: ``indices``, table-major
  ``offsets [T·B+1]``), sum or mean, fp32 accumulation, output ``[B, T·dim]`` fp32 (table
  ``t`` in columns ``t·dim : (t+1)·dim``). One program per bag. Empty bags give zeros.
- ``unpooled_forward``: one id per token per table (``ids [T, N]``), row ``n`` of table ``t``
  written to ``out[n, col[t] : col[t]+dim]`` (so several groups fill one concatenated output).
  An id -1 is padding (tables of one launch looked up at different counts, as the sharded
  lookups of ``executor.sharded_tables`` are): zeros are written and it has no gradient.
- ``sparse_grad``: given, for each id occurrence, its buffer row and where its output-gradient
  row starts, the gradient of every touched row summed in a fixed order (sort, then one program
  per chunk of ``chunk`` occurrences of a row, then the chunks of hot rows summed): unique rows
  and their fp32 gradient, which ``split_by_table`` turns into coalesced sparse COO gradients
  per table — what ``executor.optim.RowWiseAdagrad`` consumes.
- ``RowwiseAdagradInBackward``: attached to a ``FusedTables`` (``fused.in_backward``), the
  backward applies row-wise Adagrad to the touched rows itself (a few programs per SM walking
  chunks of a row's occurrences, then one program per hot row to add its chunks up), with no
  host sync, and returns no table gradients (the training step's fast path).
- ``PooledLookup`` / ``UnpooledLookup``: autograd functions over per-table weight views.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from torch.profiler import record_function

from kernels.embedding.layout import FusedTables

DEFAULT_CHUNK = 256


# ---- kernels -------------------------------------------------------------------------------------
@triton.jit
def _pooled_fwd_kernel(w_ptr, row_start_ptr, idx_ptr, off_ptr, out_ptr, grow_ptr, obase_ptr, B, out_stride,
                       D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MEAN: tl.constexpr,
                       SAVE: tl.constexpr):
    g = tl.program_id(0).to(tl.int64)
    t = g // B
    b = g - t * B
    start = tl.load(off_ptr + g)
    end = tl.load(off_ptr + g + 1)
    row0 = tl.load(row_start_ptr + t)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    obase = b * out_stride + t * D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i in range(start, end, BLOCK_N):
        j = i + tl.arange(0, BLOCK_N)
        m = j < end
        rows = row0 + tl.load(idx_ptr + j, mask=m, other=0).to(tl.int64)
        vals = tl.load(w_ptr + rows[:, None] * D + d[None, :], mask=m[:, None] & dmask[None, :], other=0.0)
        acc += tl.sum(vals.to(tl.float32), axis=0)
        if SAVE:
            tl.store(grow_ptr + j, rows, mask=m)
            tl.store(obase_ptr + j, obase + tl.zeros([BLOCK_N], dtype=tl.int64), mask=m)
    if MEAN:
        acc = acc / tl.maximum((end - start).to(tl.float32), 1.0)
    tl.store(out_ptr + obase + d, acc, mask=dmask)


@triton.jit
def _unpooled_fwd_kernel(w_ptr, row_start_ptr, col_ptr, ids_ptr, out_ptr, grow_ptr, obase_ptr, N, out_stride,
                         D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SAVE: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1).to(tl.int64)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    m = n < N
    d = tl.arange(0, BLOCK_D)
    mask = m[:, None] & (d < D)[None, :]
    idx = tl.load(ids_ptr + t * N + n, mask=m, other=-1).to(tl.int64)
    live = idx >= 0  # an id -1 is padding: no row read, a zero row written, no gradient
    rows = tl.load(row_start_ptr + t) + idx
    vals = tl.load(w_ptr + rows[:, None] * D + d[None, :], mask=mask & live[:, None], other=0.0)
    ob = n * out_stride + tl.load(col_ptr + t)
    tl.store(out_ptr + ob[:, None] + d[None, :], vals.to(tl.float32), mask=mask)
    if SAVE:
        tl.store(grow_ptr + t * N + n, tl.where(live, rows, -1), mask=m)
        tl.store(obase_ptr + t * N + n, ob, mask=m)


@triton.jit
def _sum_grad_rows(grad_ptr, sobase_ptr, start, end, d, dmask, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Sum, in order, the gradient rows ``grad[sobase[k] : sobase[k]+D]`` for ``k`` in
    ``[start, end)`` (``sobase``: each occurrence's output-gradient offset, sorted by row)."""
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for k in range(start, end, BLOCK_N):
        kk = k + tl.arange(0, BLOCK_N)
        m = kk < end
        ob = tl.load(sobase_ptr + kk, mask=m, other=0)
        g = tl.load(grad_ptr + ob[:, None] + d[None, :], mask=m[:, None] & dmask[None, :], other=0.0)
        acc += tl.sum(g.to(tl.float32), axis=0)
    return acc


@triton.jit
def _grad_chunks_kernel(grad_ptr, sobase_ptr, owner_ptr, seg_start_ptr, seg_end_ptr, first_ptr, nchunks_ptr,
                        out_ptr, partial_ptr, U, CHUNK: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)
    u = tl.load(owner_ptr + c)
    valid = u < U
    uu = tl.where(valid, u, 0)
    fc = tl.load(first_ptr + uu)
    nc = tl.load(nchunks_ptr + uu)
    s = tl.load(seg_start_ptr + uu) + (c - fc) * CHUNK
    e = tl.minimum(s + CHUNK, tl.load(seg_end_ptr + uu))
    e = tl.where(valid, e, s)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    acc = _sum_grad_rows(grad_ptr, sobase_ptr, s, e, d, dmask, BLOCK_N, BLOCK_D)
    tl.store(out_ptr + uu * D + d, acc, mask=dmask & valid & (nc == 1))
    tl.store(partial_ptr + c * D + d, acc, mask=dmask & valid & (nc > 1))


@triton.jit
def _grad_reduce_kernel(out_ptr, partial_ptr, first_ptr, nchunks_ptr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    u = tl.program_id(0).to(tl.int64)
    fc = tl.load(first_ptr + u)
    nc = tl.load(nchunks_ptr + u)
    end = tl.where(nc > 1, fc + nc, fc)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for c in range(fc, end):
        acc += tl.load(partial_ptr + c * D + d, mask=dmask, other=0.0)
    tl.store(out_ptr + u * D + d, acc, mask=dmask & (nc > 1))


@triton.jit
def _adagrad_row(acc, row, w_ptr, state_ptr, lr, eps, d, dmask, D: tl.constexpr):
    """Row-wise Adagrad on buffer row ``row`` given its summed fp32 gradient ``acc``, in place."""
    s = tl.load(state_ptr + row) + tl.sum(acc * acc, axis=0) / D
    tl.store(state_ptr + row, s)
    w = tl.load(w_ptr + row * D + d, mask=dmask, other=0.0).to(tl.float32)
    w = w - lr * acc / (tl.sqrt(s) + eps)
    tl.store(w_ptr + row * D + d, w.to(w_ptr.dtype.element_ty), mask=dmask)


@triton.jit
def _adagrad_chunks_kernel(grad_ptr, sobase_ptr, srows_ptr, seg_start_ptr, owner_ptr, first_ptr, nchunks_ptr,
                           total_ptr, pfirst_ptr, partial_ptr, w_ptr, state_ptr, lr, eps, CHUNK: tl.constexpr,
                           D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Chunks of ``CHUNK`` sorted occurrences of one touched row, program ``p`` of ``P`` taking
    chunks ``p, p+P, ...`` up to the device-side chunk count (a grid of a few programs per SM, not
    one per occurrence bound). A row of one chunk is summed and updated here; a hot row's chunks
    write partial sums, which ``_adagrad_hot_rows_kernel`` adds up in order and applies."""
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    total = tl.load(total_ptr)
    for c in range(tl.program_id(0), total, tl.num_programs(0)):
        u = tl.load(owner_ptr + c)
        fc = tl.load(first_ptr + u)
        nc = tl.load(nchunks_ptr + u)
        s = tl.load(seg_start_ptr + u) + (c - fc) * CHUNK
        e = tl.minimum(s + CHUNK, tl.load(seg_start_ptr + u + 1))
        row = tl.load(srows_ptr + s)
        if row >= 0:  # row -1: padding (ids past the last bag, unpooled ids -1), no row to update
            acc = _sum_grad_rows(grad_ptr, sobase_ptr, s, e, d, dmask, BLOCK_N, BLOCK_D)
            if nc == 1:
                _adagrad_row(acc, row, w_ptr, state_ptr, lr, eps, d, dmask, D)
            else:
                p = tl.load(pfirst_ptr + u) + (c - fc)
                tl.store(partial_ptr + p * D + d, acc, mask=dmask)


@triton.jit
def _adagrad_hot_rows_kernel(hot_ptr, srows_ptr, seg_start_ptr, nchunks_ptr, pfirst_ptr, partial_ptr, w_ptr,
                             state_ptr, n, lr, eps, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per hot row (more than one chunk; slots past the last hot row hold ``n`` and
    exit): its chunks' partial sums added in chunk order, then the update."""
    u = tl.load(hot_ptr + tl.program_id(0))
    if u < n:
        row = tl.load(srows_ptr + tl.load(seg_start_ptr + u))
        if row >= 0:
            p0 = tl.load(pfirst_ptr + u)
            nc = tl.load(nchunks_ptr + u)
            d = tl.arange(0, BLOCK_D)
            dmask = d < D
            acc = tl.zeros([BLOCK_D], dtype=tl.float32)
            for p in range(p0, p0 + nc):
                acc += tl.load(partial_ptr + p * D + d, mask=dmask, other=0.0)
            _adagrad_row(acc, row, w_ptr, state_ptr, lr, eps, d, dmask, D)


# ---- launchers -----------------------------------------------------------------------------------
def _block_d(D: int) -> int:
    return triton.next_power_of_2(D)


def _warps(block_n: int, block_d: int) -> int:
    """About 16 elements per thread (four 16-byte loads of fp32 in flight), 1 to 8 warps."""
    return max(1, min(8, block_n * block_d // (32 * 16)))


def _pooled_block_n(ids: int, bags: int) -> int:
    mean = ids / max(bags, 1)
    return 8 if mean <= 8 else 16 if mean <= 16 else 32


def pooled_forward(buffer: Tensor, row_starts: Tensor, indices: Tensor, offsets: Tensor, B: int, *,
                   mode: str = "sum", save: bool = False, out: Tensor | None = None, block_n: int | None = None,
                   num_warps: int | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``(out [B, T·dim] fp32, rows, obase)``; ``rows``/``obase`` per id (for ``sparse_grad``) if ``save``."""
    if mode not in ("sum", "mean"):
        raise ValueError(f"mode = '{mode}': use 'sum' or 'mean'")
    T, D = row_starts.numel(), buffer.shape[1]
    if offsets.numel() != T * B + 1:
        raise ValueError(f"offsets: {offsets.numel()} entries, expected T·B+1 = {T * B + 1} (see pack_bags)")
    if out is None:
        out = torch.empty(B, T * D, dtype=torch.float32, device=buffer.device)
    elif out.shape != (B, T * D) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out: shape {tuple(out.shape)} {out.dtype}, expected contiguous ({B}, {T * D}) float32")
    n = indices.numel()
    # ids past the last bag (a static-shape batch's padding) belong to no bag: the kernel never
    # writes their entries, so they start as row -1 (the backward skips it) reading gradient row 0
    grow = torch.full((n,), -1, dtype=torch.int64, device=buffer.device) if save else None
    obase = torch.zeros(n, dtype=torch.int64, device=buffer.device) if save else None
    if T * B:
        bn = block_n or _pooled_block_n(n, T * B)
        _pooled_fwd_kernel[(T * B,)](
            buffer, row_starts, indices, offsets, out, grow if save else indices, obase if save else indices,
            B, T * D, D=D, BLOCK_N=bn, BLOCK_D=_block_d(D), MEAN=mode == "mean", SAVE=save,
            num_warps=num_warps or _pooled_warps(bn, _block_d(D)),
        )
    return out, grow, obase


def _pooled_warps(block_n: int, block_d: int) -> int:
    """Half of ``_warps`` (about 32 elements a thread): on the H200 at gem-h200-1gpu shapes (48 pooled
    1M x 128 tables, ~5.5 ids a bag) block 8 with 1 warp ran 25.9 / 76.9 us at B = 256 / 2048 against
    33.7 / 128.5 us with 2 (hwmodels/data/measured/embedding_bench_sweep_h200_2026-11-30.json)."""
    return max(1, _warps(block_n, block_d) // 2)


def unpooled_forward(buffer: Tensor, row_starts: Tensor, cols: Tensor, ids: Tensor, out: Tensor, *,
                     save: bool = False, block_n: int = 32,
                     num_warps: int | None = None) -> tuple[Tensor | None, Tensor | None]:
    """Write ``buffer[row_starts[t] + ids[t, n]]`` to ``out[n, cols[t] : cols[t]+dim]`` (zeros
    where ``ids[t, n]`` is -1: padding); ``(rows, obase)`` if ``save`` (row -1 for padding, which
    ``sparse_grad`` sums apart and ``split_by_table`` drops)."""
    T, N = ids.shape
    D = buffer.shape[1]
    if T != row_starts.numel() or T != cols.numel():
        raise ValueError(f"ids: {T} tables, but row_starts has {row_starts.numel()} and cols {cols.numel()}")
    if out.dim() != 2 or out.shape[0] != N or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out: shape {tuple(out.shape)} {out.dtype}, expected contiguous ({N}, width) float32")
    grow = torch.empty(T * N, dtype=torch.int64, device=buffer.device) if save else None
    obase = torch.empty(T * N, dtype=torch.int64, device=buffer.device) if save else None
    if T * N:
        _unpooled_fwd_kernel[(triton.cdiv(N, block_n), T)](
            buffer, row_starts, cols, ids, out, grow if save else ids, obase if save else ids, N, out.shape[1],
            D=D, BLOCK_N=block_n, BLOCK_D=_block_d(D), SAVE=save, num_warps=num_warps or _warps(block_n, _block_d(D)),
        )
    return grow, obase


def _chunks(counts: Tensor, chunk: int, bound: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each row's run of ``counts`` sorted occurrences in chunks of ``chunk``: ``(nchunks, first
    chunk, chunk_end, owner)``; ``owner[c]`` is the row of chunk ``c`` for ``c < bound``
    (``len(counts)`` past the last chunk). No host sync."""
    nchunks = (counts + chunk - 1) // chunk
    chunk_end = torch.cumsum(nchunks, 0)
    owner = torch.searchsorted(chunk_end, torch.arange(bound, device=counts.device), right=True)
    return nchunks, chunk_end - nchunks, chunk_end, owner


def sparse_grad(grad_out: Tensor, rows: Tensor, obase: Tensor, D: int, *, chunk: int = DEFAULT_CHUNK,
                block_n: int = 32, num_warps: int | None = None) -> tuple[Tensor, Tensor]:
    """``(unique rows [U] ascending, their gradient [U, D] fp32)``: row ``r``'s gradient is the sum,
    over the occurrences ``j`` with ``rows[j] == r``, of ``grad_out.flatten()[obase[j] : obase[j]+D]``
    (summed in occurrence order: deterministic)."""
    dev = grad_out.device
    grad_out = grad_out.contiguous()
    n = rows.numel()
    if n == 0:
        return rows.new_empty(0), torch.empty(0, D, dtype=torch.float32, device=dev)
    sorted_rows, perm = torch.sort(rows, stable=True)
    uniq, counts = torch.unique_consecutive(sorted_rows, return_counts=True)
    U = uniq.numel()
    seg_end = torch.cumsum(counts, 0)
    seg_start = seg_end - counts
    cmax = U + n // chunk  # Σ ceil(c/chunk) <= Σ (c/chunk + 1)
    nchunks, first, chunk_end, owner = _chunks(counts, chunk, cmax)
    grad = torch.empty(U, D, dtype=torch.float32, device=dev)
    partial = torch.empty(cmax if n >= chunk else 1, D, dtype=torch.float32, device=dev)
    _grad_chunks_kernel[(cmax,)](
        grad_out, obase.index_select(0, perm), owner, seg_start, seg_end, first, nchunks, grad, partial, U,
        CHUNK=chunk, D=D, BLOCK_N=block_n, BLOCK_D=_block_d(D), num_warps=num_warps or _warps(block_n, _block_d(D)),
    )
    if n >= chunk:
        _grad_reduce_kernel[(U,)](grad, partial, first, nchunks, D=D, BLOCK_D=_block_d(D), num_warps=1)
    return uniq, grad


class RowwiseAdagradInBackward:
    """Row-wise Adagrad applied by the lookup's backward itself (FBGEMM's "optimizer fused into
    backward"): the gradient of a touched row is summed and the row updated by the backward, in
    place in the fused buffer; no sparse gradient is materialised and nothing syncs with the host.

    The update is ``executor.optim.RowWiseAdagrad``'s: ``s_r += mean_j(g_rj²)``,
    ``w_r -= lr · g_r / (sqrt(s_r) + eps)``, in fp32, written back in the buffer's dtype. It runs
    once per backward, so with gradient accumulation it would update per micro-batch: the
    executor attaches it only when a step is one micro-batch. ``state``: ``[Σ rows]`` fp32.
    """

    def __init__(self, fused: FusedTables, *, lr: float, eps: float = 1e-8, block_n: int = 16,
                 chunk: int = DEFAULT_CHUNK, num_warps: int | None = None, programs_per_sm: int = 16):
        if lr <= 0:
            raise ValueError(f"sparse lr ({lr}) must be positive")
        if chunk < 1:
            raise ValueError(f"chunk ({chunk}) must be a positive number of occurrences")
        self.lr, self.eps, self.block_n, self.chunk = float(lr), float(eps), block_n, chunk
        self.num_warps, self.programs_per_sm = num_warps, programs_per_sm
        self.state = torch.zeros(fused.row_starts[-1], dtype=torch.float32, device=fused.buffer.device)

    def apply(self, buffer: Tensor, grad_out: Tensor, rows: Tensor, obase: Tensor, D: int) -> None:
        """Sort the occurrences by row; split each touched row's run into chunks of ``chunk``
        occurrences, spread over all programs (a row that a tenth of the batch looks up is summed
        by many SMs, not one); rows of one chunk are updated at once, hot rows after their chunks'
        partial sums are added in order (deterministic). Every size is a bound of ``n``: no host
        sync."""
        n = rows.numel()
        if n == 0:
            return
        dev, C = rows.device, self.chunk
        srows, perm = torch.sort(rows, stable=True)
        sobase = obase.index_select(0, perm)
        new = torch.ones(n, dtype=torch.bool, device=dev)
        torch.ne(srows[1:], srows[:-1], out=new[1:])
        seg = torch.cumsum(new, 0) - 1  # segment (touched row) of each sorted occurrence
        seg_start = torch.full((n + 1,), n, dtype=torch.int64, device=dev)  # [u] = first occurrence; unused = n
        seg_start.scatter_reduce_(0, seg, torch.arange(n, device=dev), reduce="amin")
        # [n] per segment, 0 past the last one; each chunk has an occurrence: <= n chunks
        nchunks, first, chunk_end, owner = _chunks(seg_start[1:] - seg_start[:-1], C, n)
        hot = nchunks > 1  # a hot row has more than C occurrences: fewer than n // C of them
        hot_bound = max(1, n // C)
        pchunks = torch.where(hot, nchunks, 0)
        pfirst = torch.cumsum(pchunks, 0) - pchunks  # a hot row's first partial sum
        hot_list = torch.full((hot_bound + 1,), n, dtype=torch.int64, device=dev)  # slot hot_bound: the others
        hot_list.scatter_(0, torch.where(hot, torch.cumsum(hot, 0) - 1, hot_bound), torch.arange(n, device=dev))
        # partial sums: Σ over hot rows of ⌈c/C⌉ < Σ (c/C + 1) <= 2n/C
        partial = torch.empty(2 * hot_bound + 1, D, dtype=torch.float32, device=dev)
        bd = _block_d(D)
        _adagrad_chunks_kernel[(min(n, self._programs(dev)),)](
            grad_out, sobase, srows, seg_start, owner, first, nchunks, chunk_end[-1:], pfirst,
            partial, buffer, self.state, self.lr, self.eps, CHUNK=C, D=D, BLOCK_N=self.block_n, BLOCK_D=bd,
            num_warps=self.num_warps or _warps(self.block_n, bd),
        )
        _adagrad_hot_rows_kernel[(hot_bound,)](
            hot_list, srows, seg_start, nchunks, pfirst, partial, buffer, self.state, n, self.lr, self.eps,
            D=D, BLOCK_D=bd, num_warps=max(1, min(4, bd // 128)),
        )


    def _programs(self, dev: torch.device) -> int:
        if dev.type != "cuda":
            return 8  # the interpreter: a few programs, each looping over several chunks
        return torch.cuda.get_device_properties(dev).multi_processor_count * self.programs_per_sm


def split_by_table(uniq: Tensor, grad: Tensor, fused: FusedTables) -> list[Tensor]:
    """Unique buffer rows and their gradients → one coalesced sparse COO gradient per table (a
    row -1, the padding ids of ``pooled_forward`` and ``unpooled_forward``, falls before the first
    table and is dropped)."""
    if uniq.numel():
        bounds = torch.searchsorted(uniq, fused.bounds_on(uniq.device)).tolist()  # the backward's 2nd host sync
    else:
        bounds = [0] * (len(fused.rows) + 1)
    out = []
    for t, rows in enumerate(fused.rows):
        a, b = bounds[t], bounds[t + 1]
        idx = (uniq[a:b] - fused.row_starts[t]).unsqueeze(0)
        out.append(torch.sparse_coo_tensor(idx, grad[a:b], (rows, fused.dim), is_coalesced=True,
                                               check_invariants=False))
    return out


# ---- autograd ------------------------------------------------------------------------------------
class PooledLookup(torch.autograd.Function):
    """``(fused, indices, offsets, B, mode, *tables)`` → ``[B, T·dim]``; sparse gradients to ``tables``."""

    @staticmethod
    def forward(ctx, fused: FusedTables, indices: Tensor, offsets: Tensor, B: int, mode: str, *tables: Tensor):
        save = any(ctx.needs_input_grad[5:])
        rs = fused.row_starts_on(fused.buffer.device)
        with record_function("embedding.tbe_pooled"):
            out, grow, obase = pooled_forward(fused.buffer, rs, indices, offsets, B, mode=mode, save=save)
        ctx.fused, ctx.B, ctx.mode = fused, B, mode
        if save:
            ctx.save_for_backward(grow, obase, offsets)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grow, obase, offsets = ctx.saved_tensors
        fused, B = ctx.fused, ctx.B
        T = len(fused.rows)
        grad_out = grad_out.float().contiguous()
        if ctx.mode == "mean":
            counts = offsets.diff().view(T, B).t().clamp(min=1).to(torch.float32)  # [B, T]
            grad_out = (grad_out.view(B, T, fused.dim) / counts.unsqueeze(2)).view(B, T * fused.dim)
        with record_function("embedding.tbe_backward"):
            if fused.in_backward is not None:
                fused.in_backward.apply(fused.buffer, grad_out, grow, obase, fused.dim)
                return (None,) * (5 + T)
            uniq, g = sparse_grad(grad_out, grow, obase, fused.dim)
            return (None,) * 5 + tuple(split_by_table(uniq, g, fused))


class UnpooledLookup(torch.autograd.Function):
    """``(groups, N, width, *ids_then_tables)``: each group ``(fused, cols)`` with ``ids [T_g, N]``;
    → ``[N, width]`` fp32; sparse gradients to each group's tables."""

    @staticmethod
    def forward(ctx, groups: Sequence[tuple[FusedTables, Tensor]], N: int, width: int, *args: Tensor):
        G = len(groups)
        ids, tables = args[:G], args[G:]
        dev = ids[0].device if G else torch.device("cpu")
        out = torch.empty(N, width, dtype=torch.float32, device=dev)
        save, saved = any(ctx.needs_input_grad[3 + G:]), []
        for (fused, cols), i in zip(groups, ids):
            with record_function("embedding.tbe_unpooled"):
                grow, obase = unpooled_forward(fused.buffer, fused.row_starts_on(dev), cols, i, out, save=save)
            saved += [grow, obase] if save else []
        ctx.groups = groups
        if save:
            ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad_out = grad_out.float().contiguous()
        saved, grads = ctx.saved_tensors, []
        for k, (fused, _) in enumerate(ctx.groups):
            with record_function("embedding.tbe_backward"):
                if fused.in_backward is not None:
                    fused.in_backward.apply(fused.buffer, grad_out, saved[2 * k], saved[2 * k + 1], fused.dim)
                    grads += [None] * len(fused.rows)
                    continue
                uniq, g = sparse_grad(grad_out, saved[2 * k], saved[2 * k + 1], fused.dim)
                grads += split_by_table(uniq, g, fused)
        return (None,) * (3 + len(ctx.groups)) + tuple(grads)


def pooled_lookup(fused: FusedTables, tables: Sequence[Tensor], indices: Tensor, offsets: Tensor, B: int, *,
                  mode: str = "sum") -> Tensor:
    """``[B, T·dim]`` fp32 pooled lookups of ``tables`` (views of ``fused``), differentiable."""
    return PooledLookup.apply(fused, indices, offsets, B, mode, *tables)


def unpooled_lookup(groups: Sequence[tuple[FusedTables, Tensor, Sequence[Tensor], Tensor]], N: int,
                    width: int) -> Tensor:
    """``groups``: ``(fused, cols [T_g] int64, tables, ids [T_g, N])``; → ``[N, width]`` fp32, differentiable."""
    spec = [(f, c) for f, c, _, _ in groups]
    ids = [i for _, _, _, i in groups]
    tables = [w for _, _, ts, _ in groups for w in ts]
    return UnpooledLookup.apply(spec, N, width, *ids, *tables)
