"""The torchrec extra: the scenario's pooled tables as a TorchRec EmbeddingBagCollection give
exactly the executor's pooled lookups; sharded by TorchRec over sparse_shard (the ``torchrec``
backend, ``executor.torchrec_tables``) they train as the single-process tables do. The sharded
checks run in one launch of 2 gloo ranks; the one-line refusals in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchrec  # the README's test command installs the torchrec extra: no silent skip here

import scenarios
from executor.data import SyntheticData
from executor.model import PooledTables
from executor.sparse import ebc_configs, pooled_kjt
from test_distributed import STEPS as STEPS_FIT, TINY as TINY_FIT, references  # noqa: F401  (a fixture)


def test_embedding_bag_collection_matches_pooled_tables():
    s = scenarios.load("debug-cpu")
    ours = PooledTables(s.model.embeddings)
    ebc = torchrec.EmbeddingBagCollection(tables=ebc_configs(s.model.embeddings))
    with torch.no_grad():
        for name, table in ours.tables.items():
            ebc.embedding_bags[name].weight.copy_(table.weight)
    batch = next(SyntheticData(s, 0))
    expected = ours(batch)
    got = ebc(pooled_kjt(batch)).to_dict()
    assert set(got) == set(expected) == {"user_0", "user_1", "user_2", "ad_0", "ad_1"}
    for name in expected:  # index by key: TorchRec's output order follows its own layout
        torch.testing.assert_close(got[name], expected[name])


# ---- the torchrec backend: the pooled tables sharded over sparse_shard (executor.torchrec_tables) ----
STEPS, LR = 3, 0.1
PLANS = {"table-wise": "{user: table, ad: table}", "column-wise": "{user: column, ad: column}",
         "data-parallel": "{user: data, ad: data}"}  # fmt: skip


def _two_ranks(plan: str, *sets: str) -> scenarios.Scenario:
    """debug-cpu on 2 ranks, sparse_shard 2: a step is 2 micro-batches of 32 on each rank."""
    return scenarios.load("debug-cpu", [
        "training.global_batch=128", "training.micro_batch=32", f"training.sparse_lr={LR}", "hardware.num_gpus=2",
        "parallelism.dense_shard=2", "parallelism.sparse_shard=2", f"parallelism.table_sharding={plan}",
        *sets])  # fmt: skip


def _initial(s: scenarios.Scenario) -> torch.nn.Module:
    """A module holding the model's PooledTables (``shard_pooled_torchrec`` reads ``model.pooled``)."""
    torch.manual_seed(0)
    holder = torch.nn.Module()
    holder.pooled = PooledTables(s.model.embeddings)
    return holder


def _loss(pooled: dict[str, torch.Tensor]) -> torch.Tensor:
    """A micro-batch's loss: the mean over samples of a square of fixed projections of every table's
    output (the same projections on every rank and in the reference)."""
    g = torch.Generator().manual_seed(1)
    z = sum(pooled[n] @ torch.randn(pooled[n].shape[1], generator=g) for n in sorted(pooled))
    return z.square().mean()


def _reference(s: scenarios.Scenario, world: int, blocks: dict[str, int]) -> tuple[dict, dict]:
    """One process trains the global batches (``world × grad_accum`` micro-batches per step, loss their
    mean) with ``RowWiseAdagrad``; a table kept in ``blocks[name] > 1`` column blocks (TorchRec's
    column-wise layout) keeps one row-wise accumulator per block instead. (tables, accumulators
    ``[blocks, rows]``)"""
    from executor.optim import RowWiseAdagrad, touched_rows

    tables = _initial(s).pooled
    whole = [t.weight for n, t in tables.tables.items() if blocks[n] == 1]
    opt = RowWiseAdagrad(whole, lr=LR) if whole else None
    acc = {n: torch.zeros(blocks[n], t.weight.shape[0]) for n, t in tables.tables.items() if blocks[n] > 1}
    data = SyntheticData(s, 0)
    n_mb = world * s.grad_accum
    for _ in range(STEPS):
        tables.zero_grad(set_to_none=True)
        for _ in range(n_mb):
            (_loss(tables(next(data))) / n_mb).backward()
        if opt is not None:
            opt.step()
        with torch.no_grad():
            for n, a in acc.items():
                w = tables.tables[n].weight
                rows, grad = touched_rows(w.grad)
                for j, cols in enumerate(torch.arange(w.shape[1]).chunk(blocks[n])):
                    g = grad[:, cols]
                    a[j].index_add_(0, rows, g.square().mean(dim=1))
                    w[rows[:, None], cols] -= LR * g / (a[j][rows].sqrt() + 1e-8)[:, None]
    acc.update({n: opt.state[t.weight]["sum"][None] for n, t in tables.tables.items() if blocks[n] == 1})
    return {n: t.weight.detach().clone() for n, t in tables.tables.items()}, acc


def _torchrec_rank(cases: list[scenarios.Scenario], step_case: scenarios.Scenario, out_dir: str) -> dict:
    """One rank: each plan in turn trains STEPS steps of its own micro-batches through TorchRec
    (one lookup per step, one backward through TorchRec, the data-parallel tables' step); then
    ``step_case`` trains through ``executor.train.fit``, the step ``gemtwin train`` runs."""
    import time

    from test_distributed import _weights

    from executor import launch
    from executor.mesh import build_mesh
    from executor.torchrec_tables import shard_pooled_torchrec
    from executor.train import fit

    launched = launch.find_launcher()
    launch.join(cases[0], launched, timeout_s=120)
    try:
        start = time.perf_counter()
        _drop_in(cases[0], launched.rank, launched.world_size)
        drop_in_s = time.perf_counter() - start
        out = []
        for s in cases:
            start = time.perf_counter()
            group = build_mesh(s, torch.device("cpu"))["sparse_shard"].get_group()
            model = _initial(s)
            pooled = shard_pooled_torchrec(model, s, group)
            assert all(torch.equal(pooled.full_tables()[n], t.weight) for n, t in model.pooled.tables.items())
            data = SyntheticData(s, 0, rank=launched.rank, world=launched.world_size)
            for step in range(STEPS):
                batches = [next(data) for _ in range(s.grad_accum)]
                if step == 0:  # one micro-batch's forward is its share of the step's lookup
                    with torch.no_grad():
                        alone = pooled(batches[1])
                outputs = pooled.lookup(batches)
                if step == 0:
                    assert all(torch.equal(alone[n], outputs[1][n]) for n in alone)
                for b in batches:  # forward of a looked-up batch: its leaves (the model's own call)
                    (_loss(pooled(b)) / len(batches)).backward()
                pooled.backward()
                pooled.step()
            out.append(dict(tables=pooled.full_tables(), accumulators=pooled.accumulators(),
                            wall_s=time.perf_counter() - start))
        start = time.perf_counter()
        record, model = fit(step_case, steps=STEPS_FIT, profile_steps=1, warmup_steps=1,
                            out=Path(out_dir) / "step.json", log=lambda _: None)  # fmt: skip
        weights = _weights(model)
        step = dict(record=record, weights=weights if launched.rank == 0 else None, wall_s=time.perf_counter() - start)
        return dict(rank=launched.rank, runs=out, drop_in_s=drop_in_s, step=step)
    finally:
        torch.distributed.destroy_process_group()


def _drop_in(s: scenarios.Scenario, rank: int, world: int) -> None:
    """The whole GEM gives the same logits with its pooled tables replaced by the TorchRec ones."""
    from executor.mesh import build_mesh
    from executor.model import build_model
    from executor.torchrec_tables import hand_over, shard_pooled_torchrec

    torch.manual_seed(0)
    model = build_model(s)
    batch = next(SyntheticData(s, 0, rank=rank, world=world))
    with torch.no_grad():
        expected, _ = model(batch)
        hand_over(model, shard_pooled_torchrec(model, s, build_mesh(s, torch.device("cpu"))["sparse_shard"].get_group()))
        assert not list(model.pooled.parameters())  # TorchRec's tables, not the model's
        got, _ = model(batch)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _step_case() -> scenarios.Scenario:
    """``gemtwin train``'s step with ``parallelism.sparse_backend: torchrec`` on 2 ranks: the pooled
    tables TorchRec's (user table-wise, ad data-parallel), the sequence tables native (row- and
    column-wise), the dense parameters FSDP2; ``test_distributed``'s global batches."""
    return scenarios.load("debug-cpu", TINY_FIT + [
        "hardware.num_gpus=2", "parallelism.dense_shard=2", "parallelism.sparse_shard=2",
        "parallelism.sparse_backend=torchrec",
        "parallelism.table_sharding={user: table, ad: data, item: row, action: column}"])  # fmt: skip


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One launch of 2 gloo ranks for the module's sharded checks (the plans, then the step)."""
    import time

    from executor import launch

    out = tmp_path_factory.mktemp("torchrec")
    cases = [_two_ranks(p) for p in PLANS.values()]
    start = time.perf_counter()
    results = launch.launch_local(_torchrec_rank, (cases, _step_case(), str(out)), 2, timeout_s=180)
    return dict(cases=cases, results=results, wall=time.perf_counter() - start, out=out)


def test_torchrec_sharded_tables_train_as_one_process(launched):
    """Table-wise (auto owners), column-wise and data-parallel on 2 ranks: the tables after 3 steps
    equal the single-process reference's (relative to the weights, and to the update the steps
    made), and so do the row-wise Adagrad sums (which show the gradient's scale); column-wise
    against TorchRec's per-column-block accumulators, and measurably not against one accumulator
    per row."""
    from executor.torchrec_tables import column_blocks

    cases, results, wall = launched["cases"], launched["results"], launched["wall"]
    initial = {n: t.weight.detach() for n, t in _initial(cases[0]).pooled.tables.items()}
    figures = {}
    for i, (label, s) in enumerate(zip(PLANS, cases)):
        ref, ref_acc = _reference(s, 2, column_blocks(s))
        got, acc = results[0]["runs"][i]["tables"], results[0]["runs"][i]["accumulators"]
        assert all(torch.equal(got[n], results[1]["runs"][i]["tables"][n]) for n in got)  # every rank's whole tables
        weights = max(_rel(got[n], ref[n]) for n in ref)
        update = max(_rel(got[n] - initial[n], ref[n] - initial[n]) for n in ref)
        # the sums of squared gradients: the gradient's scale over the ranks (the update does not show it)
        sums = max(_rel(acc[n], ref_acc[n]) for n in ref)
        figures[label] = dict(weights=weights, update=update, accumulators=sums)
        assert weights < 1e-6 and update < 1e-5 and sums < 1e-5, (label, figures[label])
        assert min(_rel(ref[n], initial[n]) for n in ref) > 1e-4  # the steps moved every table
    one_acc, _ = _reference(cases[1], 2, dict.fromkeys(initial, 1))  # column-wise vs one accumulator per row
    figures["column-wise vs one accumulator per row"] = max(
        _rel(results[0]["runs"][1]["tables"][n] - initial[n], one_acc[n] - initial[n]) for n in one_acc)
    assert figures["column-wise vs one accumulator per row"] > 1e-4
    print(f"\ntorchrec backend, 2 ranks: {figures}; launch {wall:.1f} s "
          f"(on rank 0: the whole-model check {results[0]['drop_in_s']:.1f} s, "
          f"each plan {[round(r['wall_s'], 1) for r in results[0]['runs']]} s)")


def test_torchrec_backend_refuses_row_wise_on_cpu_in_one_line():
    from executor.torchrec_tables import TorchrecPooled

    s = _two_ranks("{user: row, ad: table}")
    with pytest.raises(ValueError, match=r"^table user_0, user_1, user_2 \(family user\): row-wise, which the "
                       r"torchrec backend cannot shard on CPU \(TorchRec's CPU sharder allows table, column and data "
                       r"only\); set parallelism.sparse_backend=native, or parallelism.table_sharding.user to table or "
                       r"column$"):
        TorchrecPooled(s, {}, group=None)  # refused before any process group is needed


def test_torchrec_backend_refuses_grid_and_indivisible_columns_in_one_line():
    from executor.torchrec_tables import TorchrecPooled

    with pytest.raises(ValueError, match=r"^table ad_0, ad_1 \(family ad\): grid-wise, which the torchrec backend "
                       r"cannot shard \(our grid is not mapped onto TorchRec's grid_shard\); set "
                       r"parallelism.sparse_backend=native, or parallelism.table_sharding.ad to table or column$"):
        TorchrecPooled(_two_ranks("{user: table, ad: grid}"), {}, group=None)
    three = scenarios.load("debug-cpu", ["training.global_batch=96", "training.micro_batch=32", "hardware.num_gpus=3",
                                         "parallelism.dense_shard=3", "parallelism.sparse_shard=3",
                                         "parallelism.table_sharding={user: column}"])  # fmt: skip
    with pytest.raises(ValueError, match=r"^table user_0, user_1, user_2 \(family user\): column-wise over "
                       r"sparse_shard 3, which does not divide its dim \(32\); set parallelism.table_sharding.user "
                       r"to table, or a sparse_shard dividing 32$"):
        TorchrecPooled(three, {}, group=None)


def test_torchrec_backend_refuses_sparse_replicas_in_one_line():
    from executor.torchrec_tables import TorchrecPooled

    s = scenarios.load("debug-cpu", ["hardware.num_gpus=2", "training.micro_batch=32", "parallelism.dense_shard=2",
                                     "parallelism.sparse_replica=2"])  # fmt: skip
    with pytest.raises(ValueError, match=r"^parallelism.sparse_replica \(2\) must be 1 with parallelism.sparse_backend="
                       r"torchrec \(.*DMPCollection, CUDA only\): set parallelism.sparse_replica=1 and sparse_shard=2, "
                       r"or parallelism.sparse_backend=native$"):
        TorchrecPooled(s, {}, group=None)


def test_torchrec_backend_refuses_bf16_tables_in_one_line():
    from executor.torchrec_tables import TorchrecPooled

    s = scenarios.load("debug-cpu", ["precision.embeddings=bf16"])
    with pytest.raises(ValueError, match=r"^precision.embeddings \(bf16\) must be fp32 with parallelism.sparse_backend="
                       r"torchrec \(its tables train in fp32 here\): set precision.embeddings=fp32, or "
                       r"parallelism.sparse_backend=native$"):
        TorchrecPooled(s, {}, group=None)


def test_torchrec_backend_refuses_hot_rows_in_one_line():
    """Hot rows on a pooled table need the native backend; on a sequence table (native under this
    backend too) or a data-parallel family (all rows on every rank already) they are no matter."""
    from executor.torchrec_tables import check_plan

    hot = _two_ranks("{user: table, ad: column}", "model.embeddings.pooled.1.hot_rows=30")
    with pytest.raises(ValueError, match=r"^model\.embeddings\.pooled\[ad\]\.hot_rows \(30\) needs "
                       r"parallelism\.sparse_backend=native \(the torchrec backend has no hot-row replication\): set "
                       r"parallelism\.sparse_backend=native, or hot_rows to 0$"):
        check_plan(hot, torch.device("cpu"))
    fine = _two_ranks("{user: table, ad: data}", "model.embeddings.pooled.1.hot_rows=30",
                      "model.embeddings.sequences.0.tables.0.hot_rows=30")
    assert check_plan(fine, torch.device("cpu"))["ad_0"] == "data"


def test_torchrec_backend_names_the_fix_when_torchrec_does_not_import(monkeypatch):
    import sys

    from executor.torchrec_tables import require_torchrec

    monkeypatch.setitem(sys.modules, "torchrec", None)  # `import torchrec` now raises ImportError
    with pytest.raises(ImportError, match=r"^parallelism.sparse_backend=torchrec needs torchrec .*: install the "
                       r"torchrec extra as README.md's Set up does \(uv pip install -e '.\[exec,torchrec\]': plain "
                       r"pip pulls the CUDA fbgemm-gpu\) or set parallelism.sparse_backend=native$"):
        require_torchrec()


def test_sparse_backend_defaults_to_native():
    s = scenarios.load("debug-cpu")
    assert s.parallelism.sparse_backend == "native"
    assert scenarios.load("debug-cpu", ["parallelism.sparse_backend=torchrec"]).parallelism.sparse_backend == "torchrec"


def test_training_step_on_the_torchrec_backend_matches_one_process(launched, references):
    """``executor.train.fit`` on the torchrec backend (``_step_case``): losses, dense weights and
    every table equal the single-process run (``test_distributed``'s reference), to the tolerances
    the native backend is held to; the record is a multi-rank one."""
    from test_distributed import EXACT, _check_record, _kinds, _parity

    from twin.runrecord import load_run

    s, run = _step_case(), launched["results"][0]["step"]
    _check_record(load_run(launched["out"] / "step.json"), [dict(runs=[run])], 0, 2)
    assert all(r["step"]["record"].steps[-1].loss == run["record"].steps[-1].loss for r in launched["results"].values())
    got = _parity(references["gem"], run, _kinds(s), EXACT)
    print(f"\ntorchrec backend in the step, 2 ranks: parity {got}; fit {run['wall_s']:.1f} s on rank 0")


def test_a_plan_torchrec_cannot_run_is_refused_before_any_rank_starts():
    """``gemtwin train --nproc`` (``launch.spawn``) checks the torchrec plan first: a one-line
    ``ValueError`` (the CLI's exit 2), not a rank failing after the launch."""
    from executor import launch

    s = scenarios.load("debug-cpu", TINY_FIT + [
        "hardware.num_gpus=2", "parallelism.dense_shard=2", "parallelism.sparse_shard=2",
        "parallelism.sparse_backend=torchrec", "parallelism.table_sharding={user: row}"])  # fmt: skip
    with pytest.raises(ValueError, match=r"^table user_0, user_1, user_2 \(family user\): row-wise, which the "
                       r"torchrec backend cannot shard on CPU"):
        launch.spawn(s, 2)
