"""What a step runs on besides the model: the device, the batch loader, the fused sparse update,
CUDA-graph replay, the step timer and the dense learning rate's warm-up.

``executor.train`` strings them together; each reads its choice from the run's resolved
``execution`` (``scenarios.execution.ResolvedExecution``), never from the environment.
"""

from __future__ import annotations

import contextlib
import time

import torch

from executor.data import Prefetcher, SyntheticData
from scenarios.execution import ResolvedExecution
from scenarios.schema import Scenario


def device_type(scenario: Scenario) -> str:
    """``execution.device``: auto is CUDA where present, else the CPU."""
    want = scenario.execution.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ValueError("execution.device is 'cuda' but torch finds no CUDA device; set execution.device: auto")
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    return want


def device_for(scenario: Scenario) -> torch.device:
    """The run's device: the current CUDA device (a launched rank's own: ``executor.launch`` sets it
    from its local rank), or the CPU."""
    kind = device_type(scenario)
    return torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)


def configure_allocator(device: torch.device) -> None:
    """Expandable segments for the CUDA caching allocator: ΣL changes every batch, and without
    them the allocator fragments, then frees (a device sync) and re-mallocs inside the step."""
    if device.type != "cuda":
        return
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
    setter("expandable_segments:True")


def loader(scenario: Scenario, run: ResolvedExecution, device: torch.device, *, rank: int = 0,
           world: int = 1, start: int = 0) -> Prefetcher:
    """The training batches: validated, packed (to ``token_bucket`` with static shapes) and, on
    CUDA, pinned and copied on a side stream by a background thread, or drawn in a worker process.
    ``rank`` of ``world``: this rank's share of the one global stream (``SyntheticData``), from its
    batch ``start`` on (a resumed run)."""
    data = SyntheticData(scenario, scenario.training.seed, rank=rank, world=world, start=start)
    return Prefetcher(data, scenario.model, device, processes=run.data_processes,
                      bucket=run.token_bucket)  # fmt: skip


def attach_fused_sparse_update(model, sparse_opt, run: ResolvedExecution, device: torch.device) -> None:
    """With ``fused_sparse_update``: row-wise Adagrad inside each table group's lookup backward
    (``kernels.embedding.tbe.RowwiseAdagradInBackward``: one kernel per group, no host sync, no
    sparse gradient); the sparse optimizer then has no gradients left to apply."""
    if not run.fused_sparse_update:
        return
    from executor.embeddings import _FusedTableModule
    from kernels.embedding.tbe import RowwiseAdagradInBackward

    mods = [m for m in model.modules() if isinstance(m, _FusedTableModule)]
    if not all(m.use_triton(device) for m in mods):  # a table left its fused buffer: torch lookups
        raise ValueError("execution.fused_sparse_update needs every lookup on the Triton kernels, and a table "
                         "module fell back to torch; set execution.fused_sparse_update: false")
    group = sparse_opt.param_groups[0]
    for mod in mods:
        for f in mod.fused:
            f.in_backward = RowwiseAdagradInBackward(f, lr=group["lr"], eps=group["eps"])


@contextlib.contextmanager
def eager_while_guarded(model, compiled: bool):
    """A compiled model runs eagerly (``torch.compiler.set_stance("force_eager")``) while an MXFP8
    layer's guard is pending: the guard compares with bf16 on the host, which a compiled graph
    would break at and recompile for (``kernels.mxfp8.linear``). After such a step, the blockwise-fp8
    layers that settled in bf16 go back to plain ``nn.Linear`` (``kernels.fp8block.linear.settle``),
    so that the compiled program is the bf16 one where fp8 does not pay."""
    from kernels.mxfp8.linear import guard_pending

    pending = guard_pending(model)
    with torch.compiler.set_stance("force_eager") if compiled and pending else contextlib.nullcontext():
        yield
    if pending:
        from kernels.fp8block.linear import settle

        settle(model)


class StepTimer:
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


class Warmup:
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
