"""Several ranks on gloo train exactly what one process trains (the first step of the 5D executor).

One process trains a tiny debug-cpu for a few steps at the global batch of 4 micro-batches; the
same scenario on 2 ranks (``dense_shard`` 2, and ``dense_replicate`` 2) and on 4 ranks (HSDP 2×2,
and ``dense_shard`` 4 without resharding after forward), and a tiny DCNv2 DLRM on 2 ranks (whose
root FSDP unit holds no parameter), must give the same losses, the same
updated dense weights (FSDP2 units, to ~1e-4 relative: fp32 sums in another order) and the same embedding tables
(sparse_shard = world: sharded as the twin's ``auto`` plan says, ``executor.sharded_tables``;
row-wise Adagrad: to ~1e-6); bf16 (autocast, gradients reduced
in bf16) on 4 ranks stays within bf16's reach of them. Every
check of a world runs in one launch (a launch costs a torch import per rank, ~16 s for 8 ranks on
the 2-core CI machine): each rank trains every configuration in turn over the one process group.
The one-line errors are checked in-process, without a launch.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import scenarios
from executor import launch
from executor.mesh import check_world
from executor.train import fit
from scenarios.placement import axis_group
from scenarios.vocab import CommGroup
from twin.runrecord import load_run

STEPS = 3
TINY = ["training.global_batch=128", "training.micro_batch=32", f"training.steps={STEPS}"]
# relative differences. Dense: fp32 sums in another order (gradients reduce-scattered over ranks), which
# AdamW turns into whole learning-rate steps on near-zero gradients: a zero-initialised LayerNorm bias
# differed by 1.5e-5 after 3 steps on CI's CPU (8e-6 here); a sharding bug moves weights by 1e-2 and more
EXACT = dict(loss=1e-5, dense=1e-4, sparse=1e-6)
# bf16 rounds differently on 4 ranks (gradients reduced in bf16, sums in another order), and AdamW
# turns a near-zero gradient of either sign into a full learning-rate step, which the small,
# zero-initialised LayerNorm biases show most (0.3 relative after 3 steps): only the loss is held
BF16 = dict(loss=1e-2, dense=float("inf"), sparse=float("inf"))
BF16_SETS = ["precision.mlp=bf16", "precision.attention=bf16", "precision.comm=bf16"]
# the FSDP2 modules: one unit per placement layer (a ModuleDict by its Linear, a DCN layer's V and U
# together), and the root ("")
GEM_UNITS = {"", "bottom", "family_proj.ad", "groups.0.proj", "seq_layers.0", "seq_layers.1", "nonseq_layers.0",
             "nonseq_layers.1", "cross_layers.0", "top", "heads"}  # fmt: skip
DLRM_UNITS = {"", "bottom", "V.0", "U.0", "V.1", "U.1", "top", "heads"}


def _scenario(world: int, replicate: int = 1, shard: int = 1, *sets: str) -> scenarios.Scenario:
    return scenarios.load("debug-cpu", TINY + [
        f"hardware.num_gpus={world}", f"parallelism.dense_replicate={replicate}",
        f"parallelism.dense_shard={shard}", f"parallelism.sparse_shard={world}", *sets])  # fmt: skip


def _dlrm(world: int) -> scenarios.Scenario:
    """A tiny DCNv2 DLRM in fp32 (the bundled one computes and reduces in bf16)."""
    tables = ", ".join(f"{{name: c{i}, rows: {r}, dim: 16, pooling: {{shape: uniform, max: {k}, mean: {k * 0.75}}}}}"
                       for i, (r, k) in enumerate([(100, 4), (50, 2), (7, 2)]))  # fmt: skip
    return scenarios.load("dlrm-dcnv2", TINY + [
        f"model.embeddings.pooled=[{tables}]", "model.bottom_mlp=[32, 16]", "model.top_mlp=[32, 16]",
        "model.dcn_layers=2", "model.dcn_rank=8", "precision.mlp=fp32", "precision.attention=fp32",
        "precision.comm=fp32", f"hardware.num_gpus={world}", "parallelism.dense_replicate=1",
        f"parallelism.dense_shard={world}", "parallelism.sparse_replica=1", f"parallelism.sparse_shard={world}"])  # fmt: skip


@dataclass(frozen=True)
class Case:
    """A configuration a launch trains, and what it must match."""

    scenario: scenarios.Scenario
    reference: str = "gem"  # the single-process run it must match: "gem" (debug-cpu) or "dlrm"
    rtol: dict = field(default_factory=lambda: EXACT)
    units: frozenset = frozenset(GEM_UNITS)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (a DTensor's shards gathered, the sharded tables rebuilt: collectives,
    on every rank)."""
    from torch.distributed.tensor import DTensor

    from executor.sharded_tables import full_tables

    params = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in model.named_parameters()}
    return {**params, **full_tables(model)}  # tables TorchRec trains are not the model's parameters


def _train(s: scenarios.Scenario, out: Path | None = None):
    """(record, whole weights, names of the FSDP2 modules)."""
    from torch.distributed.fsdp import FSDPModule

    record, model = fit(s, steps=STEPS, profile_steps=1, warmup_steps=1, out=out, log=lambda _: None)
    return record, _weights(model), {n for n, m in model.named_modules() if isinstance(m, FSDPModule)}


def _mesh_groups(s: scenarios.Scenario) -> dict[str, list[int]]:
    """This rank's group on every axis of the mesh the run builds, by rank."""
    from executor.mesh import build_mesh

    mesh = build_mesh(s, torch.device("cpu"))
    return {str(a): mesh[a].mesh.tolist() for a in CommGroup}


def _rank(cases: list[scenarios.Scenario], out_dir: str) -> dict:
    """One rank of a launch: every case in turn over one process group."""
    launched = launch.find_launcher()
    launch.join(cases[0], launched, timeout_s=120)
    try:
        runs = []
        for i, s in enumerate(cases):
            record, weights, units = _train(s, Path(out_dir) / f"case{i}.json")
            runs.append(dict(record=record, weights=weights if launched.rank == 0 else None, units=units,
                             groups=_mesh_groups(s)))  # fmt: skip
        return dict(rank=launched.rank, runs=runs)
    finally:
        torch.distributed.destroy_process_group()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _parity(ref, run, kinds: dict[str, str], rtol: dict[str, float]) -> dict[str, float]:
    """The largest relative difference of the losses, dense weights and tables (asserted), and the
    parameter where the dense one is."""
    (ref_record, ref_w), record, weights = ref, run["record"], run["weights"]
    rel = {n: _rel(weights[n], ref_w[n]) for n in ref_w}
    worst = max((n for n in rel if kinds[n] != "sparse"), key=rel.get)
    got = dict(loss=max(abs(a.loss - b.loss) / abs(b.loss) for a, b in zip(record.steps, ref_record.steps)),
               dense=rel[worst], sparse=max(v for n, v in rel.items() if kinds[n] == "sparse"))  # fmt: skip
    assert all(got[k] < rtol[k] for k in got), (got, worst)
    return {**got, "worst dense": worst}


def _kinds(s: scenarios.Scenario) -> dict[str, str]:
    from executor.model import build_model
    from executor.parallelize import claim_parameters
    from scenarios.placement import placements

    claims = claim_parameters(build_model(s), placements(s))
    return {n: str(k) for kinds in claims.values() for k, names in kinds.items() for n in names}


@pytest.fixture(scope="module")
def references():
    """The single-process runs: 4 micro-batches of 32 per step. Their weights moved from their
    initial values (the parity is not of untrained models)."""
    from executor.model import build_model

    out = {}
    for name, s in (("gem", _scenario(1)), ("dlrm", _dlrm(1))):
        record, weights, _ = _train(s)
        initial = dict(build_model(s).named_parameters())
        assert min(_rel(w, initial[n].detach()) for n, w in weights.items() if "tables" not in n) > 1e-4
        out[name] = record, weights
    return out


def _check_world(references, cases: dict[str, Case], nproc: int, tmp_path: Path) -> dict:
    """``cases`` (by label), all trained in one launch of ``nproc`` ranks."""
    start = time.perf_counter()
    results = launch.launch_local(_rank, ([c.scenario for c in cases.values()], str(tmp_path)), nproc,
                                  timeout_s=120)  # fmt: skip
    wall = time.perf_counter() - start
    figures = {}
    for i, (label, case) in enumerate(cases.items()):
        s = case.scenario
        figures[label] = _parity(references[case.reference], results[0]["runs"][i], _kinds(s), case.rtol)
        assert all(r["runs"][i]["units"] == case.units for r in results.values())
        for rank, result in results.items():  # each axis's group is the placement's (size, stride)
            for axis, group in result["runs"][i]["groups"].items():
                size, stride = axis_group(s, axis)
                base = rank - (rank // stride % size) * stride
                assert group == [base + k * stride for k in range(size)], (rank, axis, group)
        _check_record(load_run(tmp_path / f"case{i}.json"), results, i, nproc)
    print(f"\nworld {nproc}: parity {figures}; launch + {len(cases)} runs {wall:.1f} s")
    return figures


def _check_record(record, results, i: int, nproc: int) -> None:
    """Rank 0 wrote the record: the world, the mesh, every rank's step times (the step's is the
    slowest's) and peak memory."""
    assert record.world_size == nproc and record.environment.num_devices == nproc
    axes = {str(a) for a in CommGroup if a != CommGroup.SPARSE_WORLD}  # (sparse_world: the world)
    assert record.mesh["world"] == nproc and set(record.mesh) >= axes
    assert len(record.rank_step_time_s) == nproc and len(record.rank_peak_memory_bytes) == nproc
    for step, s in enumerate(record.steps):
        assert s.step_time_s == max(times[step] for times in record.rank_step_time_s)
    assert record.peak_memory_bytes == max(record.rank_peak_memory_bytes) > 0
    assert record.execution["fused_sparse_update"] is False
    assert record.steps == results[0]["runs"][i]["record"].steps  # every rank made the same record
    # the profiled step's collectives, per axis: FSDP's over the dense axes, the loss's over the world
    dense = {a for a in ("dense_shard", "dense_replicate") if record.mesh[a] > 1}
    assert dense <= set(record.comm_s_by_axis) and "world" in record.comm_s_by_axis, record.comm_s_by_axis
    for axis, busy in record.comm_s_by_axis.items():
        assert busy > 0 and 0 <= record.exposed_comm_s_by_axis[axis] <= busy
        assert record.overlapped_comm_s_by_axis[axis] == pytest.approx(busy - record.exposed_comm_s_by_axis[axis])
    assert record.collective_path == "gloo"


def test_two_ranks_match_one_process(references, tmp_path):
    """dense_shard 2 (FSDP) and dense_replicate 2 (HSDP with a shard of one), and the DLRM on
    dense_shard 2; 2 micro-batches each."""
    _check_world(references, {"dense_shard 2": Case(_scenario(2, shard=2)),
                              "dense_replicate 2": Case(_scenario(2, replicate=2)),
                              "DLRM dense_shard 2": Case(_dlrm(2), "dlrm", units=frozenset(DLRM_UNITS))},
                 2, tmp_path)  # fmt: skip


@pytest.mark.slow
def test_four_ranks_match_one_process(references, tmp_path):
    """HSDP 2×2, dense_shard 4 keeping the gathered units from forward to backward, and bf16 HSDP
    2×2; one micro-batch each."""
    _check_world(references, {
        "HSDP 2x2": Case(_scenario(4, 2, 2)),
        "dense_shard 4, no reshard after forward": Case(_scenario(4, 1, 4, "parallelism.fsdp_reshard_after_forward=false")),
        "HSDP 2x2 bf16": Case(_scenario(4, 2, 2, *BF16_SETS), rtol=BF16),
    }, 4, tmp_path)  # fmt: skip


# ---- faults --------------------------------------------------------------------------------------
def _dies(s: scenarios.Scenario) -> None:
    """Rank 1 dies (no Python error) after the group formed; rank 0 then waits in a collective."""
    import os

    launched = launch.find_launcher()
    launch.join(s, launched, timeout_s=60)
    if launched.rank == 1:
        os._exit(7)
    torch.distributed.barrier()


@pytest.mark.slow
def test_a_dying_rank_ends_the_run_naming_it():
    start = time.perf_counter()
    with pytest.raises(launch.RankFailed, match=r"^rank 1 of 2 exited with code 7 \(no Python error: it died\)"):
        launch.launch_local(_dies, (_scenario(2, shard=2),), 2, timeout_s=60)
    assert time.perf_counter() - start < 50  # the launcher stopped rank 0: it did not wait for the timeout


def _hangs(s: scenarios.Scenario) -> None:
    """Rank 1 hangs (sleeps) while rank 0 waits for it in a collective over a mesh axis."""
    from executor.mesh import build_mesh

    launched = launch.find_launcher()
    launch.join(s, launched, timeout_s=5)
    group = build_mesh(s, torch.device("cpu"))["dense_shard"].get_group()
    if launched.rank == 1:
        time.sleep(600)
    torch.distributed.all_reduce(torch.ones(1), group=group)


@pytest.mark.slow
def test_a_hung_rank_ends_the_run_within_the_timeout():
    start = time.perf_counter()
    with pytest.raises(launch.RankFailed, match=r"^rank 0 of 2 exited with code 1: RuntimeError: .*Timed out.*"
                       r"\(a collective waited past --timeout-s 5: another rank hung or died\)$"):
        launch.launch_local(_hangs, (_scenario(2, shard=2),), 2, timeout_s=5)
    assert time.perf_counter() - start < 60  # the 5 s timeout, not the 600 s sleep


# ---- one-line errors, in-process ----------------------------------------------------------------
def test_sm_free_collectives_are_refused_off_nccl_before_any_rank_starts():
    s = _scenario(2, 1, 2, "parallelism.sm_free_collectives=true")
    with pytest.raises(ValueError) as e:
        launch.spawn(s, 2)
    assert str(e.value) == ("parallelism.sm_free_collectives is true, but this run's collectives are gloo's (no "
                            "copy-engine path off NCCL): set parallelism.sm_free_collectives=false, or run on CUDA GPUs")


def test_world_size_must_match_the_scenario():
    with pytest.raises(ValueError) as e:
        check_world(_scenario(1), 2)
    assert str(e.value) == (
        "hardware.num_gpus (1) must equal the world size (2): launch 1 rank (--nproc 1) or set "
        "hardware.num_gpus=2 and parallelism degrees whose products are 2 (dense_replicate × dense_shard, "
        "sparse_replica × sparse_shard)")
    check_world(_scenario(2, shard=2), 2)


def test_degrees_that_do_not_divide_are_refused_at_load():
    with pytest.raises(scenarios.ScenarioError, match=r"^parallelism.dense_replicate × parallelism.dense_shard "
                       r"\(1 × 3 = 3\) must equal hardware.num_gpus \(4\)"):
        scenarios.load("debug-cpu", TINY + ["hardware.num_gpus=4", "parallelism.dense_shard=3"])


def test_fused_sparse_update_needs_one_process():
    from scenarios.execution import resolve

    s = scenarios.load("debug-cpu", ["execution.embedding_kernel=triton", "execution.fused_sparse_update=true"])
    assert resolve(s, "cpu").fused_sparse_update
    with pytest.raises(ValueError, match="and one process"):
        resolve(s, "cpu", world_size=2)


def test_launchers_are_found(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert launch.find_launcher() is None
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "8")
    with pytest.raises(ValueError, match=r"^srun task without MASTER_ADDR and MASTER_PORT: export them"):
        launch.find_launcher()
    monkeypatch.setenv("MASTER_ADDR", "node0")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert launch.find_launcher() == launch.Launched(3, 8, 1, 1, "srun")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert launch.find_launcher() == launch.Launched(5, 8, 1, 4, "torchrun")  # srun torchrun: torchrun's
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")
    assert launch.find_launcher() is None  # a group of one runs alone


def test_cli_refuses_a_world_size_mismatch_before_launching(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from twin.cli import app

    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    r = CliRunner().invoke(app, ["train", "debug-cpu", "--nproc", "2", "--out", str(tmp_path / "r.json")])
    assert r.exit_code == 2 and r.output.startswith("error: hardware.num_gpus (1) must equal the world size (2)")
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "r.json").exists()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    r = CliRunner().invoke(app, ["train", "debug-cpu", "--nproc", "2"])
    assert r.exit_code == 2 and r.output.strip() == (
        "error: --nproc starts its own ranks, but this process is rank 0 of 2 under torchrun; leave --nproc out")


@pytest.mark.slow
def test_cli_trains_on_two_ranks(tmp_path):
    out = tmp_path / "run.json"
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "twin.cli", "train", "debug-cpu", "--nproc", "2", "--steps", "3",
                        "--out", str(out), "--set", "hardware.num_gpus=2", "--set", "parallelism.dense_shard=2",
                        "--set", "parallelism.sparse_shard=2", "--set", "training.micro_batch=64"],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    wall = time.perf_counter() - start
    assert r.returncode == 0, r.stderr
    assert "on each of 2 ranks" in r.stdout and "2 ranks, mesh dense_replicate=1 dense_shard=2" in r.stdout
    record = load_run(out)
    assert record.world_size == 2 and len(record.steps) == 3 and record.mesh["dense_shard"] == 2
    print(f"\ngemtwin train debug-cpu --nproc 2 --steps 3: {wall:.1f} s\n{r.stdout}")


def test_no_reshard_after_forward_keeps_units_gathered_in_the_twin():
    from scenarios.placement import placements
    from twin.memory import memory_per_rank

    resharded, kept = _scenario(4, 1, 4), _scenario(4, 1, 4, "parallelism.fsdp_reshard_after_forward=false")
    names = [{c.name for lp in placements(s) for c in lp.collectives} for s in (resharded, kept)]
    assert "seq0.fsdp_ag.bwd" in names[0] and "seq0.fsdp_ag.fwd" in names[1]
    assert not any(n.endswith("fsdp_ag.bwd") for n in names[1])
    gathered = [memory_per_rank(s).by_category_bytes["fsdp_gathered"] for s in (resharded, kept)]
    assert gathered[1] > gathered[0] > 0
