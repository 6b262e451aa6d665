"""The RunRecord a training run writes: its steps, the profiler's op classes, memory, the
environment it ran on, and the execution it resolved (``twin.runrecord`` is the schema, torch-free).

MFU divides by the dense peak of the GPU the run is on (``hwmodels.gpus.catalog_name``), not the
scenario's ``hardware.gpu``; a CPU run has no datasheet peak and no MFU.
"""

from __future__ import annotations

import platform
import re
import resource
import statistics
import subprocess
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from executor.comm_profile import CommProfile
from scenarios.execution import ResolvedExecution
from scenarios.schema import Scenario
from twin.runrecord import Environment, RunRecord, StepRecord


@dataclass
class Profiled:
    """What the profiled steps measured, per step: op classes, attention kinds, longest kernels."""

    steps: range = range(0)
    op_class_time_s: dict[str, float] = field(default_factory=dict)
    kernel_time_s: dict[str, float] = field(default_factory=dict)
    op_class_kernels_s: dict[str, dict[str, float]] = field(default_factory=dict)
    comm: CommProfile | None = None  # collectives per mesh axis (several ranks)


@dataclass
class RankMeasurements:
    """What every rank of a multi-rank run measured, gathered on each (``executor.train``)."""

    mesh: dict[str, int]  # each axis's size (executor.mesh.Mesh.sizes)
    step_time_s: list[list[float]]  # [rank][step]
    wall_time_s: list[list[float]]  # [rank][step]
    peak_memory_bytes: list[int]  # [rank]
    collective_path: str = ""  # executor.collectives.collective_path

    def slowest(self, steps: list[StepRecord]) -> list[StepRecord]:
        """``steps`` with each step's times the slowest rank's: a synchronous step ends when its
        last rank does."""
        return [s.model_copy(update={"step_time_s": max(r[i] for r in self.step_time_s),
                                     "wall_time_s": max(r[i] for r in self.wall_time_s)})
                for i, s in enumerate(steps)]  # fmt: skip


def build_record(scenario: Scenario, run: ResolvedExecution, steps: list[StepRecord], *, warmup: int,
                 profiled: Profiled, metrics: dict[str, float], device: torch.device,
                 graph_replays: int = 0, ranks: RankMeasurements | None = None,
                 moe_assignments: tuple[int, int] = (0, 0), checkpoints: dict | None = None,
                 low_precision: dict[str, str] | None = None) -> RunRecord:
    """The RunRecord of a finished run. The step time is the median over the steps after
    ``warmup`` that the profiler did not slow (all steps if none is left). With ``ranks`` (several
    ranks) each step takes the slowest rank's time, peak memory the largest rank's, and the
    per-rank measurements are kept; the op classes are this rank's. ``moe_assignments``: the run's
    (routed, dropped) MoE assignments, every rank's summed (``executor.train.moe_assignments``)."""
    steps = ranks.slowest(steps) if ranks else steps
    timed = [s for s in steps[warmup:] if s.step not in profiled.steps] or steps[warmup:] or steps
    step_time = max(statistics.median(s.step_time_s for s in timed), 1e-12)
    flops = statistics.fmean(s.model_flops for s in timed)
    peak, peak_name = mfu_peak(scenario, device)
    return RunRecord(
        run_id=uuid.uuid4().hex[:12], created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        scenario_name=scenario.name, scenario=scenario.model_dump(mode="json"),
        environment=environment(device, len(ranks.peak_memory_bytes) if ranks else 1),
        execution=run.model_dump(mode="json"),
        warmup_steps=min(warmup, len(steps)), steps=steps, step_time_s=step_time,
        model_flops_per_step=flops, achieved_flops_per_s=flops / step_time,
        mfu=None if peak is None else flops / step_time / peak, mfu_peak=peak_name, mfu_peak_flops_per_s=peak,
        step_timer="cuda_events" if device.type == "cuda" else "host_clock",
        **_execution_fields(run, graph_replays),
        op_class_time_s=profiled.op_class_time_s, kernel_time_s=profiled.kernel_time_s,
        op_class_kernels_s=profiled.op_class_kernels_s, profiled_steps=len(profiled.steps),
        peak_memory_bytes=max(ranks.peak_memory_bytes) if ranks else peak_memory(device),
        peak_memory_reserved_bytes=int(torch.cuda.max_memory_reserved(device)) if device.type == "cuda" else 0,
        metrics=metrics, **_rank_fields(ranks), **_comm_fields(profiled.comm),
        moe_routed_assignments=moe_assignments[0], moe_dropped_assignments=moe_assignments[1],
        **(checkpoints or {}), low_precision_layers=dict(low_precision or {}),
    )  # fmt: skip


def _rank_fields(ranks: RankMeasurements | None) -> dict:
    if ranks is None:
        return {}
    return dict(world_size=len(ranks.peak_memory_bytes), mesh=ranks.mesh, rank_step_time_s=ranks.step_time_s,
                rank_peak_memory_bytes=ranks.peak_memory_bytes, collective_path=ranks.collective_path)  # fmt: skip


def _comm_fields(comm: CommProfile | None) -> dict:
    if comm is None:
        return {}
    return dict(comm_s_by_axis=comm.busy(), exposed_comm_s_by_axis=comm.exposed(),
                overlapped_comm_s_by_axis=comm.overlapped())  # fmt: skip


def _execution_fields(run: ResolvedExecution, graph_replays: int) -> dict:
    """The record's flat execution fields (kept beside ``execution`` for the records' readers)."""
    return dict(attention_kernel=run.attention_kernel, embedding_kernel=run.embedding_kernel,
                compiled=run.compile, cuda_graphs=run.cuda_graphs, graph_replays=graph_replays,
                sparse_update="fused_backward" if run.fused_sparse_update else "optimizer_step",
                token_bucket=run.token_bucket, data_processes=run.data_processes)  # fmt: skip


def mfu_peak(scenario: Scenario, device: torch.device) -> tuple[float | None, str]:
    """The dense peak of the GPU this run is on in the scenario's ``hardware.mfu_peak_dtype``;
    none on the CPU, which has no datasheet peak."""
    if device.type != "cuda":
        return None, ""
    dtype = scenario.hardware.mfu_peak_dtype
    try:
        from hwmodels.gpus import catalog_name, get_gpu

        gpu = catalog_name("cuda", torch.cuda.get_device_name(device))
        return get_gpu(gpu).peak(dtype), f"{gpu} {dtype} dense"
    except (ImportError, ValueError):
        return None, ""


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def environment(device: torch.device, processes: int = 1) -> Environment:
    """Where this process runs: device, versions, CPU model, threads; ``processes``: the run's ranks."""
    fields = dict(
        device=device.type, device_name=_cpu_model(), host=platform.node(), num_devices=processes,
        python=platform.python_version(), torch=torch.__version__, cpu_threads=torch.get_num_threads(),
    )
    try:
        import triton

        fields["triton"] = triton.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        fields.update(_cuda_fields(device))
    return Environment(**fields)


def _cuda_fields(device: torch.device) -> dict:
    props = torch.cuda.get_device_properties(device)
    fields = dict(device_name=torch.cuda.get_device_name(device), device_capability=f"{props.major}.{props.minor}",
                  device_memory_bytes=int(props.total_memory), cuda=torch.version.cuda or "",
                  driver=_nvidia_driver())  # fmt: skip
    try:
        fields["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - NCCL absent from this build
        pass
    return fields


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str:
    """The NVIDIA driver version: /proc, else NVML (nvidia-ml-py), else nvidia-smi; "" if none answers."""
    try:
        found = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", Path("/proc/driver/nvidia/version").read_text())
        if found:
            return found.group(1)
    except OSError:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - NVML absent or not initialisable
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        return ""
