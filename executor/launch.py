"""Launching a multi-rank run: the one module of the executor that reads the environment.

Three ways in, one process group out (gloo on the CPU, NCCL on CUDA, each rank on its own GPU):

- ``gemtwin train SCENARIO --nproc N`` (``spawn``): N local ranks through torch's elastic
  launcher (``torch.distributed.launcher.elastic_launch``, what ``torchrun`` runs), which
  watches them: when one fails, it stops the others and reports it, and ``spawn`` raises one
  line naming the rank (``RankFailed``);
- under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, …) or SLURM's
  ``srun`` (``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``, ``SLURM_LOCALID``, with ``MASTER_ADDR``
  and ``MASTER_PORT`` exported by the job script), ``gemtwin train`` finds the group
  (``find_launcher``) and joins it (``run_rank``).

Everything below the launch gets what it needs from the Scenario and its arguments: the
training loop asks torch.distributed for the group this module started. The world size is
checked against the Scenario before any process group starts (``executor.mesh.check_world``).
A collective that waits longer than ``timeout_s`` (a rank that hung or died) raises on the
waiting rank, which ends the group: nothing waits forever.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import uuid
from dataclasses import dataclass

import torch
import torch.distributed as dist

from executor.collectives import enable_symmetric_memory, process_group_options
from executor.mesh import check_world
from scenarios.execution import resolve
from scenarios.schema import Scenario
from twin.runrecord import RunRecord

DEFAULT_TIMEOUT_S = 600.0  # NCCL's default for a collective (gloo's is 30 min); the CLI's --timeout-s


class RankFailed(RuntimeError):
    """A rank of a run ``spawn`` launched failed (bad input is refused before any rank starts)."""


@dataclass(frozen=True)
class Launched:
    """This process's place in the group its launcher started."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launcher: str  # "torchrun" | "srun"


def find_launcher() -> Launched | None:
    """The group torchrun (or the elastic launcher) or srun started this process in; None when it
    runs alone, a group of one rank included. torchrun's variables win over SLURM's (``srun
    torchrun ...``)."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        if world == 1:
            return None
        return Launched(int(env["RANK"]), world, int(env.get("LOCAL_RANK", 0)),
                        int(env.get("LOCAL_WORLD_SIZE", world)), "torchrun")  # fmt: skip
    if "SLURM_PROCID" in env and int(env.get("SLURM_STEP_NUM_TASKS", 1)) > 1:  # a task of an srun step
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in env]
        if missing:
            raise ValueError(f"srun task without {' and '.join(missing)}: export them in the job script, e.g. "
                             "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) "
                             "MASTER_PORT=29500")  # fmt: skip
        return Launched(int(env["SLURM_PROCID"]), int(env["SLURM_STEP_NUM_TASKS"]), int(env.get("SLURM_LOCALID", 0)),
                        int(env.get("SLURM_NTASKS_PER_NODE", 1)), "srun")  # fmt: skip
    return None


def restart_count() -> int:
    """How many times the elastic launcher has restarted this group after a failure
    (``TORCHELASTIC_RESTART_COUNT``; 0 on the first attempt and outside the launcher)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))


def run_rank(scenario: Scenario, launched: Launched, *, timeout_s: float = DEFAULT_TIMEOUT_S,
             **train_kw) -> RunRecord:
    """Join the group, train this rank's share of ``scenario`` (``executor.train.train``; only
    rank 0 logs and writes), leave the group. Every rank returns the run's record. A group the
    launcher restarted after a failure (``restart_count``) resumes from the newest committed
    checkpoint of ``training.checkpoint.dir``."""
    from executor.train import train

    if restart_count() > 0 and scenario.training.checkpoint.dir is not None:  # (else what it was given)
        from executor.checkpoint import find_latest

        latest = find_latest(scenario.training.checkpoint.dir).latest
        if latest is not None or not train_kw.get("resume"):
            train_kw["resume"] = True  # the newest committed one (the torn save reported), or a fresh start
    join(scenario, launched, timeout_s)
    if launched.rank != 0:
        train_kw["log"] = lambda _: None
    try:
        return train(scenario, **train_kw)
    finally:
        dist.destroy_process_group()


def join(scenario: Scenario, launched: Launched, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """``init_process_group`` once the world size is checked against ``scenario``: NCCL with this
    rank's GPU (``local_rank``) on CUDA, gloo on the CPU, each CPU rank given its share of the cores."""
    from executor.runtime import device_for, device_type

    check_world(scenario, launched.world_size)
    cuda = device_type(scenario) == "cuda"  # (not the device yet: this rank's GPU is set below)
    backend = "nccl" if cuda else "gloo"
    if not dist.is_available() or not dist.is_backend_available(backend):
        raise ValueError(f"this torch build has no {backend} backend for a {'CUDA' if cuda else 'CPU'} run; "
                         "install a torch with torch.distributed, or run one process (no --nproc)")  # fmt: skip
    if cuda:
        if launched.local_rank >= torch.cuda.device_count():
            raise ValueError(f"local rank {launched.local_rank} has no GPU: torch sees "
                             f"{torch.cuda.device_count()}; launch at most that many ranks per node")  # fmt: skip
        torch.cuda.set_device(launched.local_rank)
    elif launched.local_world_size > 1:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // launched.local_world_size))
    device = device_for(scenario)
    # env://: MASTER_ADDR and MASTER_PORT, and the elastic agent's store where it shares one
    options = process_group_options(scenario, backend)  # SM-free: NCCL's zero-CTA policy, or one line why not
    timeout = datetime.timedelta(seconds=timeout_s)
    store = _attempt_store(launched, timeout)
    dist.init_process_group(backend, init_method=None if store else "env://", store=store, rank=launched.rank,
                            world_size=launched.world_size, timeout=timeout, device_id=device if cuda else None,
                            pg_options=options)  # fmt: skip
    enable_symmetric_memory(scenario, backend)


def _attempt_store(launched: Launched, timeout: datetime.timedelta):
    """Under the elastic launcher's shared store (``TORCHELASTIC_USE_AGENT_STORE``): that store, its
    keys prefixed by the restart count. torch 2.13's ``env://`` shares the agent's store across
    restarts unprefixed, so a restarted group reads the dead group's gloo/NCCL addresses and fails
    to connect (pytorch/pytorch#135712); None elsewhere (``env://`` as it is)."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    tcp = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), launched.world_size, is_master=False,
                        timeout=timeout)  # fmt: skip
    return dist.PrefixStore(f"/gemtwin/attempt_{restart_count()}", tcp)


def spawn(scenario: Scenario, nproc: int, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_restarts: int = 0,
          **train_kw) -> RunRecord:
    """Train ``scenario`` on ``nproc`` local ranks started by torch's elastic launcher; rank 0's
    record (rank 0 prints the log). A failed rank ends the run (the launcher stops the others) with
    ``RankFailed``; with ``max_restarts`` the launcher starts the group again that many times, each
    restart resuming from the newest committed checkpoint (``run_rank``)."""
    from executor.checkpoint import resolve_resume
    from executor.runtime import device_type

    check_world(scenario, nproc)  # bad input fails here, before any process starts
    if max_restarts and scenario.training.checkpoint.dir is None:
        raise ValueError(f"--max-restarts {max_restarts} needs training.checkpoint.dir (a restart resumes from the "
                         "newest checkpoint); set it with --set training.checkpoint.dir=PATH")  # fmt: skip
    resolve_resume(scenario, train_kw.get("resume"))  # a bad --resume-from, before any rank starts
    kind = device_type(scenario)
    resolve(scenario, kind, world_size=nproc)
    if kind != "cuda":  # no copy-engine route off NCCL (on CUDA each rank checks its NCCL)
        process_group_options(scenario, "gloo")
    if kind == "cuda" and nproc > torch.cuda.device_count():
        raise ValueError(f"--nproc {nproc} needs {nproc} GPUs, torch sees {torch.cuda.device_count()}; "
                         f"use --nproc {torch.cuda.device_count()} or fewer")  # fmt: skip
    if nproc > 1:  # a table layout the native backend cannot make (hot rows on a column-wise table)
        from executor.table_layout import table_layouts

        table_layouts(scenario)
    if scenario.parallelism.sparse_backend == "torchrec":  # a plan TorchRec cannot run, or no torchrec
        from executor.torchrec_tables import check_plan, require_torchrec

        check_plan(scenario, torch.device(kind))
        try:
            require_torchrec()
        except ImportError as e:  # bad input here: the scenario asks for what this install lacks
            raise ValueError(str(e)) from None
    train_kw = {**train_kw, "log": functools.partial(print, flush=True)}  # what a rank can be sent (pickled)
    return launch_local(_rank_main, (scenario, timeout_s, train_kw), nproc, timeout_s=timeout_s,
                        max_restarts=max_restarts)[0]  # fmt: skip


def launch_local(fn, args: tuple, nproc: int, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_restarts: int = 0) -> dict:
    """``fn(*args)`` on ``nproc`` local ranks (torch's elastic launcher, torchrun's variables set in
    each; ``fn`` and ``args`` must pickle); ``{rank: what fn returned}``. A failed rank stops the
    others; after ``max_restarts`` restarts of the whole group (the launcher's), one ``RankFailed``
    line names it."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=uuid.uuid4().hex,
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=max_restarts,
                          monitor_interval=0.1)  # fmt: skip
    quiet = _quiet_launcher()
    try:
        return elastic_launch(config, fn)(*args)
    except ChildFailedError as e:
        raise _failed(e, nproc, timeout_s) from None
    finally:
        quiet()


def _rank_main(scenario: Scenario, timeout_s: float, train_kw: dict) -> RunRecord | None:
    """One rank of ``spawn``: the elastic launcher set torchrun's variables. Rank 0 returns the record."""
    launched = find_launcher()
    record = run_rank(scenario, launched, timeout_s=timeout_s, **train_kw)
    return record if launched.rank == 0 else None


def _failed(e, nproc: int, timeout_s: float) -> RankFailed:
    """One line from the launcher's report: the first rank to fail, how, and its error."""
    rank, failure = e.get_first_failure()
    message = failure.message.get("message", "") if isinstance(failure.message, dict) else ""
    how = (f"was killed by signal {-failure.exitcode}" if failure.exitcode < 0
           else f"exited with code {failure.exitcode}")  # fmt: skip
    line = f"rank {rank} of {nproc} {how}" + (f": {message}" if message else " (no Python error: it died)")
    if "timed out" in message.lower():
        line += f" (a collective waited past --timeout-s {timeout_s:g}: another rank hung or died)"
    others = len(e.failures) - 1
    if others:
        line += f"; {others} more rank{'s' if others > 1 else ''} failed"
    return RankFailed(line)


def _quiet_launcher():
    """Silence the launcher's own multi-line failure logs while it runs (``RankFailed`` is the one
    line); returns the function that restores them."""
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic", "torch.multiprocessing.spawn")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)

    def restore() -> None:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)

    return restore


__all__ = ["DEFAULT_TIMEOUT_S", "Launched", "RankFailed", "find_launcher", "join", "launch_local", "restart_count",
           "run_rank", "spawn"]
