"""2D embedding parallelism (``executor.sharded_tables``, the ``native`` backend) trains exactly
what one process trains.

One launch of 4 ranks on gloo, in which every rank trains the tiny debug-cpu in turn with the
tables table-, row-, column-, grid-wise and data-parallel over ``sparse_shard`` 4 (families mixed,
as ``parallelism.table_sharding`` overrides, and the twin's ``auto``), and over ``sparse_shard`` 2
× ``sparse_replica`` 2 fully sharded: the losses, the dense weights and the tables rebuilt whole
(``full_tables``) match the single-process run of ``test_distributed`` (tables to ~1e-6 relative).
Hot rows (``TableFamily.hot_rows``: kept whole on every rank, gradients all-reduced over the
world, ``executor.hot_rows``) on a row-wise and a table-wise family and a sequence table, over
``sparse_shard`` 4 and 2 × 2 fully sharded, in the same launch, match it too.
``replicated_sync`` cannot match one process (each replica steps on its own share of the batch);
the same launch checks its invariants: the replicas' shards are identical after a sync step, and
differ after steps between syncs. The layout and routing maths is checked in-process.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import scenarios
from executor import launch
from executor.table_layout import TableLayout, grid_factors, table_layouts
from test_distributed import (  # noqa: F401  (references: the single-process runs, a fixture)
    EXACT, STEPS, TINY, _check_record, _kinds, _mesh_groups, _parity, _rel, _train, references,
)

MIXED = "{user: row, ad: column, item: row, action: table}"
GRID = "{user: grid, ad: data, item: column, action: grid}"
HOT = ["model.embeddings.pooled.0.hot_rows=50", "model.embeddings.pooled.1.hot_rows=30"]  # user 500 rows, ad 300


def _sparse(shard: int, replica: int = 1, plan: str | None = None, *sets: str) -> scenarios.Scenario:
    """debug-cpu on 4 ranks: dense_shard 4, tables over sparse_shard × sparse_replica."""
    return scenarios.load("debug-cpu", TINY + [
        "hardware.num_gpus=4", "parallelism.dense_shard=4", f"parallelism.sparse_shard={shard}",
        f"parallelism.sparse_replica={replica}", *([f"parallelism.table_sharding={plan}"] if plan else []),
        *sets])  # fmt: skip


PARITY = {
    "S4 user row, ad column, item row, action table": _sparse(4, plan=MIXED),
    "S4 user grid, ad data, item column, action grid": _sparse(4, plan=GRID),
    "S4 auto": _sparse(4),
    "S2 x R2 fully_sharded, user row, ad column, item grid, action table":
        _sparse(2, 2, "{user: row, ad: column, item: grid, action: table}"),
    "S4 hot rows: user row, ad table, item row (sequence), action table":
        _sparse(4, 1, "{user: row, ad: table, item: row, action: table}", *HOT,
                "model.embeddings.sequences.0.tables.0.hot_rows=100"),
    "S2 x R2 fully_sharded hot rows: user row, ad table, item grid, action table":
        _sparse(2, 2, "{user: row, ad: table, item: grid, action: table}", *HOT),
}
SYNC = {  # replicated_sync: sync every step (replicas equal at the end) and every 2nd (the 3rd step unsynced)
    "S2 x R2 replicated_sync every step": _sparse(2, 2, MIXED, "parallelism.sparse_strategy=replicated_sync"),
    "S2 x R2 replicated_sync every 2 steps": _sparse(2, 2, MIXED, "parallelism.sparse_strategy=replicated_sync",
                                                     "parallelism.sparse_sync_interval=2"),
}


def _backward_both(whole, model, batch) -> None:
    """One forward and backward of the whole-table model and of the sharded one on ``batch``."""
    for m in (whole, model):
        m.zero_grad(set_to_none=True)
        logits, aux = m(batch)
        (logits.sum() + aux).backward()


def _shards(model) -> dict[str, torch.Tensor]:
    """This rank's table shards, by parameter name."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if ".tables." in n}


def _rank(cases: list[scenarios.Scenario], out_dir: str) -> dict:
    """One rank of the launch: every case in turn over one process group."""
    from test_distributed import _weights

    from executor.train import fit

    launched = launch.find_launcher()
    launch.join(cases[0], launched, timeout_s=120)
    try:
        runs = []
        for i, s in enumerate(cases):
            record, model = fit(s, steps=STEPS, profile_steps=1, warmup_steps=1, out=Path(out_dir) / f"case{i}.json",
                                log=lambda _: None)  # fmt: skip
            weights = _weights(model)
            runs.append(dict(record=record, weights=weights if launched.rank == 0 else None,
                             shards=_shards(model), groups=_mesh_groups(s)))  # fmt: skip
        return dict(rank=launched.rank, runs=runs)
    finally:
        torch.distributed.destroy_process_group()


def test_sharded_tables_match_one_process(references, tmp_path):
    cases = {**PARITY, **SYNC}
    start = time.perf_counter()
    results = launch.launch_local(_rank, (list(cases.values()), str(tmp_path)), 4, timeout_s=120)
    wall = time.perf_counter() - start
    figures = {}
    for i, (label, s) in enumerate(cases.items()):
        record = scenarios_record(tmp_path, i)
        _check_record(record, results, i, 4)
        # the lookups' all-to-alls profiled under their axes; over the replicas (R > 1) the rows'
        # exchange (fully_sharded) or the sync (replicated_sync: the profiled 2nd step syncs here)
        assert "sparse_shard" in record.comm_s_by_axis, record.comm_s_by_axis
        assert ("sparse_replica" in record.comm_s_by_axis) == (s.parallelism.sparse_replica > 1), record.comm_s_by_axis
        assert ("sparse_world" in record.comm_s_by_axis) == ("hot rows" in label), record.comm_s_by_axis
        if label in PARITY:
            figures[label] = _parity(references["gem"], results[0]["runs"][i], _kinds(s), EXACT)
    sync = [list(SYNC).index(k) + len(PARITY) for k in SYNC]
    for i, synced in zip(sync, (True, False)):
        for r in (0, 1):  # rank r and r + 2 hold the same shard in the two replicas (sparse_shard 2)
            a, b = results[r]["runs"][i]["shards"], results[r + 2]["runs"][i]["shards"]
            diff = max(_rel(a[n], b[n]) for n in a if a[n].numel())
            assert (diff == 0.0) if synced else (diff > 1e-6), (i, r, diff)
        first = results[0]["runs"][i]["record"].steps[0].loss  # before any update: the reference's
        assert abs(first - references["gem"][0].steps[0].loss) < 1e-5 * abs(first)
    print(f"\nworld 4: parity {figures}; launch + {len(cases)} runs {wall:.1f} s")


def scenarios_record(tmp_path: Path, i: int):
    from twin.runrecord import load_run

    return load_run(tmp_path / f"case{i}.json")


# ---- layout and routing maths, in-process ------------------------------------------------------
def _layouts(shard: int, replica: int, plan: str, strategy: str = "fully_sharded") -> dict[str, TableLayout]:
    return table_layouts(_sparse(shard, replica, plan, f"parallelism.sparse_strategy={strategy}"))


def test_row_wise_deals_rows_round_robin():
    L = _layouts(4, 1, MIXED)["user_0"]
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 499])
    [(dest, local)] = L.route(ids)
    assert dest.tolist() == [0, 1, 2, 3, 0, 1, 3] and local.tolist() == [0, 0, 0, 0, 1, 1, 124]
    rows, c0, c1 = L.held(1, 0)
    assert rows[:3].tolist() == [1, 5, 9] and len(rows) == 125 and (c0, c1) == (0, 32)


def test_table_wise_goes_to_the_twins_owner():
    from scenarios.placement import table_owners

    s = _sparse(4)
    layouts, owners = table_layouts(s), table_owners(s)
    for name, owner in owners.items():
        [(dest, local)] = layouts[name].route(torch.tensor([0, 7]))
        assert dest.tolist() == [owner, owner] and local.tolist() == [0, 7]
        assert all(layouts[name].place(r) is None for r in range(4) if r != owner)


def test_column_blocks_are_contiguous_uneven_and_skip_empty_ones():
    L = TableLayout("t", rows=10, dim=10, kind="column", a=1, b=4, grid=((0, 1, 2, 3),))
    assert [L.cols(j) for j in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    narrow = TableLayout("t", rows=10, dim=2, kind="column", a=1, b=4, grid=((0, 1, 2, 3),))
    assert narrow.blocks() == [0, 1] and narrow.place(2) is None  # dim 2 < 4 shards: two hold nothing
    assert [d.tolist() for d, _ in narrow.route(torch.tensor([5]))] == [[0], [1]]


def test_grid_splits_rows_over_the_larger_factor():
    assert [grid_factors(S) for S in (2, 4, 6, 8, 9, 7)] == [(2, 1), (2, 2), (3, 2), (4, 2), (3, 3), (7, 1)]
    L = _layouts(4, 1, GRID)["item"]
    assert L.kind == "column" and _layouts(4, 1, GRID)["user_0"].grid == ((0, 1), (2, 3))
    routes = _layouts(4, 1, GRID)["user_0"].route(torch.tensor([0, 1, 2, 3]))
    assert [d.tolist() for d, _ in routes] == [[0, 2, 0, 2], [1, 3, 1, 3]]  # row class r % 2, column block j


@pytest.mark.parametrize("strategy", ["fully_sharded", "replicated_sync"])
def test_every_element_is_stored_once_per_replica_group(strategy):
    """Over the world, each table element lives on exactly one rank (fully sharded) or on one rank
    of each replica (replicated_sync)."""
    S, R = 2, 2
    for name, L in _layouts(S, R, "{user: row, ad: column, item: grid, action: table}", strategy).items():
        count = torch.zeros(L.rows, L.dim, dtype=torch.int64)
        for shard in range(S):
            for replica in range(R):
                rows, c0, c1 = L.held(shard, replica)
                count[rows, c0:c1] += 1
        assert (count == (1 if strategy == "fully_sharded" else R)).all(), name


# ---- the route on one rank (a gloo group of one, in-process) ----------------------------------
def _one_rank(backend: str, device: torch.device):
    import torch.distributed as dist

    from executor.mesh import build_mesh

    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield lambda s: build_mesh(s, device)
    finally:
        dist.destroy_process_group()


@pytest.fixture
def one_rank():
    yield from _one_rank("gloo", torch.device("cpu"))


@pytest.fixture
def one_gpu():
    yield from _one_rank("nccl", torch.device("cuda"))


def test_started_batches_look_up_and_differentiate_like_the_whole_tables(one_rank):
    """Every table routed through the all-to-alls (to itself), the ids sent ahead (``start``), as
    ``step_loss`` does for the next micro-batch: the same outputs and table gradients as the
    unsharded model, and nothing left in flight."""
    import copy

    from executor.data import SyntheticData
    from executor.parallelize import build
    from executor.sharded_tables import full_tables, shard_tables

    s = scenarios.load("debug-cpu", ["training.micro_batch=16", f"parallelism.table_sharding={MIXED}"])
    whole = build(s)
    model = copy.deepcopy(whole)
    tables = shard_tables(model, s, one_rank(s))
    assert all(m.routed for m in tables.modules) and model.pooled.sharded is not None
    batches = [next(SyntheticData(s, 0)) for _ in range(2)]
    for b in batches:
        tables.start(b)
    for b in batches:
        _backward_both(whole, model, b)
        assert all(id(b) not in m.pending for m in tables.modules)  # its ids, sent ahead, were taken
        grads = {n: p.grad.to_dense() for n, p in model.named_parameters() if ".tables." in n}
        for n, p in whole.named_parameters():
            if ".tables." in n:
                torch.testing.assert_close(grads[n], p.grad.to_dense(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(model(b)[0], whole(b)[0], rtol=1e-6, atol=1e-6)
    assert all(not m.pending for m in tables.modules)
    assert all(torch.equal(w, dict(whole.named_parameters())[n]) for n, w in full_tables(model).items())


@pytest.mark.gpu
def test_sharded_lookups_on_cuda_match_the_triton_lookups_of_whole_tables(one_gpu):
    """On CUDA over NCCL (a group of one): the sharded tables' lookups (the Triton TBE over the
    shard buffers: ``auto`` on CUDA), ids sent ahead, give the whole tables' (Triton TBE) outputs
    and gradients."""
    import copy

    from executor.data import SyntheticData
    from executor.parallelize import build
    from executor.sharded_tables import shard_tables

    s = scenarios.load("debug-cpu", ["training.micro_batch=16", f"parallelism.table_sharding={MIXED}"])
    with torch.device("cuda"):
        whole = build(s)
    model = copy.deepcopy(whole)
    tables = shard_tables(model, s, one_gpu(s))
    b = next(SyntheticData(s, 0)).to(torch.device("cuda"))
    tables.start(b)
    outs = []
    for m in (whole, model):
        pooled, seq = m.pooled(b), [g(b) for g in m.groups]
        (sum(x.sum() for x in pooled.values()) + sum(x.square().sum() for x in seq)).backward()
        outs.append((pooled, seq))
    for n in outs[0][0]:
        torch.testing.assert_close(outs[1][0][n], outs[0][0][n], rtol=1e-5, atol=1e-5)
    for a, c in zip(outs[1][1], outs[0][1]):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
    ref = dict(whole.named_parameters())
    for n, p in model.named_parameters():
        if ".tables." in n:
            torch.testing.assert_close(p.grad.to_dense(), ref[n].grad.to_dense(), rtol=1e-5, atol=1e-5)


# ---- hot rows, in-process --------------------------------------------------------------------------
def test_hot_rows_are_first_on_every_rank_and_the_cold_rows_dealt_after_them():
    """Rows [0, hot) on all four ranks (2 × 2 fully sharded), first in each rank's weight; every
    cold row on exactly one rank, dealt as without hot rows but counted from the first cold row."""
    layouts = table_layouts(_sparse(2, 2, "{user: row, ad: table, item: grid, action: table}", *HOT))
    user, ad = layouts["user_0"], layouts["ad_0"]
    assert (user.hot, ad.hot, layouts["item"].hot) == (50, 30, 0)
    [(dest, local)] = user.route(torch.tensor([50, 51, 52, 499]))  # cold rows 0, 1, 2, 449
    assert dest.tolist() == [0, 1, 0, 1] and local.tolist() == [0, 0, 1, 224]
    for L in (user, ad):
        count = torch.zeros(L.rows, dtype=torch.int64)
        for shard in range(2):
            for replica in range(2):
                rows, c0, c1 = L.held(shard, replica)
                assert rows[: L.hot].tolist() == list(range(L.hot)) and (c0, c1) == (0, L.dim)
                count[rows] += 1
        assert (count[: L.hot] == 4).all() and (count[L.hot :] == 1).all(), L.name


def test_hot_rows_need_row_or_table_wise_sharding_in_one_line():
    s = _sparse(4, 1, "{user: column}", "model.embeddings.pooled.0.hot_rows=50")
    msg = (r"^model\.embeddings\.pooled\[user\]\.hot_rows \(50\) needs row- or table-wise sharding in the native "
           r"backend, not column-wise \(a column shard holds no whole row\): set parallelism\.table_sharding\.user "
           r"to row or table, or hot_rows to 0$")  # fmt: skip
    with pytest.raises(ValueError, match=msg):
        table_layouts(s)
    with pytest.raises(ValueError, match=msg):  # `gemtwin train --nproc`: before any rank starts
        launch.spawn(s, 4)
    seq = _sparse(4, 1, "{item: grid}", "model.embeddings.sequences.0.tables.0.hot_rows=10")
    with pytest.raises(ValueError, match=r"^model\.embeddings\.sequences\[history\]\.tables\[item\]\.hot_rows \(10\) "
                       r"needs row- or table-wise sharding in the native backend, not grid-wise"):
        table_layouts(seq)


def test_the_twins_hot_share_is_the_share_of_drawn_ids_below_hot_rows():
    """The twin prices hot rows with ``hot_share``; the executor's data draws ids by ``zipf_ids``."""
    import numpy as np

    from executor.data import zipf_ids
    from twin.imbalance import hot_share

    for rows, skew, hot in ((500, 1.05, 50), (300, 0.8, 30), (1000, 1.1, 100), (8, 0.0, 2)):
        ids = zipf_ids(np.random.default_rng(0), 400_000, rows, skew)
        assert float((ids < hot).mean()) == pytest.approx(hot_share(rows, skew, hot), abs=0.003), (rows, skew)


def test_hot_ids_are_looked_up_at_home_and_only_the_cold_ones_routed(one_rank):
    """One rank (a gloo group of one) with hot rows laid out by hand (a one-rank Scenario has none):
    the routed ids are exactly the cold ones; outputs and table gradients (after ``reduce``: the hot
    rows' all-reduce) equal the whole tables'; ``full_tables`` rebuilds them."""
    import copy
    from dataclasses import replace

    from executor.data import SyntheticData
    from executor.hot_rows import HotGrads
    from executor.parallelize import build
    from executor.sharded_tables import Place, ShardedTables, full_tables, shard_modules

    s = scenarios.load("debug-cpu", ["training.micro_batch=16",
                                     "parallelism.table_sharding={user: row, ad: table, item: row, action: table}"])
    whole = build(s)
    model, mesh = copy.deepcopy(whole), one_rank(s)
    hot = {"user": 50, "ad": 30, "item": 100}
    layouts = {n: replace(L, hot=hot.get(n.split("_")[0], 0)) for n, L in table_layouts(s).items()}
    place = Place.of(s, mesh)
    modules = shard_modules(model, layouts, place)
    grads = HotGrads([(m.weight(n), m.layouts[n].hot) for m in modules for n in m.routed if m.layouts[n].hot],
                     mesh.world.get_group(), 1, "fp32")  # fmt: skip
    assert len(grads.params) == 6  # user_0..2, ad_0..1, item
    tables = ShardedTables(modules, place, {}, grads)
    batches = [next(SyntheticData(s, 0)) for _ in range(2)]
    pooled = modules[0]
    routed = pooled.route(batches[0])
    cold = sum(int((batches[0].pooled[n][0] >= layouts[n].hot).sum()) for n in pooled.routed)
    assert len(routed.payload) == cold < sum(len(batches[0].pooled[n][0]) for n in pooled.routed) / 2
    for b in batches:
        tables.start(b)
    for b in batches:
        _backward_both(whole, model, b)
        tables.reduce()
        got = {n: p.grad.to_dense() for n, p in model.named_parameters() if ".tables." in n}
        for n, p in whole.named_parameters():
            if ".tables." in n:
                torch.testing.assert_close(got[n], p.grad.to_dense(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(model(b)[0], whole(b)[0], rtol=1e-6, atol=1e-6)
    assert all(torch.equal(w, dict(whole.named_parameters())[n]) for n, w in full_tables(model).items())
