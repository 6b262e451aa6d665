"""The sharded tables' local lookups on the Triton TBE kernels (``executor.sharded_tables`` with
``execution.embedding_kernel: triton``): each rank's held shards laid out in one buffer per shard
width, looked up there by ``pooled_lookup`` / ``unpooled_lookup``, train what one process trains.

On CPU the kernels run under ``TRITON_INTERPRET=1`` (``tests/conftest.py`` sets it before triton
is imported; the spawned ranks inherit the environment) at tiny shapes. In-process, without a
process group: two shards' local lookups of what two sources sent, Triton against torch, outputs
and gradients (also on CUDA, ``gpu``). One launch of 2 ranks on gloo: table-, row-, column-wise
and data-parallel families in one scenario, the kernels asserted to have read every table buffer
(shards and the data-parallel tables' own) and summed gradients on every rank, losses and tables
matched to the single-process (torch) run to ``test_sparse_parallel``'s tolerances.
Grid, fully sharded replicas (whose owners gather the requested rows on the Triton kernel) and a
sequence group whose shards share one padded launch: 4 ranks, ``slow``.
"""

from __future__ import annotations

import copy
import functools
import gc
import os
import time
import weakref
from collections import Counter
from pathlib import Path
from unittest import mock

import pytest
import torch

import scenarios
from executor import launch
from test_distributed import EXACT, _kinds, _parity

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # as tests/conftest.py: before the kernels are decorated

TRITON = "execution.embedding_kernel=triton"
# smaller than test_distributed's runs (the interpreted kernels are slow, and the CI has 2 cores): one
# layer of each kind, sequences of 8 tokens on average, 2 steps of 4 micro-batches of 16 on one process
# (2 on each of 2 ranks: the shards' sparse gradients accumulate; one on each of 4)
STEPS = 2
SMALL = ["training.global_batch=64", "training.micro_batch=16", f"training.steps={STEPS}",
         "model.sequence.num_layers=1", "model.nonseq.num_layers=1",
         "model.embeddings.sequences=[{name: history, length: {shape: uniform, max: 12, mean: 8}, tables: "
         "[{name: item, rows: 1000, dim: 32, id_skew: 1.1}, {name: action, rows: 8, dim: 8, id_skew: 0.0}]}]"]


def _debug(world: int, *sets: str) -> scenarios.Scenario:
    return scenarios.load("debug-cpu", SMALL + [f"hardware.num_gpus={world}", f"parallelism.dense_shard={world}",
                                                f"parallelism.sparse_shard={world}", *sets])  # fmt: skip


def _sparse(world: int, shard: int, replica: int, plan: str, *sets: str) -> scenarios.Scenario:
    """debug-cpu on ``world`` ranks, the tables over ``sparse_shard × sparse_replica`` as ``plan``
    says, looked up by the Triton kernels."""
    return _debug(world, f"parallelism.sparse_shard={shard}", f"parallelism.sparse_replica={replica}",
                  f"parallelism.table_sharding={plan}", TRITON, *sets)  # fmt: skip


def _train(s: scenarios.Scenario, out: Path | None = None):
    """(record, model) of ``STEPS`` steps, unprofiled, the held-out evaluation after them cut to 2
    micro-batches (the parity is the training's)."""
    from executor import train

    with mock.patch.object(train, "evaluate", functools.partial(train.evaluate, batches=2)):
        return train.fit(s, steps=STEPS, profile_steps=0, out=out, log=lambda _: None)


# ---- two shards' local lookups, in-process (no process group) ------------------------------------
# action's dim 16 = item's column-shard width: on the shard holding action, one sequence buffer holds
# both, looked up at different counts (item: every token; action: its row class's) in one padded launch
SHARED_WIDTH = ("model.embeddings.sequences=[{name: history, length: {shape: uniform, max: 24, mean: 16}, "
                "tables: [{name: item, rows: 1000, dim: 32, id_skew: 1.1}, {name: action, rows: 8, dim: 16}]}]")


def _shard(model, s, shard: int):
    """``model`` (a copy) as shard ``shard`` of ``sparse_shard`` 2 holds it: ``shard_modules`` with a
    ``Place`` of no process group (the local lookups need none)."""
    from executor.sharded_tables import Place, shard_modules
    from executor.table_layout import table_layouts

    place = Place(shard, 0, None, None, S=2, R=1, world=2, strategy="fully_sharded", sync_interval=1)
    return shard_modules(model, table_layouts(s), place)


def _received(routed, d: int, T: int):
    """What shard ``d`` receives from each source: the ``(local row, bag or token)`` pairs (sorted by
    source, then table) and the counts row each source sent it."""
    recv, got = [], []
    for r in routed:
        counts = r.meta[:, :T].sum(dim=1).tolist()
        start = sum(counts[:d])
        recv.append(r.payload[start : start + counts[d]])
        got.append(r.meta[d].tolist())
    return torch.cat(recv), got


def _count_triton(patch=setattr) -> tuple[Counter, set[int]]:
    """Count the Triton lookups' launches (``kernels.embedding.tbe``'s forwards and backward
    gradient sums, by function) and collect the buffers the forwards read (their first argument),
    by data pointer. ``patch``: ``setattr``, or pytest's ``monkeypatch.setattr``."""
    from kernels.embedding import tbe

    calls, read = Counter(), set()
    for name in ("pooled_forward", "unpooled_forward", "sparse_grad"):
        def counted(*a, _f=getattr(tbe, name), _name=name, **k):
            calls[_name] += 1
            if _name != "sparse_grad":
                read.add(a[0].data_ptr())
            return _f(*a, **k)

        patch(tbe, name, counted)
    return calls, read


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_shard_local_lookups_on_triton_match_torch(device, monkeypatch):
    """Shards 0 and 1 of {user: row, ad: column, item: column, action: row} look up what two sources
    sent them (``ShardedLookups._local``), once on the Triton kernels and once on torch: the same
    answers to send back, the same sparse gradients of every shard. The whole tables' buffers are
    freed once the shards are laid out."""
    from executor.data import SyntheticData
    from executor.optim import touched_rows
    from executor.parallelize import build

    s = scenarios.load("debug-cpu", ["training.micro_batch=8", "hardware.num_gpus=2", "parallelism.dense_shard=2",
                                     "parallelism.sparse_shard=2", SHARED_WIDTH, TRITON,
                                     "parallelism.table_sharding={user: row, ad: column, item: column, action: row}"])
    with torch.device(device):
        whole = build(s)
    data = SyntheticData(s, 0)
    batches = [next(data).to(torch.device(device)) for _ in range(2)]  # sources 0 and 1
    calls, _ = _count_triton(monkeypatch.setattr)
    for d in (0, 1):
        model = copy.deepcopy(whole)
        old = [weakref.ref(f.buffer) for m in (model.pooled, *model.groups) for f in m.fused]
        shards = _shard(model, s, d)
        gc.collect()
        assert all(r() is None for r in old)  # the whole tables' buffers are gone
        for m in shards:
            params = [m.weight(n) for n in m.routed]
            assert m.module.use_triton(torch.device(device))
            assert {n for g in m.groups for n in g.names} == set(m.held)  # every held shard in a buffer
            T = len(m.routed)
            recv, got = _received([m.route(b) for b in batches], d, T)
            answers, grads = [], []
            for kernel in ("triton", "torch"):
                m.module.kernel = kernel
                before = sum(calls.values())
                back, sizes = m._local(recv, got, T, pooled=m.is_pooled, device=recv.device)
                g = torch.randn(back.shape, generator=torch.Generator().manual_seed(d)).to(back.device)
                (back * g).sum().backward()
                assert (sum(calls.values()) > before) == (kernel == "triton")
                answers.append((back.detach(), sizes))
                grads.append([touched_rows(p.grad) if p.grad is not None else None for p in params])
                for p in params:
                    p.grad = None
            assert answers[0][1] == answers[1][1]
            torch.testing.assert_close(answers[0][0], answers[1][0], rtol=1e-6, atol=1e-6)
            # the same touched rows (the column groups' sums of squares need them alike on their ranks),
            # their gradients summed in another order (a hot row gathers hundreds of fp32 terms)
            for a, b in zip(*grads):
                assert (a is None) == (b is None)
                if a is not None:
                    assert torch.equal(a[0], b[0])
                    torch.testing.assert_close(a[1], b[1], rtol=1e-5, atol=1e-5)
    # both kernels ran, forward and backward, and the padded sequence launch among them
    assert calls["pooled_forward"] and calls["unpooled_forward"] and calls["sparse_grad"], calls


# ---- trained on several ranks against one process -------------------------------------------------
@pytest.fixture(scope="module")
def reference():
    """The single-process run (debug-cpu made ``SMALL``, torch lookups): (record, weights)."""
    from test_distributed import _weights

    record, model = _train(_debug(1))
    return record, _weights(model)


def _buffers(model) -> dict[str, set[int]]:
    """The data pointers of every table buffer, shard or whole, and the held shards left out of one."""
    from executor.embeddings import _FusedTableModule

    mods = [m for m in model.modules() if isinstance(m, _FusedTableModule)]
    return dict(buffers={f.buffer.data_ptr() for m in mods for f, _ in m.fused_buffers()},
                unlaid={n for m in mods if m.sharded for n in m.sharded.held
                        if not any(n in g.names for g in m.sharded.groups)})  # fmt: skip


def _rank(cases: list[scenarios.Scenario], out_dir: str) -> dict:
    """One rank of the launch: every case in turn over one process group, the buffers its Triton
    lookups read recorded (``pooled_forward`` / ``unpooled_forward``'s first argument)."""
    from test_distributed import _weights

    calls, read = _count_triton()
    launched = launch.find_launcher()
    launch.join(cases[0], launched, timeout_s=120)
    try:
        runs = []
        for i, s in enumerate(cases):
            calls.clear()
            read.clear()
            record, model = _train(s, Path(out_dir) / f"case{i}.json")
            weights = _weights(model)
            runs.append(dict(record=record, weights=weights if launched.rank == 0 else None, read=set(read),
                             backward=calls["sparse_grad"], **_buffers(model)))  # fmt: skip
        return dict(rank=launched.rank, runs=runs)
    finally:
        torch.distributed.destroy_process_group()


def _check(reference, cases: dict[str, scenarios.Scenario], nproc: int, tmp_path: Path) -> dict:
    """``cases`` trained in one launch of ``nproc`` ranks: on every rank the Triton kernels read
    every table buffer and summed gradients; the run matches one process (``EXACT``)."""
    start = time.perf_counter()
    results = launch.launch_local(_rank, (list(cases.values()), str(tmp_path)), nproc, timeout_s=300)
    wall = time.perf_counter() - start
    from twin.runrecord import load_run

    figures = {}
    for i, (label, s) in enumerate(cases.items()):
        record = load_run(tmp_path / f"case{i}.json")
        assert record.world_size == nproc and record.execution["embedding_kernel"] == "triton"
        for rank, result in results.items():
            assert [x.loss for x in result["runs"][i]["record"].steps] == [x.loss for x in record.steps]
            run = result["runs"][i]
            assert run["buffers"] and run["buffers"] <= run["read"], (label, rank)
            assert not run["unlaid"] and run["backward"] > 0, (label, rank, run["unlaid"], run["backward"])
        figures[label] = _parity(reference, results[0]["runs"][i], _kinds(s), EXACT)
    print(f"\nworld {nproc}, Triton lookups: parity {figures}; launch + {len(cases)} runs {wall:.1f} s")
    return figures


def test_sharded_triton_lookups_match_one_process(reference, tmp_path):
    """2 ranks, sparse_shard 2: user row-wise, ad column-wise (shards of width 8: one buffer of the
    two), item table-wise (the sequence group's only routed table: one rank holds no shard of it),
    action data-parallel (whole, in the sharded module's own buffer, also on the Triton kernels)."""
    _check(reference, {"S2 user row, ad column, item table, action data":
                       _sparse(2, 2, 1, "{user: row, ad: column, item: table, action: data}")}, 2, tmp_path)


@pytest.mark.slow
def test_sharded_triton_grid_and_replicas_match_one_process(reference, tmp_path):
    """4 ranks: grid tables (2 × 2, shards of half width), item column-wise beside action table-wise
    (both of width 8: one sequence buffer, looked up at different counts in one padded launch);
    and sparse_shard 2 × sparse_replica 2 fully sharded (the owners gather the requested rows on
    the Triton unpooled kernel; the lookups into the fetched rows are torch)."""
    _check(reference, {
        "S4 user grid, ad column, item column, action table":
            _sparse(4, 4, 1, "{user: grid, ad: column, item: column, action: table}"),
        "S2 x R2 fully_sharded, user row, ad column, item grid, action table":
            _sparse(4, 2, 2, "{user: row, ad: column, item: grid, action: table}"),
    }, 4, tmp_path)  # fmt: skip
