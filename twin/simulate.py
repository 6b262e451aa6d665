"""Simulate one training step of a Scenario: op graph → simpy engine → SimResult."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from hwmodels.calibration import Calibration
from scenarios.schema import Scenario
from twin.engine import Timeline, simulate_ranks
from twin.graph import OpGraph
from twin.execution_cost import choices as execution_choices
from twin.goodput import Goodput, check_hardware, goodput
from twin.imbalance import RankClass, every_rank, rank_classes
from twin.memory import memory_per_rank
from twin.flops import model_costs
from scenarios.memo import memo
from twin.runrecord import write_json_atomic
from twin.topology import TopologyClass, topology_classes
from twin.trace import write_chrome_trace_ranks
from twin.workload import Hardware, build_graph


class RankClassResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(..., description="Quantile range of ranks sorted by sequence load.")
    weight: float = Field(..., description="Share of ranks the class stands for.")
    load: float = Field(..., description="Its sequence-dependent FLOPs over the mean rank's.")
    wait_s: float = Field(..., description="Time all its streams stood idle, waiting for others.")


class SimResult(BaseModel):
    """What the twin predicts for one optimizer step. Time in seconds, FLOPs in FLOPs.

    It carries what made it (``resolved_scenario``, ``calibration_content``, ``per_rank``,
    ``imbalance``), so ``resimulate`` gives its timeline back; every view (terminal tables,
    plots, the HTML report) prints these fields and recomputes none of them.
    """

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
    breakdown_s: dict[str, float] = Field(..., description=(
        "The slowest rank class's step: compute + sm_contention + exposed_comm + idle = "
        "step_time_s; overlapped_comm ran under compute and is not part of that sum."))
    compute_s_by_op_class: dict[str, float] = Field(..., description=(
        "As run, SM contention included (what a profiler measures): adds up to "
        "breakdown_s compute + sm_contention."))
    isolated_compute_s_by_op_class: dict[str, float] = Field(..., description=(
        "Each op at its isolated duration, without SM contention: adds up to breakdown_s compute."))
    compute_s_by_kernel: dict[str, float] = Field(
        ..., description="Compute time by kernel kind (attention.gdpa, attention.asym, gemm, ...)."
    )
    comm_s_by_axis: dict[str, float] = Field(..., description="Busy time per mesh axis.")
    exposed_comm_s_by_axis: dict[str, float] = Field(..., description=(
        "Busy while compute is idle, per axis; time two axes are exposed together counts for "
        "each, so these can add up to more than breakdown_s exposed_comm."))
    exposed_comm_s_split_by_axis: dict[str, float] = Field(..., description=(
        "breakdown_s exposed_comm split over the axes: time several axes are exposed together "
        "is shared evenly between them, so these add up to it."))
    balanced_step_time_s: float = Field(..., description="The step with every rank at mean load.")
    straggler_s: float = Field(..., description="step_time_s - balanced_step_time_s.")
    rank_classes: list[RankClassResult]
    memory_fits: bool = Field(..., description="Whether one rank's peak fits the GPU's HBM.")
    memory_total_bytes: float
    memory_capacity_bytes: float
    memory_bytes: dict[str, float] = Field(..., description="Peak bytes per rank by category.")
    memory_message: str
    host_s: float = Field(0.0, description=(
        "The host's time to issue the step (CUDA without graphs: twin.execution_cost); the step is at "
        "least this, the difference counted as idle. 0 where the host never bounds the step."))
    execution_priced: list[str] = Field(default_factory=list, description=(
        "The scenario's execution choices that differ from what the kernel curves describe and that "
        "the twin prices, each 'execution.field=value: how' (twin.execution_cost)."))
    execution_not_priced: list[str] = Field(default_factory=list, description=(
        "Those it does not price, each 'execution.field=value: why': the step is predicted as if "
        "they were the curves' choice."))
    num_ops: int
    device_s: float = Field(0.0, description=(
        "The step without the host's floor (host_s): the last op's end over every rank class (0 in "
        "results saved before it existed)."))
    calibration: str = Field("", description="A label: the calibration's GPU and creation time.")
    resolved_scenario: Scenario = Field(
        ..., description="The scenario as simulated, after extends and --set overrides.")
    calibration_content: Calibration | None = Field(
        ..., description="The calibration the result was made with, in full (None: uncalibrated).")
    per_rank: bool = Field(..., description="Simulated every GPU, not classes of equivalent ones.")
    imbalance: bool = Field(..., description="Simulated rank classes (False: one mean rank).")
    goodput: Goodput | None = Field(None, description=(
        "Checkpoint cost, MTBF, the checkpoint interval and the useful fraction of wall time "
        "(twin.goodput; None in results saved before it existed)."))

    def save(self, path: str | os.PathLike[str]) -> Path:
        return write_json_atomic(path, self.model_dump(mode="json"))

    def resimulate(self, *, trace: str | os.PathLike | None = None) -> tuple[SimResult, Timeline]:
        """Simulate again exactly what made this result (its resolved scenario, its calibration,
        its rank model): the result again and the slowest rank class's timeline, for plots and
        traces. Equal to ``self`` unless the twin's code or hardware data changed since."""
        return simulate_timelines(self.resolved_scenario, calibration=self.calibration_content,
                                  trace=trace, per_rank=self.per_rank, imbalance=self.imbalance)


def simulate(
    s: Scenario, *, calibration: Calibration | None = None, trace: str | os.PathLike | None = None,
    per_rank: bool = False, on_graph=None, imbalance: bool = True,
) -> SimResult:
    """Predict the step of ``s``; optionally write a Chrome/Perfetto trace (a process per class).

    ``per_rank``: simulate every GPU instead of classes of equivalent ones (slow; for checking
    that the symmetric model agrees, at a few hundred GPUs). ``on_graph``: called after each
    rank's graph is built (a progress bar). ``imbalance=False``: one rank at the expected load
    (no rank classes, no straggler; about 4x faster, for sweeps and planners that rank many
    configurations).
    """
    return simulate_timelines(s, calibration=calibration, trace=trace, per_rank=per_rank,
                              on_graph=on_graph, imbalance=imbalance)[0]  # fmt: skip


def simulate_timelines(
    s: Scenario, *, calibration: Calibration | None = None, trace: str | os.PathLike | None = None,
    per_rank: bool = False, on_graph=None, imbalance: bool = True, built: Mapping[str, OpGraph] | None = None,
) -> tuple[SimResult, Timeline]:
    """``simulate``, also returning the slowest rank class's timeline (for plots). ``built``: rank
    classes' graphs already built for this scenario (``twin.estimate.class_graphs``), by class name."""
    hw = Hardware.of(s, calibration)
    check_hardware(s)  # an unknown storage / failure catalog fails before the simulation
    classes, topo = _classes(s, hw, per_rank=per_rank, imbalance=imbalance)
    graphs = dict(built or {})  # the planner's: estimated first, simulated only if it must
    for c in classes:
        if c.name not in graphs:
            graphs[c.name] = build_graph(s, hw, c.seq, c.shapes)
        if on_graph is not None:
            on_graph()
    timelines = simulate_ranks(graphs)
    if len(classes) > 1:  # every rank at mean load, in each topology position
        balanced = max(tl.step_time_s for tl in simulate_ranks(
            {t.name: build_graph(s, hw, shapes=t.shapes) for t in topo}).values())
    else:
        balanced = timelines[classes[0].name].step_time_s
    if trace is not None:
        write_chrome_trace_ranks({f"{s.name}: ranks {c.name}": timelines[c.name] for c in classes},
                                 trace)  # fmt: skip
    result = _result(s, hw, classes, timelines, balanced, calibration)
    how = {"resolved_scenario": s, "calibration_content": calibration, "per_rank": per_rank,
           "imbalance": imbalance}
    return SimResult(**result, **how), timelines[_slowest(classes, timelines).name]


def _classes(s: Scenario, hw: Hardware, *, per_rank: bool, imbalance: bool
             ) -> tuple[list[RankClass], list[TopologyClass]]:
    """Load classes (twin.imbalance) in the most common topology position (twin.topology), and
    each other position at the straggler's load, standing for all of that position's ranks (the
    step waits for the slowest: the straggler in its slowest position); and the positions.
    L + T - 1 graphs, not L x T."""
    topo, of_rank = topology_classes(s, hw.network)
    loads = every_rank(s) if per_rank else rank_classes(s) if imbalance else [RankClass("all", 1.0, None, 1.0)]
    if per_rank and len(loads) == s.hardware.num_gpus:  # each GPU in its own topology position
        return [replace(c, shapes=topo[0 if of_rank is None else of_rank[r]].shapes)
                for r, c in enumerate(loads)], topo  # fmt: skip
    if len(topo) == 1:
        return [replace(c, shapes=topo[0].shapes) for c in loads], topo
    top = max(loads, key=lambda c: (c.load, c.name))
    return [RankClass(f"{c.name}/{topo[0].name}", c.weight * topo[0].weight, c.seq, c.load, topo[0].shapes)
            for c in loads] + [RankClass(f"{top.name}/{t.name}", t.weight, top.seq, top.load, t.shapes)
                               for t in topo[1:]], topo  # fmt: skip


def _slowest(classes, timelines: dict[str, Timeline]):
    """The most loaded class; among those, the busiest (the one the others wait for)."""
    return max(classes, key=lambda c: (c.load, timelines[c.name].step_time_s - timelines[c.name].idle_s, c.name))


_FLOPS: dict = {}  # scenarios.memo's table


def model_flops_per_step(s: Scenario) -> float:
    """Analytic model FLOPs of one optimizer step over all GPUs (DESIGN rule 2)."""
    costs = model_costs(s.model, batch=s.training.micro_batch)
    per_micro = memo(_FLOPS, (costs,), (), lambda: sum(c.flops for c in costs))
    return per_micro * s.grad_accum * s.hardware.num_gpus


def _result(s, hw, classes, timelines: dict[str, Timeline], balanced: float, cal) -> dict:
    """The SimResult's numbers (every view reads these; none recomputes from a timeline)."""
    flops = model_flops_per_step(s)
    dtype = s.hardware.mfu_peak_dtype
    peak = hw.gpu.peak("fp8" if dtype == "mxfp8" else dtype)
    t = timelines[_slowest(classes, timelines).name]
    mem = memory_per_rank(s, gpu=hw.gpu)
    choices = execution_choices(s)
    step = max(tl.step_time_s for tl in timelines.values())  # the host's time included (Timeline.host_s)
    return dict(
        scenario=s.name,
        gpu=hw.gpu.name,
        num_gpus=s.hardware.num_gpus,
        network=hw.network.name,
        step_time_s=step,
        samples_per_s=s.training.global_batch / step,
        model_flops_per_step=flops,
        mfu=flops / (step * s.hardware.num_gpus * peak),
        mfu_peak=f"{hw.gpu.name} {dtype} dense",
        mfu_peak_flops=peak,
        breakdown_s={
            "compute": t.compute_s - t.slowdown_s,
            "sm_contention": max(0.0, t.slowdown_s),
            "exposed_comm": t.exposed_comm_s,
            "overlapped_comm": t.overlapped_comm_s,
            "idle": t.idle_s + (step - t.step_time_s),
        },
        compute_s_by_op_class=dict(t.compute_s_by_op_class),
        isolated_compute_s_by_op_class=dict(t.isolated_compute_s_by_op_class),
        compute_s_by_kernel=dict(t.compute_s_by_kernel),
        comm_s_by_axis=_by_axis(t.comm_s_by_stream),
        exposed_comm_s_by_axis=_by_axis(t.exposed_comm_s_by_stream()),
        exposed_comm_s_split_by_axis=_by_axis(t.exposed_comm_s_split_by_stream()),
        balanced_step_time_s=balanced,
        straggler_s=step - balanced,
        rank_classes=[_class_result(c, timelines[c.name]) for c in classes],
        memory_fits=mem.fits,
        memory_total_bytes=mem.total_bytes,
        memory_capacity_bytes=mem.capacity_bytes,
        memory_bytes=dict(mem.by_category_bytes),
        memory_message=mem.message(),
        host_s=t.host_s,
        execution_priced=[str(c) for c in choices if c.priced],
        execution_not_priced=[str(c) for c in choices if not c.priced],
        num_ops=sum(len(tl.spans) for tl in timelines.values()),
        device_s=max(max((sp.end_s for sp in tl.spans), default=0.0) for tl in timelines.values()),
        calibration=cal.gpu + " " + cal.created_utc if cal else "",
        goodput=goodput(s, step_time_s=step, memory=mem),
    )


def _by_axis(by_stream: dict[str, float]) -> dict[str, float]:
    return {k.removeprefix("comm."): v for k, v in by_stream.items()}


def _class_result(c, t: Timeline) -> RankClassResult:
    return RankClassResult(name=c.name, weight=c.weight, load=c.load, wait_s=max(0.0, t.idle_s))
