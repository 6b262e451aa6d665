"""RunRecord: what the executor measured, in the form calibration reads.

Torch-free on purpose: the executor writes it, the twin (on a laptop) reads it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scenarios.files import read_json, read_yaml, write_text_atomic, wrong_kind
from scenarios.vocab import OP_CLASSES  # the classes op_class_time_s is keyed by (executor.profiling)

__all__ = ["OP_CLASSES", "Environment", "RunRecord", "StepRecord", "load_run", "write_json_atomic"]


class Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Environment(Record):
    device: Literal["cpu", "cuda"] = Field(..., description="Where the run executed.")
    device_name: str = Field(..., description="GPU name from torch, or the CPU model.")
    num_devices: int = Field(1, description="Processes/devices in the run.")
    host: str = ""
    python: str = ""
    torch: str = ""
    triton: str = ""
    cuda: str = ""
    nccl: str = ""
    driver: str = ""
    cpu_threads: int = 0
    device_capability: str = Field("", description="CUDA compute capability, e.g. '9.0'.")
    device_memory_bytes: int = Field(0, ge=0, description="The GPU's total memory.")


class StepRecord(Record):
    step: int
    step_time_s: float = Field(..., ge=0)
    loss: float
    samples: int
    model_flops: float = Field(..., ge=0, description="Analytic FLOPs (fwd+bwd) of this step.")
    wall_time_s: float | None = Field(
        None, ge=0, description="Host clock over the step, synchronised (step_time_s is CUDA events on GPU)."
    )
    data_wait_s: float = Field(0.0, ge=0, description="Host time this step waited for its batches.")


class RunRecord(Record):
    version: Literal[1] = 1
    run_id: str
    created_utc: str
    scenario_name: str
    scenario: dict = Field(..., description="The full Scenario this run trained (model_dump).")
    environment: Environment
    warmup_steps: int = Field(..., ge=0, description="Leading steps left out of step_time_s.")
    steps: list[StepRecord]
    step_time_s: float = Field(
        ..., gt=0, description="Median step time after warm-up, profiled steps left out."
    )
    model_flops_per_step: float = Field(..., ge=0, description="Mean analytic FLOPs per step.")
    achieved_flops_per_s: float = Field(..., ge=0)
    mfu: float | None = Field(None, description="None where the device has no catalogued peak.")
    mfu_peak: str = Field("", description="Which peak MFU used, e.g. 'h200 bf16 dense'.")
    mfu_peak_flops_per_s: float | None = Field(None, description="That peak's value (hwmodels.gpus).")
    execution: dict = Field(
        default_factory=dict, description="The execution section as the run resolved it "
        "(scenarios.execution.ResolvedExecution); {} in records written before it existed: the twin "
        "then reads the flat fields below (twin.calibrate.recorded_execution).")
    step_timer: Literal["", "cuda_events", "host_clock"] = Field(
        "", description="How step times were measured ('' in records written before this field)."
    )
    embedding_kernel: str = Field("", description="Embedding lookups the run used: 'triton' or 'torch'.")
    attention_kernel: str = Field("", description="Attention the run used: 'triton' (kernels/) or 'reference'.")
    compiled: bool = Field(False, description="Whether the dense blocks ran under torch.compile.")
    sparse_update: str = Field("", description="Embedding update: 'fused_backward' (row-wise Adagrad in the "
                               "lookups' backward) or 'optimizer_step'.")
    token_bucket: int = Field(0, description="Ids every packed id layout (sequence tokens, pooled ids) was "
                              "padded to a multiple of: static-shape batches (0: none).")
    cuda_graphs: bool = Field(False, description="Whether steps were replayed from CUDA graphs (one per batch shape).")
    graph_replays: int = Field(0, description="Steps replayed from a CUDA graph (the others ran eagerly).")
    data_processes: bool = Field(False, description="Whether batches were drawn in a worker process.")
    op_class_time_s: dict[str, float] = Field(
        default_factory=dict, description="Per-step kernel time by op class (torch.profiler)."
    )
    op_class_kernels_s: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="Each op class's longest GPU kernels (CPU: ops), seconds per step: what a class is made of.",
    )
    kernel_time_s: dict[str, float] = Field(
        default_factory=dict,
        description="Per-step time of each attention kind (attention.gdpa, attention.asym, ...).",
    )
    profiled_steps: int = 0
    peak_memory_bytes: int = 0
    peak_memory_reserved_bytes: int = Field(0, ge=0, description="Allocator's peak reserved memory (CUDA).")
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="Held-out: loss, ne_<task>, auc_<task> and eval_samples (the set's size); "
        "first_loss: the first training step's loss.",
    )
    world_size: int = Field(1, ge=1, description="Ranks that trained the run together (1: one process).")
    mesh: dict[str, int] = Field(
        default_factory=dict, description="Each mesh axis's size (world, dense_replicate, dense_shard, "
        "expert_replicate, expert, sparse_replica, sparse_shard); {} for a one-process run.")
    rank_step_time_s: list[list[float]] = Field(
        default_factory=list, description="Each rank's step times, [rank][step] (steps[i].step_time_s is "
        "the slowest rank's); [] for a one-process run.")
    rank_peak_memory_bytes: list[int] = Field(
        default_factory=list, description="Each rank's peak memory (peak_memory_bytes is the largest); [] "
        "for a one-process run.")
    comm_s_by_axis: dict[str, float] = Field(
        default_factory=dict, description="Collective time per step by mesh axis (and 'world' for the loop's "
        "own), busy, from the profiled steps of rank 0 (executor.comm_profile); the twin's comm_s_by_axis.")
    exposed_comm_s_by_axis: dict[str, float] = Field(
        default_factory=dict, description="The part of comm_s_by_axis no compute ran under (the twin's "
        "exposed_comm_s_by_axis); overlapped_comm_s_by_axis is the rest.")
    overlapped_comm_s_by_axis: dict[str, float] = Field(
        default_factory=dict, description="The part of comm_s_by_axis that ran under compute.")
    collective_path: str = Field("", description="The collectives' route: 'gloo', 'nccl', or 'nccl-zero-cta' "
                                 "(parallelism.sm_free_collectives: copy-engine / zero-SM NCCL); '' for one process.")
    moe_routed_assignments: int = Field(0, ge=0, description="Token-expert assignments the MoE routers made in "
                                        "the training steps, all layers and ranks summed (0: no MoE, or a record "
                                        "written before this field).")
    moe_dropped_assignments: int = Field(0, ge=0, description="Of those, the ones dropped past an expert's "
                                         "capacity (model.moe.capacity_factor; expert parallelism only: a "
                                         "dropless run drops 0).")
    resumed_from: str = Field("", description="The checkpoint this run resumed from ('' : it started fresh); its "
                              "steps then begin at the checkpoint's step.")
    checkpoint_steps: list[int] = Field(default_factory=list, description="Steps after which a checkpoint was "
                                        "saved and committed (training.checkpoint).")
    checkpoint_stall_s: list[float] = Field(default_factory=list, description="Seconds each save blocked the "
                                            "training loop (async: the state copy; not in the step times).")
    checkpoint_async: bool = Field(False, description="Whether the saves were asynchronous.")
    low_precision_layers: dict[str, str] = Field(
        default_factory=dict, description="Each Linear precision.mlp converted (mxfp8, fp8_block, auto) and what it "
        "ran in by the end: its format, 'bf16 (auto)' where the measured table said fp8 does not pay at its shape, "
        "'bf16 (guard)' where its error against bf16 made it fall back ({} for bf16/fp32 runs).")

    def save(self, path: str | os.PathLike[str]) -> Path:
        return write_json_atomic(path, self.model_dump(mode="json"))


def load_run(path: str | os.PathLike[str]) -> RunRecord:
    """Read and validate a RunRecord; one-line ValueError naming the file on any problem."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"run record '{p}' not found; pass the --out file of `gemtwin train`")
    try:
        data = read_json(p, label=f"run record '{p}'")
    except ValueError:
        _refuse_other_kind(p, _yaml_or_none(p))
        raise
    _refuse_other_kind(p, data)
    try:
        return RunRecord.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"run record '{p}': {where}: {err['msg']}") from None


def _refuse_other_kind(p: Path, data: object) -> None:
    other = wrong_kind(p, data, expected="a RunRecord", fix="pass the --out file of `gemtwin train`")
    if other:
        raise ValueError(other)


def _yaml_or_none(p: Path) -> object:
    try:
        return read_yaml(p)
    except ValueError:
        return None


def write_json_atomic(path: str | os.PathLike[str], data: object) -> Path:
    """Write JSON atomically: never a half-written file (``scenarios.files``)."""
    return write_text_atomic(path, json.dumps(data, indent=1) + "\n")
