"""The training loop of one process, measured into a ``RunRecord``.

The route from a scenario to a trained step::

    run = resolve(scenario, device.type)               # scenarios/execution.py
    model = build_model(scenario).to(device)           # executor/model.py
    parallelize(model, scenario, run)                  # executor/parallelize.py
    for step: step_loss(model, batches, ...)           # here

One step = ``scenario.grad_accum`` micro-batches of ``training.micro_batch`` samples, then the
dense optimizer (Adam/AdamW, grad-norm clipped) and the sparse one (row-wise Adagrad on the
embedding tables, ``executor.optim``; or fused into the lookups' backward). Batches come from
``executor.runtime.loader``. On CUDA the step time is measured with CUDA events around the step
(the host clock, synchronised, is kept as ``wall_time_s``), and peak memory is the allocator's
peak since the start of training. After ``warmup_steps`` steps, ``profile_steps`` steps run
under ``torch.profiler`` and their op self time is summed per op class
(``executor.profiling``). At the end, loss, NE and AUC per task are measured on a held-out set
drawn from the same hidden label function (``evaluate``). With ``execution.cuda_graphs`` each
step is replayed from a CUDA graph, one per batch shape (``executor.graphs``); the first step
of a shape and the profiled steps run eagerly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch.profiler import record_function

import torch.distributed as dist

from executor import runtime
from executor.checkpoint import Checkpointer, CheckpointError, State, find_latest, load
from executor.checkpoint import resolve_resume
from executor.comm_profile import collective_times
from executor.data import Batch, SyntheticData
from executor.memory_check import check_fits, memory_errors_in_one_line
from executor.metrics import auc, normalized_entropy
from executor.model import build_model, compute_loss
from executor.mesh import Ranks, ranks_of
from executor.moe import assignment_counts
from executor.optim import DisjointParams, RowWiseAdagrad, clip_grad_norm
from executor.parallelize import parallelize
from executor.profiling import kernel_times, op_class_kernels, op_class_times, start_profiler, stop_profiler
from executor.profiling import write_trace
from executor.record import Profiled, RankMeasurements, build_record, peak_memory
from executor.replicated import ReplicatedGrads
from scenarios.execution import ResolvedExecution, resolve
from scenarios.schema import Scenario
from twin.runrecord import RunRecord, StepRecord

def train(scenario: Scenario, **kw) -> RunRecord:
    """Train ``scenario`` and return its RunRecord (``fit``'s arguments)."""
    return fit(scenario, **kw)[0]


@memory_errors_in_one_line
def fit(
    scenario: Scenario,
    *,
    steps: int | None = None,
    out: Path | None = None,
    profile_steps: int = 3,
    warmup_steps: int = 2,
    log: Callable[[str], object] = print,
    trace: Path | None = None,
    resume: str | Path | bool | None = None,
) -> tuple[RunRecord, torch.nn.Module]:
    """Train ``scenario`` for ``steps`` (default ``training.steps``); save the record to ``out``.
    Returns the record and the trained model (sharded as ``parallelize`` left it).

    Every execution choice comes from ``scenario.execution`` (resolved for the device the run
    finds). ``trace``: write the profiled steps' ``torch.profiler`` trace there and their op table
    next to it (``executor.profiling.write_trace``). Under a process group of several ranks
    (``executor.launch``) each rank trains its share of every step and rank 0 writes.

    ``training.checkpoint`` saves checkpoints as the run goes (``executor.checkpoint``);
    ``resume``: True (the newest committed one under its ``dir``, if any) or a checkpoint's path,
    whose state the run continues from, step numbers and data position included: ``steps`` is
    then the step count the run ends at, not the count it trains."""
    steps = scenario.training.steps if steps is None else steps
    lead = not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
    if resume is True or resume == "latest":
        found = find_latest(scenario.training.checkpoint.dir) if scenario.training.checkpoint.dir else None
        for torn in found.torn if found and lead else ():
            log(f"checkpoint {torn} was never committed (a save that crashed): ignored")
    resume = resolve_resume(scenario, resume)
    device, ranks, run, model, applied = _built(scenario)
    session = _Session(scenario, run, model, device, ranks, applied.sharding.replicated, applied.sharding.experts,
                       applied.sharding.table_backends, resume=resume)  # fmt: skip
    first = session.start
    if steps <= first:
        raise CheckpointError(f"--steps {steps}: the checkpoint {resume} has trained {first} steps already; "
                              f"give --steps above {first} (the step count the resumed run ends at)")  # fmt: skip
    log(f"training {scenario.name} on {device} for {steps - first} steps ({session.accum} x "
        f"{scenario.training.micro_batch} samples{_on_ranks(ranks, scenario)})"
        + (f", resumed from {resume} at step {first}" if resume else ""))  # fmt: skip
    profile_at = (range(first + warmup_steps, min(first + warmup_steps + profile_steps, steps)) if profile_steps
                  else range(0))  # fmt: skip
    records, prof = session.run(steps, profile_at, log, shapes=ranks is not None)
    lead = ranks is None or ranks.rank == 0  # the rank that writes what the run leaves behind
    if prof is not None and trace is not None and lead:
        write_trace(prof, trace, device.type)
    routed, dropped = moe_assignments(model, ranks)  # before evaluate (which counts none): one collective
    metrics = {"first_loss": records[0].loss}
    if scenario.training.eval_batches:
        metrics |= evaluate(model, scenario, device, ranks=ranks)
    profiled = _profiled(prof, profile_at, device, applied.sharding if ranks else None)
    record = build_record(scenario, run, records, warmup=warmup_steps, profiled=profiled,
                          metrics=metrics, device=device, graph_replays=session.replays,
                          ranks=measure_ranks(ranks, records, device) if ranks else None,
                          moe_assignments=(routed, dropped),
                          checkpoints=session.checkpoints(resume), low_precision=low_precision_layers(model))  # fmt: skip
    if out is not None and lead:
        record.save(out)
    return record, model


def low_precision_layers(model) -> dict[str, str]:
    """What each MXFP8 / blockwise-fp8 Linear ran in by the end of the run (RunRecord field)."""
    from kernels.mxfp8.linear import MXFP8Linear

    out = {}
    for m in model.modules():
        if hasattr(m, "low_precision"):  # a blockwise-fp8 layer put back in bf16 (kernels.fp8block.linear.settle)
            name, how = m.low_precision
            out[name] = how
        elif isinstance(m, MXFP8Linear):
            why = "auto" if getattr(m, "auto", False) and m.calls == 0 else "guard"
            out[m.name] = f"bf16 ({why})" if m.fallback else m.label
    return out


def _built(scenario: Scenario):
    """(device, ranks, resolved execution, model, what ``parallelize`` applied) of a run."""
    device = runtime.device_for(scenario)
    ranks = ranks_of(scenario, device)  # None: one process, no collective
    run = resolve(scenario, device.type, world_size=ranks.size if ranks else 1)
    runtime.configure_allocator(device)
    check_fits(scenario, device)  # the twin's memory model against the free memory, before allocating
    with device:  # parameters are created (and initialised) on the device, not copied there
        model = build_model(scenario).to(device)
    return device, ranks, run, model, parallelize(model, scenario, run, ranks.mesh if ranks else None)


def restore(scenario: Scenario, path: str | Path) -> tuple[torch.nn.Module, int]:
    """The model of ``scenario`` (sharded over this process's group, as ``fit`` shards it) with
    checkpoint ``path``'s state, whatever mesh saved it, and the steps it had trained: to evaluate
    a checkpoint, or compare one with a run."""
    _, ranks, run, model, applied = _built(scenario)
    session = _Session(scenario, run, model, runtime.device_for(scenario), ranks, applied.sharding.replicated,
                       applied.sharding.experts, applied.sharding.table_backends,
                       resume=resolve_resume(scenario, path))  # fmt: skip
    session.loader.close()
    return model, session.start


def _on_ranks(ranks: Ranks | None, scenario: Scenario) -> str:
    if ranks is None:
        return ""
    sizes = ranks.mesh.sizes()
    mesh = " ".join(f"{a}={n}" for a, n in sizes.items() if a != "world")
    experts = ("experts parallel over expert, FSDP2 over expert_replicate" if sizes["expert"] > 1
               else "experts replicated with gradients averaged")  # fmt: skip
    tables = ("pooled tables sharded by TorchRec, sequence tables native"
              if scenario.parallelism.sparse_backend == "torchrec" else "tables sharded (native)")  # fmt: skip
    return f" on each of {ranks.size} ranks; mesh {mesh}; dense parameters FSDP2, {tables}, {experts}"


def moe_assignments(model, ranks: Ranks | None) -> tuple[int, int]:
    """(routed, dropped) token-expert assignments of the whole run's training steps, every rank's
    summed: the MoE layers' device counters, read once (``executor.moe.assignment_counts``)."""
    counts = assignment_counts(model).to(torch.float64)
    if ranks is not None:
        counts = ranks.mean(counts) * ranks.size
    routed, dropped = (round(float(c)) for c in counts)
    return routed, dropped


def measure_ranks(ranks: Ranks, records: list[StepRecord], device: torch.device) -> RankMeasurements:
    """Every rank's step and wall times and peak memory, gathered (one collective, after the loop)."""
    mine = [[s.step_time_s for s in records], [s.wall_time_s or 0.0 for s in records], [float(peak_memory(device))]]
    flat = torch.tensor([x for row in mine for x in row], dtype=torch.float64, device=device)
    every = ranks.cat(flat[None]).tolist()
    n = len(records)
    return RankMeasurements(mesh=ranks.mesh.sizes(), step_time_s=[r[:n] for r in every],
                            wall_time_s=[r[n : 2 * n] for r in every],
                            peak_memory_bytes=[int(r[2 * n]) for r in every],
                            collective_path=ranks.collective_path)  # fmt: skip


class _Session:
    """The optimizers, loader and (CUDA-graph) step function of one run, and its step loop."""

    def __init__(self, scenario: Scenario, run: ResolvedExecution, model, device: torch.device,
                 ranks: Ranks | None = None, replicated: ReplicatedGrads | None = None,
                 experts: DisjointParams | None = None, tables: list | None = None, *,
                 resume: Path | None = None):
        self.scenario, self.run_, self.model, self.device = scenario, run, model, device
        self.ranks, self.replicated, self.experts, self.tables = ranks, replicated, experts, tables or []
        t = scenario.training
        self.dense_opt, self.sparse_opt = optimizers(model, scenario)
        runtime.attach_fused_sparse_update(model, self.sparse_opt, run, device)
        for backend in self.tables:
            backend.attach(self.sparse_opt)  # column-split tables' row-wise Adagrad sums over their peers
        if run.cuda_graphs:
            for group in self.dense_opt.param_groups:  # the step counter on the device, updated by the graph
                group["capturable"] = True
        self.state = State(scenario, model, self.dense_opt, self.sparse_opt, ranks, experts, self.tables)
        self.start, position = 0, 0
        if resume is not None:  # before the warm-up's device lr and any CUDA graph: state loaded in place
            loaded = load(resume, self.state)
            self.start, position = loaded.step, loaded.data_position
        self.saver = Checkpointer(scenario, self.state)
        self.per_step = t.global_batch // t.micro_batch  # micro-batches of the global stream per step
        self.warmup = runtime.Warmup(self.dense_opt, t.dense_lr, t.lr_warmup_steps, device if run.cuda_graphs else None)
        self.loader = runtime.loader(scenario, run, device, rank=ranks.rank if ranks else 0,
                                     world=ranks.size if ranks else 1,
                                     start=position)  # this rank's share of the batches, from the checkpoint's position
        self.graphed = None
        if run.cuda_graphs:
            from executor.graphs import GraphedSteps

            self.graphed = GraphedSteps(model, lambda bs: self._loss(bs))
        self.accum = max(scenario.grad_accum, 1)

    def checkpoints(self, resume: Path | None) -> dict:
        """The RunRecord's checkpoint fields."""
        return {"resumed_from": str(resume) if resume else "", "checkpoint_steps": list(self.saver.saved),
                "checkpoint_stall_s": list(self.saver.stalls), "checkpoint_async": self.saver.settings.async_save}

    @property
    def replays(self) -> int:
        return self.graphed.replays if self.graphed is not None else 0

    def _loss(self, batches: list[Batch]) -> torch.Tensor:
        return step_loss(self.model, batches, self.dense_opt, self.sparse_opt,
                         grad_clip=self.scenario.training.grad_clip, replicated=self.replicated,
                         experts=self.experts, tables=self.tables)  # fmt: skip

    def run(self, steps: int, profile_at: range, log, *, shapes: bool = False) -> tuple[list[StepRecord], object]:
        """``shapes``: the profiler records op input shapes (several ranks: they pair gloo's work with
        the ops that issued it, ``executor.comm_profile``)."""
        records, prof = [], None
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            for step in range(self.start, steps):
                if step == profile_at.start and step in profile_at:
                    prof = start_profiler(self.device.type, shapes=shapes)
                self.saver.poll()  # an async save written since: committed
                records.append(self._step(step, step in profile_at))
                if prof is not None and step == profile_at.stop - 1:
                    stop_profiler(prof)
                if (step - self.start) % 10 == 0 or step == steps - 1:
                    log(f"step {step:4d} loss {records[-1].loss:.4f} {records[-1].step_time_s * 1e3:.1f} ms")
                if self.saver.due(step + 1, steps):  # outside the step's timer: the record keeps the stall
                    stall = self.saver.save(step + 1, (step + 1) * self.per_step)
                    log(f"checkpoint after step {step:4d}: {stall * 1e3:.0f} ms"
                        + (" (async: written in the background)" if self.saver.settings.async_save else ""))
            self.saver.finish()
        finally:
            self.loader.close()
        if self.graphed is not None:
            log(f"cuda graphs: {self.graphed.summary()}")
        return records, prof

    def _step(self, step: int, profiled: bool) -> StepRecord:
        self.warmup.set(step)
        waited = self.loader.wait_s
        batches = [next(self.loader) for _ in range(self.accum)]
        waited = self.loader.wait_s - waited
        timer = runtime.StepTimer(self.device)
        if self.graphed is None:
            with runtime.eager_while_guarded(self.model, self.run_.compile):
                loss = self._loss(batches)
        else:  # profiled steps eagerly: the profiler names the ops of kernels launched one by one
            loss = self.graphed.eager(batches[0]) if profiled else self.graphed(batches[0])
        if self.ranks is not None:
            loss = self.ranks.mean(loss)  # the global batch's loss
        loss = float(loss)  # the step's one host sync
        elapsed, wall = timer.stop()
        return StepRecord(step=step, step_time_s=elapsed, loss=loss,
                          samples=self.accum * self.scenario.training.micro_batch,
                          model_flops=sum(batch_flops(self.scenario, b) for b in batches),
                          wall_time_s=wall, data_wait_s=waited)  # fmt: skip


def _profiled(prof, profile_at: range, device: torch.device, sharding=None) -> Profiled:
    """What the profiled steps measured; with ``sharding`` (several ranks) their collectives per
    mesh axis too (``executor.comm_profile``: FSDP units' axes from the sharding step)."""
    if prof is None:
        return Profiled()
    n, kind = len(profile_at), device.type
    comm = None if sharding is None else collective_times(prof, per_steps=n, device=kind,
                                                          fsdp_axes=sharding.fsdp_axes)  # fmt: skip
    return Profiled(profile_at, op_class_times(prof, per_steps=n, device=kind),
                    kernel_times(prof, per_steps=n, device=kind),
                    op_class_kernels(prof, per_steps=n, device=kind), comm)  # fmt: skip


def step_loss(model, batches: list[Batch], dense_opt, sparse_opt, *, grad_clip: float,
              replicated: ReplicatedGrads | None = None, experts: DisjointParams | None = None,
              tables: list | None = None) -> torch.Tensor:
    """One training step; returns the loss as a device tensor (no host sync: CUDA graphs capture it).
    ``replicated``: parameters every rank holds whole, whose gradients are averaged over the ranks
    before the optimizers run (FSDP2 reduces the sharded ones itself, in the last micro-batch's
    backward: the earlier ones keep their gradients unsharded, so a step reduce-scatters once, as
    the twin prices it); ``experts``: the expert-parallel experts, each rank's own, whose norm the
    clip sums over their group;
    ``tables``: the backends that shard the embedding tables (``Sharding.table_backends``: the
    native ``executor.sharded_tables.ShardedTables``, whose shards' gradients are scaled before,
    and whose replicas are synced after, the sparse step; TorchRec's pooled tables, looked up once
    for the step's micro-batches and updated in their one backward)."""
    tables = tables or []
    dense_opt.zero_grad(set_to_none=True)
    sparse_opt.zero_grad(set_to_none=True)
    total = 0.0
    sync = getattr(model, "set_requires_gradient_sync", None)  # an FSDP2 root: reduce once per step
    for i, batch in enumerate(batches):
        if sync is not None and len(batches) > 1:
            sync(i == len(batches) - 1)  # earlier micro-batches accumulate unsharded gradients
        for t in tables:  # the next micro-batch's ids travel while this one computes
            if i == 0:
                t.begin(batches)
            if i + 1 < len(batches):
                t.start(batches[i + 1])
        logits, aux = model(batch)
        loss = compute_loss(logits, batch.labels, aux) / len(batches)
        loss.backward()
        total = total + loss.detach()
    with record_function("optimizer"):
        if replicated is not None:
            replicated.reduce()
        for t in tables:
            t.reduce()
        if grad_clip > 0:
            clip_grad_norm([p for g in dense_opt.param_groups for p in g["params"]], grad_clip, disjoint=experts)
        dense_opt.step()
        sparse_opt.step()
        for t in tables:
            t.after_step(sparse_opt)
    return total


def optimizers(model, scenario: Scenario):
    """(dense Adam/AdamW, fused multi-tensor on CUDA; row-wise Adagrad on the embedding tables).
    Under FSDP2 the dense parameters are DTensors on the dense mesh, the experts plain tensors or
    (expert parallelism) DTensors on ``expert_replicate``, which one multi-tensor kernel cannot
    mix: one parameter group per kind and mesh (the same update)."""
    from torch.distributed.tensor import DTensor

    t = scenario.training
    sparse = [m.weight for m in model.embedding_modules()]
    ids = {id(p) for p in sparse}
    dense = [p for p in model.parameters() if id(p) not in ids]
    kinds: dict[tuple, list] = {}
    for p in dense:
        sharded = isinstance(p, DTensor)
        kinds.setdefault((sharded, p.device_mesh if sharded else None), []).append(p)
    cls = torch.optim.AdamW if t.dense_optimizer == "adamw" else torch.optim.Adam
    fused = bool(dense) and all(p.is_cuda for p in dense)  # one multi-tensor kernel set, no per-param launches
    return (cls([{"params": ps} for ps in kinds.values()] or dense, lr=t.dense_lr, weight_decay=t.weight_decay,
                fused=fused or None),
            RowWiseAdagrad(sparse, lr=t.sparse_lr))


@torch.no_grad()
def evaluate(model, scenario: Scenario, device, *, batches: int | None = None,
             ranks: Ranks | None = None) -> dict[str, float]:
    """Loss, and NE and AUC per task, on ``batches`` (default ``training.eval_batches``) held-out
    micro-batches (the "eval" stream);
    ``eval_samples``: how many samples that is. With ``ranks`` each rank runs its share of them
    (rounded up to the same count on every rank: FSDP's gathers are collective) and the outputs
    are gathered, so every rank computes the metrics of the whole set."""
    batches = scenario.training.eval_batches if batches is None else batches
    rank, world = (ranks.rank, ranks.size) if ranks else (0, 1)
    data = SyntheticData(scenario, scenario.training.seed, split="eval", rank=rank, world=world)
    mine = -(-batches // world)
    model.eval()
    logits, labels, aux = [], [], torch.zeros((), dtype=torch.float64, device=device)
    for _ in range(mine):
        b = next(data)
        b.validate(scenario.model)  # on the host, before the copy
        b = b.to(device)
        out, a = model(b)
        logits.append(out.float())
        labels.append(b.labels.float())
        aux += a.double() / mine
    model.train()
    logits, labels = torch.cat(logits), torch.cat(labels)
    if ranks is not None:
        logits, labels, aux = ranks.cat(logits), ranks.cat(labels), ranks.mean(aux)
    aux = float(aux)
    metrics = {"loss": float(compute_loss(logits, labels, aux)), "eval_samples": float(len(labels))}
    for i, task in enumerate(scenario.model.tasks.names):
        metrics[f"ne_{task}"] = normalized_entropy(logits[:, i], labels[:, i])
        metrics[f"auc_{task}"] = auc(logits[:, i], labels[:, i])
    return metrics


def batch_flops(scenario: Scenario, batch: Batch) -> float:
    """Analytic fwd+bwd FLOPs of ``batch`` (``twin.flops.step_flops``; 0.0 if it is unavailable)."""
    try:
        from twin.flops import step_flops
    except ImportError:
        return 0.0
    groups = [batch.sequences[g.name].lengths.tolist() for g in scenario.model.embeddings.sequences]
    return float(step_flops(scenario.model, batch=batch.size, group_lengths=groups))


__all__ = ["evaluate", "fit", "optimizers", "restore", "step_loss", "train"]
