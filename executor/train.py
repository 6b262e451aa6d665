"""Single-process training of a scenario's model, measured into a ``RunRecord``.

One step = ``scenario.grad_accum`` micro-batches of ``training.micro_batch`` samples, then the
dense optimizer (Adam/AdamW, grad-norm clipped) and the sparse one (row-wise Adagrad on the
embedding tables, ``executor.optim``). Batches come from ``executor.data.Prefetcher`` (validated,
packed and, on CUDA, pinned and copied on a side stream by a background thread). On CUDA the
step time is measured with CUDA events around the step (the host clock, synchronised, is kept as
``wall_time_s``), and peak memory is the allocator's peak since the start of training. After
``warmup_steps`` steps, ``profile_steps`` steps run under ``torch.profiler`` and their op self
time is summed per op class (``executor.profiling``). At the end, loss, NE and AUC per task are
measured on a held-out set drawn from the same hidden label function.

On CUDA, by default, batches are static-shape (id layouts padded to buckets) and each step is
replayed from a CUDA graph, one per batch shape (``executor.graphs``); the first step of a shape
and the profiled steps run eagerly.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import resource
import statistics
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from executor.data import Batch, Prefetcher, SyntheticData
from executor.env import env_flag
from executor.memory_check import check_fits, memory_errors_in_one_line
from executor.metrics import auc, normalized_entropy
from executor.model import MoE, build_model, compute_loss
from executor.optim import RowWiseAdagrad
from executor.profiling import kernel_times, op_class_kernels, op_class_times, without_kineto_notices
from scenarios.schema import Scenario
from twin.runrecord import Environment, RunRecord, StepRecord

EVAL_BATCHES = 8


@memory_errors_in_one_line
def train(
    scenario: Scenario,
    *,
    steps: int | None = None,
    out: Path | None = None,
    profile_steps: int = 3,
    warmup_steps: int = 2,
    log: Callable[[str], object] = print,
    embedding_kernel: str | None = None,
    attention_kernel: str | None = None,
    compile: bool | None = None,
    trace: Path | None = None,
    fused_sparse_update: bool | None = None,
    token_bucket: int | None = None,
    data_processes: bool = False,
    cuda_graphs: bool | None = None,
) -> RunRecord:
    """Train ``scenario`` for ``steps`` (default ``training.steps``); save the record to ``out``.

    ``embedding_kernel``: "auto" (Triton TBE on CUDA, torch on CPU), "triton" or "torch";
    default ``$GEMTWIN_EMBEDDING_KERNEL`` or auto (``executor.model.set_embedding_kernel``).
    ``attention_kernel``: "auto" (the Triton kernels of ``kernels/`` on CUDA, the reference on
    CPU), "triton" or "reference"; default ``$GEMTWIN_ATTENTION_KERNEL`` or auto.
    ``compile``: ``torch.compile`` the dense blocks (``executor.model.compile_dense``); default
    ``$GEMTWIN_COMPILE`` (1/0) or on with CUDA, off on CPU.
    ``fused_sparse_update``: apply the embeddings' row-wise Adagrad inside the lookups' backward
    (``kernels.embedding.tbe.RowwiseAdagradInBackward``: one kernel per table group, no host
    sync, no sparse gradient); default on where it is exact: Triton lookups and one micro-batch
    per step.
    ``cuda_graphs``: replay each step from a CUDA graph, one per static batch shape
    (``executor.graphs``); needs CUDA, the Triton lookups and attention, the fused sparse update
    and bf16/fp32 precision. Default ``$GEMTWIN_CUDA_GRAPHS`` (1/0), else on where those hold.
    ``token_bucket``: pack static-shape batches, every id layout (sequence tokens, pooled ids)
    padded to a multiple of this many ids (``executor.data.Batch.pack``; 0: none); default 8192
    with CUDA graphs, else 0. ``data_processes``: draw batches in a worker process
    (``executor.data.Prefetcher``; opt-in, not yet shown to help).
    ``trace``: write the profiled steps' ``torch.profiler`` trace there (Chrome/Perfetto JSON,
    gzipped when the name ends in .gz) and their op table sorted by device time next to it
    (``<trace>.top.txt``).

    Memory (``executor.memory_check``): a scenario whose memory, by the twin's model, exceeds
    what the device has free is refused before anything is allocated, and an allocation that
    fails anyway ends the same way: a one-line ``DoesNotFit`` (a ``ValueError``) with a fix.
    """
    t = scenario.training
    steps = t.steps if steps is None else steps
    if token_bucket is not None and token_bucket < 0:
        raise ValueError(f"token_bucket ({token_bucket}) must be >= 0 ids (0: no padding)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        # ΣL changes every batch: without expandable segments the caching allocator fragments,
        # then frees (a device sync) and re-mallocs inside the step
        setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
        setter("expandable_segments:True")
    check_fits(scenario, device)  # the twin's memory model against the free memory, before allocating
    with device:  # parameters are created (and initialised) on the device, not copied there
        model = build_model(scenario).to(device)
    if embedding_kernel is not None:
        from executor.model import set_embedding_kernel

        set_embedding_kernel(model, embedding_kernel)
    if attention_kernel is not None:
        from executor.model import set_attention_kernel

        set_attention_kernel(model, attention_kernel)
    compiled = default_compile(device) if compile is None else compile
    if compiled:
        from executor.model import compile_dense

        compile_dense(model)
    dense_opt, sparse_opt = _optimizers(model, scenario)
    sparse_update = _fuse_sparse_update(model, sparse_opt, device, scenario, fused_sparse_update)
    graphs = _graphs_wanted(model, scenario, device, sparse_update, cuda_graphs)
    if graphs:
        for group in dense_opt.param_groups:  # the step counter on the device, updated by the graph
            group["capturable"] = True
    warmup = _Warmup(dense_opt, t.dense_lr, t.lr_warmup_steps, device if graphs else None)
    if token_bucket is None:
        token_bucket = DEFAULT_GRAPH_BUCKET if graphs else 0
    if graphs and not token_bucket:
        raise ValueError("cuda_graphs needs static-shape batches: token_bucket must be > 0 (default 8192)")
    loader = Prefetcher(SyntheticData(scenario, t.seed), scenario.model, device, processes=data_processes,
                        bucket=token_bucket)
    graphed = None
    if graphs:
        from executor.graphs import GraphedSteps

        graphed = GraphedSteps(model, lambda bs: _step_loss(model, bs, dense_opt, sparse_opt, grad_clip=t.grad_clip))
    accum = max(scenario.grad_accum, 1)
    # the profiled steps, inside the run (a run shorter than warm-up + profile profiles fewer)
    profile_at = range(warmup_steps, min(warmup_steps + profile_steps, steps)) if profile_steps else range(0)
    records, prof = [], None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    log(f"training {scenario.name} on {device} for {steps} steps ({accum} x {t.micro_batch} samples)")
    try:
        for step in range(steps):
            if step == profile_at.start and step in profile_at:
                prof = _start_profiler(device)
            warmup.set(step)
            waited = loader.wait_s
            batches = [next(loader) for _ in range(accum)]
            waited = loader.wait_s - waited
            timer = _StepTimer(device)
            if graphed is None:
                with _eager_while_guarded(model, compiled):
                    loss = _step_loss(model, batches, dense_opt, sparse_opt, grad_clip=t.grad_clip)
            else:  # profiled steps eagerly: the profiler names the ops of kernels launched one by one
                loss = graphed.eager(batches[0]) if step in profile_at else graphed(batches[0])
            loss = float(loss)  # the step's one host sync
            elapsed, wall = timer.stop()
            if prof is not None and step == profile_at.stop - 1:
                with without_kineto_notices():
                    prof.stop()
            flops = sum(_batch_flops(scenario, b) for b in batches)
            records.append(StepRecord(step=step, step_time_s=elapsed, loss=loss, samples=accum * t.micro_batch,
                                      model_flops=flops, wall_time_s=wall, data_wait_s=waited))
            if step % 10 == 0 or step == steps - 1:
                log(f"step {step:4d} loss {loss:.4f} {elapsed * 1e3:.1f} ms")
    finally:
        loader.close()
    if graphed is not None:
        log(f"cuda graphs: {graphed.summary()}")
    if prof is not None and trace is not None:
        _write_trace(prof, Path(trace), device)
    op_time = op_class_times(prof, per_steps=len(profile_at), device=device.type) if prof else {}
    kind_time = kernel_times(prof, per_steps=len(profile_at), device=device.type) if prof else {}
    class_kernels = op_class_kernels(prof, per_steps=len(profile_at), device=device.type) if prof else {}
    metrics = {"first_loss": records[0].loss, **evaluate(model, scenario, device)}
    record = _record(scenario, records, warmup_steps, (op_time, kind_time), profile_at if prof else range(0),
                     metrics, device, model)
    record = record.model_copy(update=dict(attention_kernel=_attention_kernel(model, device), compiled=compiled,
                                           sparse_update=sparse_update, token_bucket=token_bucket,
                                           data_processes=data_processes, cuda_graphs=graphs,
                                           graph_replays=graphed.replays if graphed else 0,
                                           op_class_kernels_s=class_kernels))
    if out is not None:
        record.save(out)
    return record


def _step_loss(model, batches: list[Batch], dense_opt, sparse_opt, *, grad_clip: float) -> torch.Tensor:
    """One training step; returns the loss as a device tensor (no host sync: CUDA graphs capture it)."""
    dense_opt.zero_grad(set_to_none=True)
    sparse_opt.zero_grad(set_to_none=True)
    total = 0.0
    for batch in batches:
        logits, aux = model(batch)
        loss = compute_loss(logits, batch.labels, aux) / len(batches)
        loss.backward()
        total = total + loss.detach()
    with record_function("optimizer"):
        if grad_clip > 0:
            params = [p for g in dense_opt.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        dense_opt.step()
        sparse_opt.step()
    return total


def _optimizers(model, scenario: Scenario):
    t = scenario.training
    sparse = [m.weight for m in model.embedding_modules()]
    ids = {id(p) for p in sparse}
    dense = [p for p in model.parameters() if id(p) not in ids]
    cls = torch.optim.AdamW if t.dense_optimizer == "adamw" else torch.optim.Adam
    fused = bool(dense) and all(p.is_cuda for p in dense)  # one multi-tensor kernel set, no per-param launches
    return (cls(dense, lr=t.dense_lr, weight_decay=t.weight_decay, fused=fused or None),
            RowWiseAdagrad(sparse, lr=t.sparse_lr))


@torch.no_grad()
def evaluate(model, scenario: Scenario, device, *, batches: int = EVAL_BATCHES) -> dict[str, float]:
    """Loss, and NE and AUC per task, on ``batches`` held-out micro-batches (the "eval" stream);
    ``eval_samples``: how many samples that is."""
    data = SyntheticData(scenario, scenario.training.seed, split="eval")
    model.eval()
    logits, labels, aux = [], [], 0.0
    for _ in range(batches):
        b = next(data)
        b.validate(scenario.model)  # on the host, before the copy
        b = b.to(device)
        out, a = model(b)
        logits.append(out.float())
        labels.append(b.labels.float())
        aux += float(a) / batches
    model.train()
    logits, labels = torch.cat(logits), torch.cat(labels)
    metrics = {"loss": float(compute_loss(logits, labels, aux)), "eval_samples": float(len(labels))}
    for i, task in enumerate(scenario.model.tasks.names):
        metrics[f"ne_{task}"] = normalized_entropy(logits[:, i], labels[:, i])
        metrics[f"auc_{task}"] = auc(logits[:, i], labels[:, i])
    return metrics


# ---- FLOPs, MFU, environment -------------------------------------------------------------------
def _batch_flops(scenario: Scenario, batch: Batch) -> float:
    """Analytic fwd+bwd FLOPs of ``batch`` (``twin.flops.step_flops``; 0.0 if it is unavailable)."""
    try:
        from twin.flops import step_flops
    except ImportError:
        return 0.0
    groups = [batch.sequences[g.name].lengths.tolist() for g in scenario.model.embeddings.sequences]
    return float(step_flops(scenario.model, batch=batch.size, group_lengths=groups))


class _StepTimer:
    """CUDA events around the step on CUDA (device time from the first launch to the last kernel's
    end, launch gaps included); the host clock after a synchronize everywhere (``wall``)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.wall_start = time.perf_counter()
        if device.type == "cuda":
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()

    def stop(self) -> tuple[float, float]:
        """``(step seconds, wall seconds)``."""
        if self.device.type != "cuda":
            wall = time.perf_counter() - self.wall_start
            return wall, wall
        self.end.record()
        self.end.synchronize()
        wall = time.perf_counter() - self.wall_start
        return self.start.elapsed_time(self.end) * 1e-3, wall


def _peak(scenario: Scenario, device: torch.device) -> tuple[float | None, str]:
    """The dense peak of the GPU this run is on (not the scenario's ``hardware.gpu``: a run
    measures the device it has); none on the CPU, which has no datasheet peak."""
    if device.type != "cuda":
        return None, ""
    dtype = scenario.hardware.mfu_peak_dtype
    try:
        from hwmodels.gpus import catalog_name, get_gpu

        gpu = catalog_name("cuda", torch.cuda.get_device_name(device))
        return get_gpu(gpu).peak(dtype), f"{gpu} {dtype} dense"
    except (ImportError, ValueError):
        return None, ""


DEFAULT_GRAPH_BUCKET = 8192


class _Warmup:
    """The dense learning rate's linear warm-up (``training.lr_warmup_steps``). With CUDA graphs the
    rate is a device tensor the captured optimizer reads, updated in place before each step."""

    def __init__(self, opt: torch.optim.Optimizer, lr: float, steps: int, device: torch.device | None):
        self.opt, self.lr, self.steps = opt, lr, steps
        if steps and device is not None:
            for group in opt.param_groups:
                group["lr"] = torch.tensor(float(group["lr"]), device=device)

    def set(self, step: int) -> None:
        if not self.steps or step > self.steps:
            return
        lr = self.lr * min(1.0, (step + 1) / self.steps)
        for group in self.opt.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr


def _eager_while_guarded(model, compiled: bool):
    """A compiled model runs eagerly (``torch.compiler.set_stance("force_eager")``) while an MXFP8
    layer's guard is pending: the guard compares with bf16 on the host, which a compiled graph
    would break at and recompile for (``kernels.mxfp8.linear``)."""
    if compiled:
        from kernels.mxfp8.linear import guard_pending

        if guard_pending(model):
            return torch.compiler.set_stance("force_eager")
    return contextlib.nullcontext()


def _graphs_wanted(model, scenario: Scenario, device: torch.device, sparse_update: str, wanted: bool | None) -> bool:
    """Whether to replay steps from CUDA graphs: ``wanted`` (None: ``$GEMTWIN_CUDA_GRAPHS``, else
    wherever possible). Asked for where it cannot run: a one-line ``ValueError`` saying why."""
    if wanted is None:
        wanted = env_flag("GEMTWIN_CUDA_GRAPHS")
    p = scenario.precision
    why = ("they need CUDA" if device.type != "cuda"
           else "they need the Triton embedding lookups" if _embedding_kernel(model, device) != "triton"
           else "they need the Triton attention kernels" if _attention_kernel(model, device) != "triton"
           else "they need the sparse update fused into the backward (no host sync)" if sparse_update != "fused_backward"
           else "MXFP8 layers check their error on the host" if "mxfp8" in (p.mlp, p.attention)
           else "the MoE's per-expert loop syncs with the host (its grouped matmuls need precision.mlp bf16)"
           if p.mlp != "bf16" and any(isinstance(m, MoE) and m.grouped is not True for m in model.modules())
           else "")
    if wanted is None:
        return not why
    if wanted and why:
        raise ValueError(f"cuda_graphs: {why}; run without --cuda-graphs")
    return bool(wanted)


def _fuse_sparse_update(model, sparse_opt, device, scenario: Scenario, wanted: bool | None) -> str:
    """Attach ``RowwiseAdagradInBackward`` to every fused table buffer when ``wanted`` (None:
    where exact: all lookups on the Triton kernels and one micro-batch per step, since the fused
    update runs once per backward). Returns how the sparse update runs: "fused_backward" or
    "optimizer_step"."""
    from executor.model import _FusedTableModule

    mods = [m for m in model.modules() if isinstance(m, _FusedTableModule)]
    exact = bool(mods) and all(m.use_triton(device) for m in mods) and max(scenario.grad_accum, 1) == 1
    if wanted is None:
        wanted = exact
    if not wanted:
        return "optimizer_step"
    if not exact:
        raise ValueError("fused_sparse_update needs the Triton embedding lookups and one micro-batch per step "
                         "(training.global_batch = micro_batch); leave it unset to choose automatically")
    from kernels.embedding.tbe import RowwiseAdagradInBackward

    group = sparse_opt.param_groups[0]
    for m in mods:
        for f in m.fused:
            f.in_backward = RowwiseAdagradInBackward(f, lr=group["lr"], eps=group["eps"])
    return "fused_backward"


def _write_trace(prof, path: Path, device: torch.device) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=70)
    Path(str(path) + ".top.txt").write_text(table + "\n")


def default_compile(device: torch.device) -> bool:
    """``$GEMTWIN_COMPILE`` (1/0, true/false), else on with CUDA and off on CPU."""
    flag = env_flag("GEMTWIN_COMPILE")
    return device.type == "cuda" if flag is None else flag


def _attention_kernel(model, device: torch.device) -> str:
    """Which attention the sequence and cross layers ran: "triton" or "reference"."""
    from executor.attention import use_triton
    from executor.model import CrossLayer, SequenceLayer

    mods = [m for m in model.modules() if isinstance(m, (SequenceLayer, CrossLayer))]
    return "triton" if mods and all(use_triton(m.attention_kernel, device) for m in mods) else "reference"


def _embedding_kernel(model, device: torch.device) -> str:
    """Which lookups the embedding tables ran: "triton" or "torch" (any table module on torch: "torch")."""
    from executor.model import _FusedTableModule

    if model is None:
        return ""
    mods = [m for m in model.modules() if isinstance(m, _FusedTableModule)]
    return "triton" if mods and all(m.use_triton(device) for m in mods) else "torch"


def _record(scenario, steps, warmup, times, profiled: range, metrics, device, model=None) -> RunRecord:
    op_time, kind_time = times
    # the profiler slows the steps it watches: time only the others after warm-up
    timed = [s for s in steps[warmup:] if s.step not in profiled] or steps[warmup:] or steps
    step_time = max(statistics.median(s.step_time_s for s in timed), 1e-12)
    flops = statistics.fmean(s.model_flops for s in timed)
    peak, peak_name = _peak(scenario, device)
    return RunRecord(
        run_id=uuid.uuid4().hex[:12],
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        scenario_name=scenario.name,
        scenario=scenario.model_dump(mode="json"),
        environment=environment(device),
        warmup_steps=min(warmup, len(steps)),
        steps=steps,
        step_time_s=step_time,
        model_flops_per_step=flops,
        achieved_flops_per_s=flops / step_time,
        mfu=None if peak is None else flops / step_time / peak,
        mfu_peak=peak_name,
        mfu_peak_flops_per_s=peak,
        step_timer="cuda_events" if device.type == "cuda" else "host_clock",
        embedding_kernel=_embedding_kernel(model, device),
        op_class_time_s=op_time,
        kernel_time_s=kind_time,
        profiled_steps=len(profiled),
        peak_memory_bytes=_peak_memory(device),
        peak_memory_reserved_bytes=int(torch.cuda.max_memory_reserved(device)) if device.type == "cuda" else 0,
        metrics=metrics,
    )


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def environment(device: torch.device) -> Environment:
    """Where this process runs: device, versions, CPU model, threads."""
    fields = dict(
        device=device.type, device_name=_cpu_model(), host=platform.node(),
        python=platform.python_version(), torch=torch.__version__, cpu_threads=torch.get_num_threads(),
    )
    try:
        import triton

        fields["triton"] = triton.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        fields["device_name"] = torch.cuda.get_device_name(device)
        props = torch.cuda.get_device_properties(device)
        fields["device_capability"] = f"{props.major}.{props.minor}"
        fields["device_memory_bytes"] = int(props.total_memory)
        fields["num_devices"] = 1
        fields["cuda"] = torch.version.cuda or ""
        try:
            fields["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - NCCL absent from this build
            pass
        fields["driver"] = _nvidia_driver()
    return Environment(**fields)


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
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _start_profiler(device: torch.device):
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    # one profiling cycle: keeping its events (acc_events) changes nothing and spares the warning
    # torch prints otherwise ("Profiler clears events at the end of each cycle")
    prof = profile(activities=acts, acc_events=True)
    with without_kineto_notices():
        prof.start()
    return prof


__all__ = ["environment", "evaluate", "train"]
