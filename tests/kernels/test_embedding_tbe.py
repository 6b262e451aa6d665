"""Table-batched embedding lookups (kernels/embedding) against F.embedding_bag / index_select.

On CPU the Triton kernels run under TRITON_INTERPRET=1 at tiny shapes; the ``gpu`` tests run the
same checks at production-like sizes with Zipf ids.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when tbe's kernels are decorated

from kernels.embedding import cost  # noqa: E402
from kernels.embedding.layout import FusedTables, pack_bags, stack_ids  # noqa: E402
from kernels.embedding.reference import pooled_index_select, pooled_reference, unpooled_reference  # noqa: E402


def _tbe():
    from kernels.embedding import tbe

    return tbe


def _tables(rows, dim, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    f = FusedTables(rows, dim, dtype=dtype, device=device)
    f.buffer.copy_(torch.randn(f.buffer.shape, generator=g).to(dtype))
    return f, [torch.nn.Parameter(v) for v in f.views()]


def _bags(rows, B, max_pool, device, seed=0, skew=0.0, empty=(1,)):
    rng = np.random.default_rng(seed)
    from executor.data import zipf_ids

    bags = []
    for r in rows:
        counts = rng.integers(0, max_pool + 1, B)
        counts[list(e for e in empty if e < B)] = 0
        ids = zipf_ids(rng, int(counts.sum()), r, skew)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        bags.append((torch.from_numpy(ids).to(device), torch.from_numpy(offsets).to(device)))
    return bags


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def _check_pooled(rows, dim, B, max_pool, dtype, device, mode, skew=0.0, seed=0, hot=False):
    """``hot``: assert some row occurs more often than the backward's chunk (so hot rows' chunks are summed)."""
    tbe = _tbe()
    fused, params = _tables(rows, dim, dtype, device, seed)
    bags = _bags(rows, B, max_pool, device, seed, skew)
    indices, offsets = pack_bags(bags)
    if hot:
        assert max(int(torch.bincount(v).max()) for v, _ in bags) > tbe.DEFAULT_CHUNK
    # poisoned output: every element must be written
    out = torch.full((B, len(rows) * dim), float("nan"), device=device)
    tbe.pooled_forward(fused.buffer, fused.row_starts_on(fused.buffer.device), indices, offsets, B, mode=mode, out=out)
    assert torch.isfinite(out).all()
    ref = pooled_reference([p.detach() for p in params], bags, mode=mode, dtype=torch.float64)
    tol = 1e-6 if dtype == torch.float32 else 1e-6  # fp32 accumulation of exactly stored rows
    assert _rel(out, ref) < tol
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # bag 1 is empty in every table
    if mode == "sum":
        assert _rel(pooled_index_select([p.detach() for p in params], bags), ref) < 1e-6
    # gradients: the sparse per-table gradients equal autograd's through the float64 reference
    got = tbe.pooled_lookup(fused, params, indices, offsets, B, mode=mode)
    torch.testing.assert_close(got, out, rtol=0, atol=0)
    g = torch.randn(got.shape, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    (got * g).sum().backward()
    ref_w = [p.detach().double().requires_grad_() for p in params]
    (pooled_reference(ref_w, bags, mode=mode) * g.double()).sum().backward()
    for p, r, (values, _) in zip(params, ref_w, bags):
        assert p.grad.is_sparse and p.grad.shape == p.shape
        rows_touched = p.grad.coalesce().indices()[0]
        assert torch.equal(rows_touched.cpu(), torch.unique(values).cpu())  # exactly the touched rows
        assert _rel(p.grad.to_dense().double(), r.grad) < (1e-6 if dtype == torch.float32 else 1e-2)
    return params


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_pooled_matches_embedding_bag_and_grads(mode):
    _check_pooled([7, 5, 11], 8, B=5, max_pool=4, dtype=torch.float32, device="cpu", mode=mode)


def test_pooled_bf16_tables_and_untouched_table():
    tbe = _tbe()
    fused, params = _tables([6, 4], 16, torch.bfloat16, "cpu")
    bags = _bags([6, 4], 3, 3, "cpu", empty=(0, 1, 2))  # every bag empty: no id touches table 1 ...
    bags[0] = (torch.tensor([5, 0, 5]), torch.tensor([0, 1, 1, 3]))  # ... table 0 has three ids
    indices, offsets = pack_bags(bags)
    out = tbe.pooled_lookup(fused, params, indices, offsets, 3)
    w = params[0].detach().double()
    expected = torch.stack([w[5], torch.zeros_like(w[0]), w[0] + w[5]])
    assert _rel(out[:, :16], expected) < 1e-6 and torch.equal(out[:, 16:], torch.zeros(3, 16))
    out.sum().backward()
    assert params[1].grad._nnz() == 0
    g0 = params[0].grad.coalesce()
    assert g0.indices()[0].tolist() == [0, 5]
    torch.testing.assert_close(g0.values().float(), torch.tensor([[1.0] * 16, [2.0] * 16]))


def _adagrad_both_ways(dtype, device, *, block_n=4, lr=0.3, steps=2, chunk=256):
    """Pooled lookups on one fused buffer and unpooled on another, ``steps`` training steps:
    (a) sparse gradients then ``executor.optim.RowWiseAdagrad``, (b) ``RowwiseAdagradInBackward``
    in the backward. Returns ``{fused_update: (buffers, states)}``."""
    from executor.optim import RowWiseAdagrad

    tbe = _tbe()
    rows, B = [9, 5, 12], 6
    out = {}
    for fused_update in (False, True):
        (fp, pp), (fu, pu) = _tables(rows, 8, dtype, device), _tables(rows, 8, dtype, device, seed=1)
        if fused_update:
            for f in (fp, fu):
                f.in_backward = tbe.RowwiseAdagradInBackward(f, lr=lr, block_n=block_n, chunk=chunk)
        opt = RowWiseAdagrad(pp + pu, lr=lr)
        for step in range(steps):
            bags = _bags(rows, B, 9, device, seed=step, skew=1.5)  # hot rows: > block_n occurrences
            indices, offsets = pack_bags(bags)
            y = tbe.pooled_lookup(fp, pp, indices, offsets, B)
            # unpooled: 10 tokens, row 0 of every table 6 times
            ids = torch.tensor([[0] * 6 + [1, 2, 3, 4 % r] for r in rows], device=device)
            z = tbe.unpooled_lookup([(fu, torch.tensor([0, 8, 16], device=device), pu, ids)], 10, 24)
            g = torch.randn(y.shape, generator=torch.Generator().manual_seed(step)).to(device)
            ((y * g).sum() + z.square().sum()).backward()
            if fused_update:
                assert all(p.grad is None for p in pp + pu)  # no sparse gradient materialised
            opt.step()
            opt.zero_grad()
        if fused_update:
            states = [fp.in_backward.state, fu.in_backward.state]
        else:
            states = [torch.cat([opt.state[p]["sum"] if p in opt.state else torch.zeros(len(p), device=device)
                                 for p in ps]) for ps in (pp, pu)]  # fmt: skip
        out[fused_update] = torch.cat([fp.buffer, fu.buffer]), torch.cat(states)
        assert max(int(torch.bincount(v).max()) for v, _ in bags) > block_n
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype,chunk", [(torch.float32, 256), (torch.bfloat16, 256), (torch.float32, 3)])
def test_rowwise_adagrad_in_backward_equals_sparse_grads_then_optimizer(dtype, chunk, device):
    """The fused, sync-free update leaves the tables and the Adagrad state where the sparse
    gradients + ``RowWiseAdagrad.step`` leave them (hot rows, untouched rows, pooled and
    unpooled lookups, fp32 and bf16 tables; chunk 3: hot rows split over several programs
    whose partial sums are added by the hot-row pass, and rows of exactly one chunk)."""
    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the Triton interpreter is off where CUDA is present; the cuda case runs instead")
    out = _adagrad_both_ways(dtype, device, chunk=chunk)
    (w0, s0), (w1, s1) = out[False], out[True]
    # bf16: the optimizer adds a bf16-rounded delta, the fused kernel rounds w - delta once, so
    # the second step starts from weights one bf16 rounding apart
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(s1, s0, **tol)
    torch.testing.assert_close(w1.float(), w0.float(), **tol)
    assert not torch.equal(w1[:26], _tables([9, 5, 12], 8, dtype, device)[0].buffer)  # it did update


def test_unpooled_two_groups_fill_the_concatenated_output():
    tbe = _tbe()
    N = 9
    f128, p128 = _tables([13, 3], 8, torch.float32, "cpu", seed=1)  # two tables of dim 8
    f32, p32 = _tables([4], 4, torch.float32, "cpu", seed=2)  # one table of dim 4
    g = torch.Generator().manual_seed(3)
    ids = [torch.randint(0, r, (N,), generator=g) for r in (13, 3, 4)]
    ids[0][:4] = 7  # a repeated row
    # concatenation order: table 0 (dim 8), the dim-4 table, table 1 (dim 8): columns 0, 8, 12
    cols128, cols32 = torch.tensor([0, 12]), torch.tensor([8])
    out = tbe.unpooled_lookup([(f128, cols128, p128, stack_ids([ids[0], ids[1]])),
                               (f32, cols32, p32, stack_ids([ids[2]]))], N, 20)
    tables = [p128[0], p32[0], p128[1]]
    ref = unpooled_reference([t.detach() for t in tables], [ids[0], ids[2], ids[1]], dtype=torch.float64)
    assert out.shape == (N, 20) and _rel(out, ref) < 1e-7
    go = torch.randn(N, 20, generator=g)
    (out * go).sum().backward()
    ref_w = [t.detach().double().requires_grad_() for t in tables]
    (unpooled_reference(ref_w, [ids[0], ids[2], ids[1]]) * go.double()).sum().backward()
    for t, r in zip(tables, ref_w):
        assert _rel(t.grad.to_dense(), r.grad) < 1e-6


def test_unpooled_poisoned_output_and_empty():
    tbe = _tbe()
    f, _ = _tables([5], 4, torch.float32, "cpu")
    ids = torch.tensor([[4, 0, 4]])
    out = torch.full((3, 6), float("nan"))
    tbe.unpooled_forward(f.buffer, f.row_starts_on(torch.device("cpu")), torch.tensor([2]), ids, out)
    assert torch.equal(out[:, 2:], f.buffer[ids[0]]) and torch.isnan(out[:, :2]).all()  # only its columns
    empty = torch.empty(0, 4)
    grow, _ = tbe.unpooled_forward(f.buffer, f.row_starts_on(torch.device("cpu")), torch.tensor([0]),
                                   torch.empty(1, 0, dtype=torch.int64), empty, save=True)
    assert grow.numel() == 0


def test_unpooled_padding_ids_write_zeros_and_have_no_gradient():
    """Tables of one launch at different counts (``executor.sharded_tables``): each padded with -1
    to the longest. Padding writes zero rows and gives no gradient, also on a table not the first
    (whose row start - 1 is another table's row); the live ids match the unpadded lookups."""
    tbe = _tbe()
    f, p = _tables([5, 7], 4, torch.float32, "cpu", seed=5)
    ids = torch.tensor([[4, 0, 4, -1, -1], [6, 1, 6, 2, 0]])
    out = tbe.unpooled_lookup([(f, torch.tensor([0, 4]), p, ids)], 5, 8)
    assert torch.equal(out[3:, :4], torch.zeros(2, 4))
    assert torch.equal(out[:3, :4], p[0].detach()[ids[0, :3]]) and torch.equal(out[:, 4:], p[1].detach()[ids[1]])
    go = torch.randn(5, 8, generator=torch.Generator().manual_seed(6))
    (out * go).sum().backward()
    g0, g1 = p[0].grad.coalesce(), p[1].grad.coalesce()
    assert g0.indices()[0].tolist() == [0, 4] and g1.indices()[0].tolist() == [0, 1, 2, 6]
    torch.testing.assert_close(g0.to_dense()[4], go[0, :4] + go[2, :4])
    torch.testing.assert_close(g1.to_dense()[6], go[0, 4:] + go[2, 4:])


@pytest.mark.parametrize("chunk", [2, 3, 256])
def test_sparse_grad_hot_rows_split_into_chunks_is_exact_and_deterministic(chunk):
    tbe = _tbe()
    g = torch.Generator().manual_seed(4)
    D, R = 8, 6
    rows = torch.tensor([3, 3, 3, 3, 3, 3, 3, 0, 5, 3, 5, 1, 3])  # row 3 is hot
    grad_out = torch.randn(len(rows), D, generator=g)
    obase = torch.arange(len(rows)) * D
    uniq, grad = tbe.sparse_grad(grad_out, rows, obase, D, chunk=chunk, block_n=2)
    expected = torch.zeros(R, D, dtype=torch.float64).index_add_(0, rows, grad_out.double())
    assert uniq.tolist() == [0, 1, 3, 5]
    assert _rel(grad, expected[uniq]) < 1e-6
    again = tbe.sparse_grad(grad_out, rows, obase, D, chunk=chunk, block_n=2)[1]
    assert torch.equal(grad, again)


def test_pooled_lookup_row_over_default_chunk():
    """Through the autograd path: row 2 of table 0 occurs 600 times (3 chunks of DEFAULT_CHUNK = 256),
    row 1 257 times (2 chunks), others once; gradients against float64 autograd."""
    tbe = _tbe()
    assert tbe.DEFAULT_CHUNK < 257
    fused, params = _tables([4, 3], 4, torch.float32, "cpu", seed=5)
    v0 = torch.cat([torch.full((600,), 2), torch.full((257,), 1), torch.tensor([0, 3])])
    v0 = v0[torch.randperm(len(v0), generator=torch.Generator().manual_seed(6))]
    bags = [(v0, torch.tensor([0, 430, len(v0)])), (torch.tensor([2, 0, 2]), torch.tensor([0, 1, 3]))]
    indices, offsets = pack_bags(bags)
    out = tbe.pooled_lookup(fused, params, indices, offsets, 2)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    (out * g).sum().backward()
    ref_w = [p.detach().double().requires_grad_() for p in params]
    (pooled_reference(ref_w, bags) * g.double()).sum().backward()
    for p, r in zip(params, ref_w):
        assert _rel(p.grad.to_dense(), r.grad) < 1e-6
    assert params[0].grad.coalesce().indices()[0].tolist() == [0, 1, 2, 3]


def test_pack_bags_layout_and_errors():
    bags = [(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3])), (torch.tensor([4]), torch.tensor([0, 0, 1]))]
    indices, offsets = pack_bags(bags)
    assert indices.tolist() == [1, 2, 3, 4] and offsets.tolist() == [0, 2, 3, 3, 4]
    with pytest.raises(ValueError, match=r"^table 1: offsets have 2 entries, expected B\+1 = 3$"):
        pack_bags([bags[0], (torch.tensor([4]), torch.tensor([0, 1]))])
    tbe = _tbe()
    f, _ = _tables([3, 3], 4, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"^offsets: 5 entries, expected T·B\+1 = 7"):
        tbe.pooled_forward(f.buffer, f.row_starts_on(torch.device("cpu")), indices, offsets, 3)


def test_fused_tables_detect_copied_views():
    f, params = _tables([3, 4], 4, torch.float32, "cpu")
    assert f.holds(params)
    assert not f.holds([params[0], params[1].detach().clone()])
    assert not f.holds(params[:1])


def test_cost_counts_bytes():
    c = cost.pooled_cost(100, 10, 128)
    assert c.rows_bytes == 100 * 128 * 4 and c.out_bytes == 10 * 128 * 4 and c.index_bytes == 111 * 8
    assert c.bytes == c.rows_bytes + c.out_bytes + c.index_bytes and c.flops == 90 * 128
    u = cost.unpooled_cost(50, 32, elem_bytes=2)
    assert u.bytes == 50 * 32 * 2 + 50 * 32 * 4 + 50 * 8 and u.flops == 0
    with pytest.raises(ValueError, match=r"^dim = 0: must be > 0$"):
        cost.pooled_cost(1, 1, 0)


# ---- GPU: production-like sizes ------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_gpu_pooled_zipf(dtype, mode):
    _check_pooled([100_000, 50_000, 1000, 7], 128, B=512, max_pool=40, dtype=dtype, device="cuda", mode=mode,
                  skew=1.1, hot=True)


@pytest.mark.gpu
def test_gpu_pooled_odd_dim_and_backward_is_deterministic():
    tbe = _tbe()
    _check_pooled([3000, 20], 40, B=300, max_pool=9, dtype=torch.float32, device="cuda", mode="sum", skew=1.05)
    fused, params = _tables([200_000], 128, torch.float32, "cuda")
    bags = _bags([200_000], 4096, 64, "cuda", skew=1.2)
    indices, offsets = pack_bags(bags)
    grads = []
    for _ in range(2):
        out = tbe.pooled_lookup(fused, params, indices, offsets, 4096)
        out.backward(torch.ones_like(out))
        grads.append(params[0].grad.coalesce().values().clone())
        params[0].grad = None
    assert torch.equal(grads[0], grads[1])  # hot rows split over many chunks, summed in a fixed order


@pytest.mark.gpu
def test_gpu_unpooled_matches_index_select():
    tbe = _tbe()
    N = 100_003
    f, p = _tables([2_000_000, 64], 128, torch.float32, "cuda")
    rng = np.random.default_rng(0)
    from executor.data import zipf_ids

    ids = [torch.from_numpy(zipf_ids(rng, N, r, 1.1)).cuda() for r in (2_000_000, 64)]
    out = torch.full((N, 256), float("nan"), device="cuda")
    tbe.unpooled_forward(f.buffer, f.row_starts_on(f.buffer.device), torch.tensor([0, 128], device="cuda"),
                         stack_ids(ids), out)
    assert torch.equal(out, unpooled_reference([w.detach() for w in p], ids))
    # gradients: every row of the 64-row table occurs far more often than the backward's chunk
    assert int(torch.bincount(ids[1]).max()) > tbe.DEFAULT_CHUNK
    got = tbe.unpooled_lookup([(f, torch.tensor([0, 128], device="cuda"), p, stack_ids(ids))], N, 256)
    go = torch.randn(N, 256, device="cuda")
    got.backward(go)
    for w, i, cols in zip(p, ids, (slice(0, 128), slice(128, 256))):
        ref = torch.zeros(w.shape, dtype=torch.float64, device="cuda").index_add_(0, i, go[:, cols].double())
        gw = w.grad.coalesce()
        assert torch.equal(gw.indices()[0], torch.unique(i))  # exactly the touched rows
        assert _rel(gw.values(), ref[gw.indices()[0]]) < 1e-6


def _bench():
    import runpy

    return runpy.run_path(str(__import__("pathlib").Path(__file__).parents[2] / "executor/bench/embedding_bench.py"))


def test_bench_cpu_smoke(tmp_path):
    """executor/bench/embedding_bench.py end to end at toy sizes, two batch sizes: checks pass (the
    second size's gradient checks run after the first's timed steps), JSON has every case."""
    import json

    result = _bench()["main"](["--cpu-smoke", "--batches", "1,2", "--rotate", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "embedding_bench.json").read_text())
    assert saved["scenario"] == "debug-cpu" and len(saved["cases"]) == 6 == len(result["cases"])
    assert [c["batch"] for c in saved["cases"]] == [1, 1, 1, 2, 2, 2]
    for case in saved["cases"]:
        assert case["correct"] and case["bytes"] > 0 and case["rel_err"] < 1e-6, case
        assert case["grad_rel_err"] < 1e-6 and case["diffs"] == [], case
        assert {"torch embedding_bag", "torch embedding+cat"} & set(case["fwd"])
        assert set(case["fwd_tb_s"]) == set(case["fwd"]) and case["best_triton"].startswith("triton")


def test_bench_names_the_rows_and_tables_that_differ():
    """The bench's failure notes: rows touched by one side only, the largest row errors, non-finite bags."""
    bench = _bench()
    ours = [torch.sparse_coo_tensor([[0, 2]], torch.ones(2, 3), (5, 3), check_invariants=True),
            torch.sparse_coo_tensor([[1, 4]], torch.tensor([[1.0] * 3, [9.0] * 3]), (5, 3), check_invariants=True)]
    theirs = [torch.sparse_coo_tensor([[0, 3]], torch.ones(2, 3), (5, 3), check_invariants=True),
              torch.sparse_coo_tensor([[1, 4]], torch.ones(2, 3), (5, 3), check_invariants=True)]
    worst, notes = bench["_sparse_err"](torch, ours, theirs, ["t0", "t1"], 1e-5)
    assert worst == float("inf") and len(notes) == 2
    assert notes[0] == "grad table t0: 2 rows in ours, 2 in PyTorch's; 1 only in ours [2], 1 only in PyTorch's [3]"
    assert notes[1].startswith("grad table t1: rel err 5.66e+00; 0 rows non-finite []; largest errors at rows [4, 1]")
    out = torch.zeros(4, 5)
    out[2, 3] = float("nan")  # table b (columns 2:5), bag 2
    notes = bench["_dense_diff"](torch, out, torch.zeros(4, 5), ["a", "b"], [2, 3], 1e-6, "bag")
    assert len(notes) == 1 and notes[0].startswith("output table b: rel err nan; 1 bags non-finite [2]; "
                                                   "largest errors at bags [2,")


def test_sparse_update_bench_cpu_smoke(tmp_path):
    """executor/bench/sparse_update_bench.py end to end at toy sizes: every table group of debug-cpu
    checked (each chunk size against one program per row) and in the JSON."""
    import json
    import runpy

    path = __import__("pathlib").Path(__file__).parents[2] / "executor/bench/sparse_update_bench.py"
    result = runpy.run_path(str(path))["main"](["--cpu-smoke", "--batch", "8", "--chunks", "2", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "sparse_update_bench.json").read_text())
    assert saved["scenario"] == "debug-cpu" and len(saved["cases"]) == 4 == len(result["cases"])
    for case in saved["cases"]:
        assert case["correct"] and set(case["seconds"]) == {"unchunked", "chunk 2"}, case
    assert max(c["hottest_row_ids"] for c in saved["cases"]) > 2  # some row spans several chunks
