"""Hot-row replication in the twin (``TableFamily.hot_rows``; ``scenarios.placement.hot_rows``): the
hot share of a table's lookups is answered locally on every rank, so the busiest shard and the
all-to-alls carry the cold part only, and the hot rows' gradients are all-reduced over every rank
once per step; without hot rows nothing changes."""

from __future__ import annotations

import pytest

import scenarios
from scenarios.placement import hot_rows, placements
from scenarios.vocab import CommGroup, Phase
from twin.imbalance import embedding_load_factor, hot_id_shares, hot_share, hot_splits
from twin.flops import model_costs
from twin.memory import comm_buffer_bytes, memory_per_rank
from twin.simulate import simulate
from twin.workload import Hardware, _group_layers, build_graph

HOT = 200_000
C0 = "model.embeddings.pooled.0.hot_rows"  # c0: 40 M rows, 3 ids a bag, table-wise over sparse_shard 8
C20 = "model.embeddings.pooled.20.hot_rows"  # c20: 40 M rows, 100 ids a bag, row-wise
B, DIM, FP32, BF16 = 8192, 128, 4.0, 2.0  # dlrm-dcnv2's micro-batch and dim; its tables fp32, its comm bf16


def _dlrm(*sets: str) -> scenarios.Scenario:
    return scenarios.load("dlrm-dcnv2", list(sets))


def _ops(s: scenarios.Scenario) -> dict:
    return {op.name: op for op in build_graph(s, Hardware.of(s))}


def test_hot_share_is_the_power_law_mass_of_the_lowest_ids():
    assert hot_share(40_000_000, 1.05, 1000) == pytest.approx(hot_id_shares(40_000_000, 1.05, 1000).sum(), rel=1e-9)
    assert hot_share(1000, 0.0, 10) == 0.01 and hot_share(500, 1.05, 500) == pytest.approx(1.0)
    later = hot_id_shares(100, 1.05, 10, start=5)
    assert later == pytest.approx(hot_id_shares(100, 1.05, 15)[5:]) and len(hot_id_shares(100, 1.05, 10, start=95)) == 5


def test_without_hot_rows_nothing_changes():
    """No hot rows: one table placement, no sparse_world collective. Hot rows of a data-parallel
    family (all its rows are on every rank already) and hot rows on one GPU change nothing."""
    base = _dlrm("parallelism.table_sharding={c0: data}")
    (tables,) = [lp for lp in placements(base) if lp.layer == "emb"]
    assert [p.rows for p in tables.params] == [""]
    assert all(c.group != CommGroup.SPARSE_WORLD for c in tables.collectives)
    data_hot = _dlrm("parallelism.table_sharding={c0: data}", f"{C0}={HOT}")
    assert hot_rows(data_hot) == {} and list(_ops(data_hot).values()) == list(_ops(base).values())
    assert memory_per_rank(data_hot) == memory_per_rank(base)
    assert embedding_load_factor(data_hot) == embedding_load_factor(base)
    one = scenarios.load("debug-cpu")
    one_hot = scenarios.load("debug-cpu", ["model.embeddings.pooled.0.hot_rows=100"])
    assert hot_rows(one_hot) == {} and list(_ops(one_hot).values()) == list(_ops(one).values())


def test_hot_lookups_leave_the_all_to_alls():
    """The ids all-to-all loses c0's hot ids (8 bytes each), the outputs all-to-all (and its
    backward) the bags whose 3 ids are all hot (h³ of them; the outputs travel in precision.comm)."""
    cold, hot = _ops(_dlrm()), _ops(_dlrm(f"{C0}={HOT}"))
    h = hot_share(40_000_000, 1.05, HOT)
    assert hot_splits(_dlrm(f"{C0}={HOT}"))["c0"].ids == pytest.approx(h) and 0.7 < h < 0.9
    ids = cold["sparse.input_dist"].bytes - hot["sparse.input_dist"].bytes
    assert ids == pytest.approx(8.0 * B * 3 * h)
    for name in ("sparse.output_dist.fwd", "sparse.output_dist.bwd"):
        assert cold[name].bytes - hot[name].bytes == pytest.approx(B * DIM * BF16 * h**3)
        assert hot[name].duration_s < cold[name].duration_s


def test_hot_gradients_are_all_reduced_over_every_rank_once_per_step():
    s = _dlrm(f"{C0}={HOT}", f"{C20}=1000", "training.global_batch=131072")  # two micro-batches
    assert s.grad_accum == 2
    graph = build_graph(s, Hardware.of(s))
    (ar,) = [op for op in graph if op.name.endswith("sparse.hot_grad_ar")]
    assert (ar.stream, ar.op_class, ar.phase, ar.axis) == ("comm.sparse_world", "all_reduce", Phase.BWD,
                                                          "sparse_world")  # fmt: skip
    assert ar.bytes == pytest.approx((HOT + 1000) * DIM * BF16)
    last_lookup_bwd = [op.name for op in graph if op.op_class == "embedding" and op.phase == "bwd"][-1]
    assert ar.deps == (last_lookup_bwd,) and last_lookup_bwd.startswith("mb1.")
    (opt,) = [op for op in graph if op.name.endswith("optimizer.dense.opt")]
    assert ar.name in opt.deps  # the step waits for it


def test_hot_rows_unload_the_busiest_shard():
    row_wise = [i for i, f in enumerate(_dlrm().model.embeddings.pooled) if f.rows > 1000]
    before = embedding_load_factor(_dlrm())
    some = embedding_load_factor(_dlrm(*(f"model.embeddings.pooled.{i}.hot_rows=1000" for i in row_wise)))
    every = _dlrm(*(f"model.embeddings.pooled.{i}.hot_rows={f.rows}"
                    for i, f in enumerate(_dlrm().model.embeddings.pooled)))  # fmt: skip
    assert before > some > 1.0 and embedding_load_factor(every) == pytest.approx(1.0)


def test_every_rank_holds_the_hot_rows_whole():
    """Memory: the hot rows and their Adagrad sums on each of the 8 ranks instead of 1/8 of them;
    the comm buffers hold the hot gradients' all-reduce."""
    cold, hot = memory_per_rank(_dlrm()), memory_per_rank(_dlrm(f"{C0}={HOT}"))
    grown = {k: hot.by_category_bytes[k] - cold.by_category_bytes[k] for k in cold.by_category_bytes}
    assert grown["embedding_shard"] == pytest.approx(HOT * DIM * FP32 * 7 / 8)
    assert grown["embedding_optimizer"] == pytest.approx(HOT * FP32 * 7 / 8)
    s = _dlrm(f"{C0}={HOT}")
    costs = model_costs(s.model, batch=B, precision=s.precision)
    buffers = comm_buffer_bytes(s, costs, _group_layers(costs))
    assert buffers[CommGroup.SPARSE_WORLD] == pytest.approx(2 * HOT * DIM * BF16)
    assert grown["activations"] == 0 and grown["embedding_grads"] == 0


@pytest.mark.parametrize("strategy, name", [("fully_sharded", "sparse.replica_ag"),
                                            ("replicated_sync", "sparse.replica_sync")])  # fmt: skip
def test_the_replicas_exchange_the_cold_part(strategy, name):
    """Over sparse_replica: the rows a batch touches (fully_sharded) are the cold ones; the shard
    synced (replicated_sync) is the cold shard."""
    mesh = ["parallelism.sparse_shard=4", "parallelism.sparse_replica=2", f"parallelism.sparse_strategy={strategy}"]
    cold, hot = _ops(_dlrm(*mesh)), _ops(_dlrm(*mesh, f"{C0}={HOT}"))
    if strategy == "fully_sharded":
        want = B * 3 * DIM * FP32 * hot_share(40_000_000, 1.05, HOT)
    else:
        want = HOT * DIM * FP32 / 4
    assert cold[name].bytes - hot[name].bytes == pytest.approx(want)


def test_at_64_gpus_hot_rows_shorten_the_step():
    """dlrm-dcnv2 on 64 GPUs, every table's 20,000 hottest rows replicated: fewer lookups on the
    busiest shard and a smaller sparse_shard all-to-all outweigh the new all-reduce."""
    mesh = ["hardware.num_gpus=64", "parallelism.sparse_shard=64", "parallelism.dense_replicate=64",
            "training.global_batch=524288"]  # fmt: skip
    fams = _dlrm(*mesh).model.embeddings.pooled
    before = simulate(_dlrm(*mesh))
    after = simulate(_dlrm(*mesh, *(f"model.embeddings.pooled.{i}.hot_rows={min(f.rows, 20_000)}"
                                    for i, f in enumerate(fams))))  # fmt: skip
    assert "sparse_world" in after.comm_s_by_axis and "sparse_world" not in before.comm_s_by_axis
    assert after.step_time_s < 0.8 * before.step_time_s
    assert after.comm_s_by_axis["sparse_shard"] < before.comm_s_by_axis["sparse_shard"]
    assert after.compute_s_by_op_class["embedding"] < before.compute_s_by_op_class["embedding"]


def test_simulate_lists_the_hot_all_reduce_under_its_axis():
    from typer.testing import CliRunner

    from twin.cli import app

    r = CliRunner().invoke(app, ["simulate", "dlrm-dcnv2", "--set", f"{C0}={HOT}"])
    assert r.exit_code == 0, r.output
    table = r.output[r.output.index("mesh axis"):]
    assert "sparse_world" in table and "sparse_shard" in table
