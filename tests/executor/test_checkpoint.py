"""Checkpoints: atomic saves, bitwise resume, a mesh change, and faults (``executor.checkpoint``).

In one process: a resumed run continues bitwise (sync and async saves), a torn save is ignored
and reported, bad input is one line; tables with hot rows rebuild whole from their shards. On 4
gloo ranks (2 × 2 dense, experts over 2, tables 2 × 2 fully sharded, two families with hot rows),
the default run's one multi-rank test: an uninterrupted run; a run whose rank 2 is killed with
SIGKILL mid-step, which the others leave within the timeout with one line naming it; a
``--resume`` of it whose every rank is killed during a save and that the launcher restarts once:
the torn save is skipped and reported, and the losses after the restart equal the uninterrupted
run's bitwise; its last checkpoint loaded into one process equals the uninterrupted run's weights.
A mesh change under training (4 → 2 ranks) and async saves on 4 ranks are ``slow``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

import scenarios
from executor import launch
from executor.checkpoint import CheckpointError, find_latest, resolve_resume, step_dir
from executor.train import fit, restore

TINY = ["training.global_batch=128", "training.micro_batch=32"]
MESH4 = ["hardware.num_gpus=4", "training.micro_batch=16", "parallelism.dense_replicate=2",
         "parallelism.dense_shard=2", "parallelism.expert=2", "parallelism.sparse_shard=2",
         "parallelism.sparse_replica=2", "parallelism.sparse_strategy=fully_sharded",
         "model.embeddings.pooled.0.hot_rows=50",  # user, table-wise here, and item, row-wise: hot rows
         "model.embeddings.sequences.0.tables.0.hot_rows=100"]  # fmt: skip
QUIET = dict(log=lambda _: None, profile_steps=0)


def _one(tmp: Path, *sets: str) -> scenarios.Scenario:
    return scenarios.load("debug-cpu", [*TINY, f"training.checkpoint.dir={tmp}", "training.checkpoint.every=2",
                                        "training.checkpoint.keep=5", *sets])  # fmt: skip


def _state(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    from executor.sharded_tables import full_tables

    params = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in model.named_parameters()}
    return {**params, **full_tables(model)}


def _same(a: dict, b: dict, skip: str = "\0") -> None:
    assert set(a) == set(b)
    for k in a:
        if skip not in k:
            assert torch.equal(a[k], b[k]), k


# ---- one process ----------------------------------------------------------------------------------
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_resumed_run_continues_bitwise(tmp_path, asynchronous):
    s = _one(tmp_path, f"training.checkpoint.async={str(asynchronous).lower()}")
    a, model_a = fit(s, steps=4, **QUIET)
    assert a.checkpoint_steps == [2, 4] and a.checkpoint_async is asynchronous and not a.resumed_from
    assert len(a.checkpoint_stall_s) == 2 and all(x > 0 for x in a.checkpoint_stall_s)
    assert [p.name for p in find_latest(tmp_path).committed] == ["step-00000002", "step-00000004"]
    b, model_b = fit(s, steps=4, resume=step_dir(tmp_path, 2), **QUIET)
    assert [x.step for x in b.steps] == [2, 3] and b.resumed_from == str(step_dir(tmp_path, 2))
    assert [x.loss for x in b.steps] == [x.loss for x in a.steps[2:]]  # bitwise
    _same(_state(model_a), _state(model_b))
    assert b.metrics["loss"] == a.metrics["loss"]
    meta = json.loads((step_dir(tmp_path, 4) / "meta.json").read_text())
    assert meta["step"] == 4 and meta["data_position"] == 4 * 128 // 32 and meta["world"] == 1


def test_a_torn_save_is_ignored_and_reported_and_old_ones_pruned(tmp_path):
    s = _one(tmp_path, "training.checkpoint.keep=1")
    a, _ = fit(s, steps=4, **QUIET)
    assert [p.name for p in find_latest(tmp_path).committed] == ["step-00000004"]  # keep 1: step 2 deleted
    torn = step_dir(tmp_path, 6).with_name("step-00000006.partial")  # a save that died before its commit
    shutil.copytree(step_dir(tmp_path, 4), torn)
    (torn / "meta.json").unlink()
    unmarked = step_dir(tmp_path, 8)  # a directory without the marker (never committed)
    unmarked.mkdir()
    found = find_latest(tmp_path)
    assert found.latest == step_dir(tmp_path, 4) and found.torn == [torn, unmarked]
    lines = []
    b, _ = fit(s, steps=6, resume=True, log=lines.append, profile_steps=0)
    assert b.resumed_from == str(step_dir(tmp_path, 4)) and [x.step for x in b.steps] == [4, 5]
    assert any(str(torn) in line and "never committed" in line for line in lines), lines
    assert find_latest(tmp_path).latest == step_dir(tmp_path, 6)
    assert not torn.exists()  # a torn save older than the newest committed one is cleaned up


def test_bad_resume_input_is_one_line(tmp_path):
    s = _one(tmp_path)
    assert resolve_resume(s, True) is None  # nothing saved yet: a fresh start
    with pytest.raises(CheckpointError, match=r"^--resume-from .*nope: no such directory"):
        resolve_resume(s, tmp_path / "nope")
    (tmp_path / "step-00000002").mkdir()
    with pytest.raises(CheckpointError, match=r"no committed checkpoint there \(no meta.json\)"):
        resolve_resume(s, tmp_path / "step-00000002")
    with pytest.raises(CheckpointError, match=r"^--resume needs training.checkpoint.dir"):
        resolve_resume(scenarios.load("debug-cpu", TINY), True)
    fit(s, steps=2, **QUIET)
    with pytest.raises(CheckpointError, match=r"^--steps 2: the checkpoint .* has trained 2 steps already"):
        fit(s, steps=2, resume=True, **QUIET)


def test_tables_with_hot_rows_are_rebuilt_whole_from_their_shards(tmp_path):
    """What each rank of the 4-rank mesh saves of a table with hot rows (its weight: the hot rows,
    then its cold ones; a table-wise table's non-owners hold the hot rows only) rebuilds the table
    and its Adagrad sums whole."""
    from executor.checkpoint import _layout_json, _rebuild, _saved_keys
    from executor.table_layout import table_layouts

    layouts = table_layouts(_four(tmp_path))
    assert {n: (L.kind, L.hot) for n, L in layouts.items() if L.hot} == {
        "user_0": ("table", 50), "user_1": ("table", 50), "user_2": ("table", 50), "item": ("row", 100)}
    for name in ("user_0", "item"):
        L = layouts[name]
        whole, sums = torch.randn(L.rows, L.dim), torch.rand(L.rows)
        meta = dict(whole=False, rows=L.rows, dim=L.dim, layout=_layout_json(L), S=2, R=2, split=True)
        held = {f"t@s{s}r{r}": L.held(s, r) for s in range(2) for r in range(2)}
        shards = {k: whole[rows, c0:c1] for k, (rows, c0, c1) in held.items()}
        keys = [k for k, _ in _saved_keys("t", meta)]
        assert all(shards[k].shape == shape for k, shape in _saved_keys("t", meta))
        w, acc = _rebuild(meta, {k: shards[k] for k in keys}, {k: sums[held[k][0]] for k in keys})
        assert torch.equal(w, whole) and torch.equal(acc, sums), name


def test_cli_resume_errors_exit_2_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from twin.cli import app

    r = CliRunner().invoke(app, ["train", "debug-cpu", "--resume-from", str(tmp_path / "none"), "--steps", "2",
                                 "--out", str(tmp_path / "r.json")])  # fmt: skip
    assert r.exit_code == 2 and "no such directory" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["train", "debug-cpu", "--max-restarts", "2"])
    assert r.exit_code == 2 and "needs --nproc" in r.output


# ---- four ranks: faults -------------------------------------------------------------------------------
def _four(tmp: Path, *sets: str) -> scenarios.Scenario:
    return _one(tmp, *MESH4, *sets)


def _rank(s: scenarios.Scenario, steps: int, resume, fault: str, logs: str) -> dict:
    """One rank of a launch (``run_rank``: a restarted group resumes from the newest checkpoint).
    ``fault``: ``kill_rank2`` (rank 2 sends itself SIGKILL in step 3's forward) or ``kill_in_save``
    (on the launcher's first attempt every rank dies once its files of the step-4 save are
    written, before the commit)."""
    import executor.train as train

    launched = launch.find_launcher()
    attempt = launch.restart_count()
    if fault == "kill_rank2" and launched.rank == 2:
        step = train._Session._step

        def dying(self, i, profiled):
            if i == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return step(self, i, profiled)

        train._Session._step = dying
    if fault == "kill_in_save" and attempt == 0:
        import torch.distributed.checkpoint as dcp

        save = dcp.save

        def dying_save(sd, *, checkpoint_id, **kw):
            out = save(sd, checkpoint_id=checkpoint_id, **kw)
            if "step-00000004" in str(checkpoint_id):
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        dcp.save = dying_save
    log_file = Path(logs) / f"attempt{attempt}-rank{launched.rank}.log"

    def log(line: str) -> None:
        with open(log_file, "a") as f:
            f.write(line + "\n")

    record = launch.run_rank(s, launched, timeout_s=60, steps=steps, resume=resume, log=log, profile_steps=0)
    return dict(losses=[x.loss for x in record.steps], steps=[x.step for x in record.steps],
                resumed=record.resumed_from, attempt=attempt)  # fmt: skip


def test_four_ranks_survive_a_killed_rank_and_a_crash_during_a_save(tmp_path):
    ref_dir, run_dir, logs = tmp_path / "ref", tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    a = launch.launch_local(_rank, (_four(ref_dir), 6, None, "", str(logs)), 4, timeout_s=60)[0]
    assert a["steps"] == list(range(6))
    # rank 2 dies by SIGKILL in step 3, after the step-2 checkpoint: the launcher stops the others
    # (a collective that waited would end the run past timeout_s with a "timed out" line instead:
    # the message says the first failure was the kill, and the whole line has nothing after it)
    with pytest.raises(launch.RankFailed,
                       match=r"^rank 2 of 4 was killed by signal 9 \(no Python error: it died\)(; \d+ more ranks? failed)?$"):
        launch.launch_local(_rank, (_four(run_dir), 6, None, "kill_rank2", str(logs)), 4, timeout_s=60)
    assert find_latest(run_dir).latest == step_dir(run_dir, 2)
    # --resume; every rank dies during the step-4 save; the launcher restarts the group once, which
    # resumes from step 2 again (the torn step-4 save skipped and reported)
    b = launch.launch_local(_rank, (_four(run_dir), 6, True, "kill_in_save", str(logs)), 4, timeout_s=60,
                            max_restarts=1)[0]  # fmt: skip
    assert b["attempt"] == 1 and b["resumed"] == str(step_dir(run_dir, 2)) and b["steps"] == [2, 3, 4, 5]
    assert b["losses"] == a["losses"][2:]  # bitwise, after a kill and a torn save
    report = (logs / "attempt1-rank0.log").read_text()
    assert "step-00000004.partial was never committed" in report, report
    assert [p.name for p in find_latest(run_dir).committed] == ["step-00000002", "step-00000004", "step-00000006"]
    # the 4-rank checkpoint loads into one process (experts regrouped, tables rebuilt whole)
    ref_model, trained = restore(_one(ref_dir), step_dir(ref_dir, 6))
    run_model, _ = restore(_one(run_dir), step_dir(run_dir, 6))
    assert trained == 6
    _same(_state(ref_model), _state(run_model))


def _mesh_rank(s4: scenarios.Scenario, s2: scenarios.Scenario, ckpt: str) -> dict:
    """Rank r of a 2-rank launch: the 4-rank checkpoint's state, gathered, and 2 more steps from it."""
    launched = launch.find_launcher()
    launch.join(s2, launched, timeout_s=60)
    try:
        model, step = restore(s2, ckpt)
        state = _state(model)
        record, _ = fit(s2, steps=step + 2, resume=ckpt, **QUIET)
        return dict(state=state, losses=[x.loss for x in record.steps])
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_a_four_rank_checkpoint_trains_on_at_two_ranks_and_one(tmp_path):
    s4 = _four(tmp_path, "training.checkpoint.async=true")
    a = launch.launch_local(_rank, (s4, 6, None, "", str(tmp_path)), 4, timeout_s=60)[0]
    assert a["steps"] == list(range(6))
    s2 = _one(tmp_path / "two", "hardware.num_gpus=2", "training.micro_batch=16", "parallelism.dense_replicate=1",
              "parallelism.dense_shard=2", "parallelism.expert=2", "parallelism.sparse_shard=2",
              "parallelism.sparse_replica=1")  # fmt: skip
    two = launch.launch_local(_mesh_rank, (s4, s2, str(step_dir(tmp_path, 4))), 2, timeout_s=60)[0]
    one, _ = restore(_one(tmp_path / "one"), step_dir(tmp_path, 4))
    _same(two["state"], _state(one), skip=".moe.experts.")  # rank 0 of 2 holds half of the experts
    # training on from it at another mesh: the same losses up to the reduction order
    assert two["losses"] == pytest.approx(a["losses"][4:6], rel=1e-5)


# ---- the torchrec backend ------------------------------------------------------------------------------
def _torchrec(tmp: Path, world: int) -> scenarios.Scenario:
    return _one(tmp, f"hardware.num_gpus={world}", f"parallelism.dense_shard={world}", f"parallelism.sparse_shard={world}",
                "parallelism.table_sharding={user: column, ad: data}", "parallelism.sparse_backend=torchrec")  # fmt: skip


def _restored(s: scenarios.Scenario, path: str) -> dict[str, torch.Tensor]:
    """Rank r of a launch: checkpoint ``path`` restored, every weight whole."""
    launched = launch.find_launcher()
    launch.join(s, launched, timeout_s=60)
    try:
        return _state(restore(s, path)[0])
    finally:
        torch.distributed.destroy_process_group()


def test_torchrec_tables_resume_bitwise_and_load_into_one_process(tmp_path):
    """TorchRec's column-wise and data-parallel tables on 2 ranks: a resume continues bitwise
    (weights and FBGEMM's Adagrad sums restored), and the checkpoint loads into one process's
    native tables with the same weights as into TorchRec's again."""
    pytest.importorskip("torchrec")
    s = _torchrec(tmp_path, 2)
    a = launch.launch_local(_rank, (s, 4, None, "", str(tmp_path)), 2, timeout_s=60)[0]
    b = launch.launch_local(_rank, (s, 4, str(step_dir(tmp_path, 2)), "", str(tmp_path)), 2, timeout_s=60)[0]
    assert b["steps"] == [2, 3] and b["losses"] == a["losses"][2:]
    two = launch.launch_local(_restored, (s, str(step_dir(tmp_path, 4))), 2, timeout_s=60)[0]
    one, _ = restore(_torchrec(tmp_path / "one", 1), step_dir(tmp_path, 4))
    _same(two, _state(one))
