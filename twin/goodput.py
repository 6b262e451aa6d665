"""Goodput: what checkpoints and failures leave of the predicted throughput (torch-free, cheap).

``goodput(s, step_time_s=..., memory=...)`` prices ``training.checkpoint`` against the job's
failures, on the store ``hardware.storage`` and the failure catalog ``hardware.failures``
(``hwmodels/data/storage.yaml``, every number with its source). Rules, each an assumption:

- **Checkpoint bytes** (what ``executor.checkpoint`` saves, from ``twin.memory``): per rank the
  fp32 master weights and the two Adam moments of its dense shard and of its experts
  (12 bytes/parameter), its embedding shard and its row-wise Adagrad state, plus
  ``EXTRA_BYTES_PER_RANK`` (RNG states, data position, step). The total counts each replicated
  shard once (DCP deduplicates replicas): dense × ``dense_shard``, experts × ``expert``,
  embeddings × the ranks one row set is split over (``twin.memory.embedding_split``), or under
  ``replicated_sync`` × every rank (its replicas differ between syncs: each is saved).
- **Save** ``δ`` (what the step blocks for). Synchronous: the rank's state copied to the host
  (``host_copy_Bps`` of the GPU) and then the job's unique bytes written at the store's rate for
  ``num_gpus`` GPUs, one after the other (no overlap assumed: an upper bound). Asynchronous
  (``training.checkpoint.async``): only the copy; the write overlaps training, and stalls the
  next save by whatever of it outlasts the interval.
- **Restore**: every rank reads its own state (replicas too) at the store's read rate, then
  copies it to the GPU; plus ``hardware.restart_overhead_s`` (detection, rescheduling, start).
- **MTBF** ``M = 1 / (num_gpus × failures per GPU-hour)``: failures independent, any one stops
  the synchronous job.
- **Interval**: Young's optimum ``τ* = sqrt(2 δ M)`` (Young 1974; Daly 2006 shows it is the
  first-order term of the optimum), in steps of the predicted step time; a scenario's
  ``training.checkpoint.every`` > 0 is used instead (``τ*`` still reported).
- **Goodput** (first order, failures during a save or a restart ignored): a run segment computes
  ``τ`` out of every ``τ + δ``; each failure, every ``M`` seconds, costs the restart ``R`` and on
  average half a segment of rework: ``goodput = τ/(τ+δ) × max(0, 1 - (R + (τ+δ)/2) / M)``.
  ``effective_samples_per_s = samples_per_s × goodput``.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from hwmodels.storage import host_copy_Bps, resolve_failures, resolve_storage, restart_overhead_s
from scenarios.loader import ScenarioError
from scenarios.schema import Scenario
from twin.memory import ADAM_STATE_BYTES, FP32_BYTES, MemoryReport, embedding_split

EXTRA_BYTES_PER_RANK = float(2**20)  # assumption: RNG states, data position, step, metadata
_STATE_PER_PARAM = FP32_BYTES + ADAM_STATE_BYTES  # fp32 weight + two fp32 moments


class Goodput(BaseModel):
    """Checkpoint cost and the useful fraction of wall time. Seconds, bytes, per second."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    storage: str = Field(..., description="The storage preset the checkpoint is priced on.")
    failures: str = Field(..., description="The failure catalog.")
    async_save: bool
    checkpoint_bytes_per_rank: float = Field(..., description="State one rank saves (its replicas' too).")
    checkpoint_bytes_total: float = Field(..., description="Unique bytes written, replicas once.")
    stage_s: float = Field(..., description="Device-to-host copy of one rank's state.")
    write_s: float = Field(..., description="Writing the job's unique bytes to the store.")
    save_blocking_s: float = Field(..., description="δ: what the step stalls per save at the interval used.")
    restore_s: float = Field(..., description="Reading and loading the checkpoint after a failure.")
    restart_s: float = Field(..., description="Failure to training again: overhead + restore_s.")
    failures_per_gpu_hour: float
    mtbf_s: float | None = Field(..., description="The job's mean time between failures (None: no failures).")
    interval_s: float | None = Field(..., description="Checkpoint interval used (None: no checkpoints needed).")
    interval_steps: int | None
    interval_from: str = Field(..., description="training.checkpoint.every, or optimal (Young/Daly).")
    optimal_interval_s: float | None
    optimal_interval_steps: int | None
    goodput: float = Field(..., description="Useful fraction of wall time.")
    effective_samples_per_s: float

    def line(self) -> str:
        """One line for the terminal."""
        mtbf = "no failures" if self.mtbf_s is None else f"MTBF {_dur(self.mtbf_s)}"
        opt = ("" if self.optimal_interval_s is None else
               f"optimal every {self.optimal_interval_steps:,} steps ({_dur(self.optimal_interval_s)})")  # fmt: skip
        used = ("" if self.interval_from == "optimal" or self.interval_steps is None else
                f"every {self.interval_steps:,} steps as set ({_dur(self.interval_s)}), ")  # fmt: skip
        parts = [f"{mtbf} ({self.failures})",
                 f"checkpoint {_bytes(self.checkpoint_bytes_total)} ({_bytes(self.checkpoint_bytes_per_rank)}/rank) on {self.storage}, "
                 f"{'async' if self.async_save else 'sync'} stall {self.save_blocking_s:.2f} s",
                 f"{used}{opt}".rstrip(", "), f"restart {_dur(self.restart_s)}",
                 f"{self.effective_samples_per_s:,.0f} effective samples/s"]  # fmt: skip
        return f"goodput {self.goodput:.1%}: " + "; ".join(p for p in parts if p)


def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size or unit == "MB":
            return f"{n / size:.2f} {unit}"


def _dur(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 60:.1f} min" if s >= 60 else f"{s:.1f} s"


def young_daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """Young's first-order optimal checkpoint interval sqrt(2 δ M) (Young 1974, Daly 2006)."""
    return math.sqrt(2.0 * save_s * mtbf_s)


def goodput_fraction(*, interval_s: float, save_s: float, restart_s: float, mtbf_s: float | None) -> float:
    """τ/(τ+δ) × (1 - (R + (τ+δ)/2)/M), at least 0 (module rules); 1 - nothing lost without failures
    beyond the saves."""
    compute = interval_s / (interval_s + save_s) if interval_s + save_s > 0 else 1.0
    if mtbf_s is None:
        return compute
    return compute * max(0.0, 1.0 - (restart_s + (interval_s + save_s) / 2.0) / mtbf_s)


def checkpoint_bytes(s: Scenario, memory: MemoryReport) -> tuple[float, float]:
    """(bytes one rank saves, unique bytes of the whole job): the module's rule."""
    c, p = memory.by_category_bytes, s.parallelism
    dense = c.get("dense_optimizer", 0.0) / ADAM_STATE_BYTES * _STATE_PER_PARAM
    experts = c.get("expert_optimizer", 0.0) / ADAM_STATE_BYTES * _STATE_PER_PARAM
    emb = c.get("embedding_shard", 0.0) + c.get("embedding_optimizer", 0.0)
    per_rank = dense + experts + emb + EXTRA_BYTES_PER_RANK
    # replicated_sync replicas drift apart between syncs: each replica's shards are saved
    # (executor.checkpoint keys them by shard and replica), so they count once per replica
    emb_copies = s.hardware.num_gpus if p.sparse_strategy == "replicated_sync" else embedding_split(s)
    total = (dense * p.dense_shard + experts * p.expert + emb * emb_copies
             + EXTRA_BYTES_PER_RANK * s.hardware.num_gpus)  # fmt: skip
    return per_rank, total


def _resolve(s: Scenario):
    hw = s.hardware
    try:
        store = resolve_storage(hw.storage, hw.gpu)
    except ValueError as e:
        raise ScenarioError(f"hardware.storage: {e}") from None
    try:
        rates = resolve_failures(hw.failures, hw.gpu)
    except ValueError as e:
        raise ScenarioError(f"hardware.failures: {e}") from None
    return store, rates


def check_hardware(s: Scenario) -> None:
    """One-line ScenarioError for an unknown ``hardware.storage`` / ``hardware.failures``."""
    _resolve(s)


def goodput(s: Scenario, *, step_time_s: float, memory: MemoryReport) -> Goodput:
    """Price ``s``'s checkpoints and failures around a predicted step (module rules)."""
    store, rates = _resolve(s)
    n, ck = s.hardware.num_gpus, s.training.checkpoint
    per_rank, total = checkpoint_bytes(s, memory)
    copy_Bps = host_copy_Bps(s.hardware.gpu)
    stage = per_rank / copy_Bps
    write = total / store.write_Bps(n)
    restore = per_rank * n / store.read_Bps(n) + stage
    overhead = s.hardware.restart_overhead_s
    restart = (restart_overhead_s() if overhead is None else overhead) + restore
    mtbf = 3600.0 / (n * rates.per_gpu_hour) if rates.per_gpu_hour > 0 else None
    delta_opt = stage if ck.async_save else stage + write
    opt = young_daly_interval_s(delta_opt, mtbf) if mtbf is not None else None
    if ck.every > 0:
        tau, source = ck.every * step_time_s, "training.checkpoint.every"
    else:
        tau, source = (_steps(opt, step_time_s) * step_time_s if opt is not None else None), "optimal"
    delta = delta_opt + (max(0.0, write - tau) if ck.async_save and tau is not None else 0.0)
    frac = 1.0 if tau is None else goodput_fraction(interval_s=tau, save_s=delta, restart_s=restart, mtbf_s=mtbf)
    return Goodput(
        storage=store.name, failures=rates.name, async_save=ck.async_save,
        checkpoint_bytes_per_rank=per_rank, checkpoint_bytes_total=total,
        stage_s=stage, write_s=write, save_blocking_s=delta, restore_s=restore, restart_s=restart,
        failures_per_gpu_hour=rates.per_gpu_hour, mtbf_s=mtbf,
        interval_s=tau, interval_steps=_steps(tau, step_time_s), interval_from=source,
        optimal_interval_s=opt, optimal_interval_steps=_steps(opt, step_time_s),
        goodput=frac, effective_samples_per_s=s.training.global_batch / step_time_s * frac,
    )  # fmt: skip


def _steps(interval_s: float | None, step_time_s: float) -> int | None:
    return None if interval_s is None else max(1, round(interval_s / step_time_s))
