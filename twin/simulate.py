"""Simulate one training step of a Scenario: op graph → simpy engine → SimResult."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from hwmodels.calibration import Calibration
from scenarios.schema import Scenario
from twin.engine import Timeline, simulate_graph
from twin.flops import model_costs
from twin.runrecord import write_json_atomic
from twin.trace import write_chrome_trace
from twin.workload import Hardware, build_graph


class SimResult(BaseModel):
    """What the twin predicts for one optimizer step. Time in seconds, FLOPs in FLOPs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scenario: str
    gpu: str
    num_gpus: int
    network: str
    step_time_s: float
    samples_per_s: float
    model_flops_per_step: float = Field(..., description="All GPUs, forward + backward.")
    mfu: float
    mfu_peak: str = Field(..., description="Which peak MFU divides by.")
    mfu_peak_flops: float
    breakdown_s: dict[str, float] = Field(..., description="Where the step's time goes.")
    compute_s_by_op_class: dict[str, float]
    comm_s_by_axis: dict[str, float]
    num_ops: int
    calibration: str = ""

    def save(self, path: str | os.PathLike[str]) -> Path:
        return write_json_atomic(path, self.model_dump(mode="json"))


def simulate(
    s: Scenario, *, calibration: Calibration | None = None, trace: str | os.PathLike | None = None
) -> SimResult:
    """Predict the step of ``s``; optionally write a Chrome/Perfetto trace."""
    hw = Hardware.of(s, calibration)
    timeline = simulate_graph(build_graph(s, hw))
    if trace is not None:
        write_chrome_trace(timeline, trace, pid_name=f"{s.name}: representative rank")
    return _result(s, hw, timeline, calibration)


def model_flops_per_step(s: Scenario) -> float:
    """Analytic model FLOPs of one optimizer step over all GPUs (DESIGN rule 2)."""
    per_micro = sum(c.flops for c in model_costs(s.model, batch=s.training.micro_batch))
    return per_micro * s.grad_accum * s.hardware.num_gpus


def _result(s: Scenario, hw: Hardware, t: Timeline, cal: Calibration | None) -> SimResult:
    flops = model_flops_per_step(s)
    dtype = s.hardware.mfu_peak_dtype
    peak = hw.gpu.peak("fp8" if dtype == "mxfp8" else dtype)
    comm_by_axis = {k.removeprefix("comm."): v for k, v in t.comm_s_by_stream.items()}
    return SimResult(
        scenario=s.name,
        gpu=hw.gpu.name,
        num_gpus=s.hardware.num_gpus,
        network=hw.network.name,
        step_time_s=t.step_time_s,
        samples_per_s=s.training.global_batch / t.step_time_s,
        model_flops_per_step=flops,
        mfu=flops / (t.step_time_s * s.hardware.num_gpus * peak),
        mfu_peak=f"{hw.gpu.name} {dtype} dense",
        mfu_peak_flops=peak,
        breakdown_s={
            "compute": t.compute_s - t.slowdown_s,
            "sm_contention": max(0.0, t.slowdown_s),
            "exposed_comm": t.exposed_comm_s,
            "overlapped_comm": t.overlapped_comm_s,
            "idle": t.idle_s,
        },
        compute_s_by_op_class=dict(t.compute_s_by_op_class),
        comm_s_by_axis=comm_by_axis,
        num_ops=len(t.spans),
        calibration=cal.gpu + " " + cal.created_utc if cal else "",
    )
