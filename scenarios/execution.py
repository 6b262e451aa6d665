"""``execution: auto`` made concrete: one rule for the executor and for the twin.

The executor resolves a Scenario's ``execution`` section for the device it finds
(``resolve(s, "cuda")``) and stores the result in its RunRecord; the twin resolves it for the
device the scenario's hardware is (``device_of(s)``) and prices what changes the cost. Each
``auto`` becomes what is best there; an explicit choice that cannot run there is a one-line
``ValueError`` naming the field, why, and the fix.

    from scenarios.execution import resolve
    run = resolve(scenario, "cuda")
    run.attention_kernel, run.cuda_graphs, run.token_bucket     # 'triton', True, 8192
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from scenarios.schema import BlockKind, FlashOptions, GEMModel, NonNeg, Scenario, Section

Device = Literal["cpu", "cuda"]
DEFAULT_TOKEN_BUCKET = 8192  # ids: static-shape batches for CUDA graphs (executor.data.Batch.pack)


class ResolvedExecution(Section):
    """Every execution choice, concrete (no ``auto``): what a run did, as its RunRecord stores it."""

    device: Device
    attention_kernel: Literal["triton", "reference"]
    attention_in_graph: bool
    embedding_kernel: Literal["triton", "torch"]
    ffn_kernel: Literal["triton", "torch", "cublaslt"]
    compile: bool
    max_autotune: list[BlockKind] = Field(default_factory=list)
    cuda_graphs: bool
    token_bucket: NonNeg
    fused_sparse_update: bool
    data_processes: bool
    flash: FlashOptions = Field(default_factory=FlashOptions)


def device_of(s: Scenario) -> Device:
    """The device the twin prices: the ``cpu`` entries (``cpu``, ``cpu-rank8``, ``cpu/4``: shared by
    processes) and a probe profile (``probe:PATH``, written by ``gemtwin hw probe`` on a CPU) are a
    CPU, every other catalog entry a GPU."""
    gpu = s.hardware.gpu
    cpu = gpu.split("/")[0] in ("cpu", "cpu-rank8") or gpu.startswith("probe:")
    return "cpu" if cpu else "cuda"


def resolve(s: Scenario, device: Device, *, world_size: int = 1) -> ResolvedExecution:
    """``s.execution`` on ``device``, every ``auto`` decided; ``ValueError`` for what cannot run there.
    ``world_size``: the executor's ranks (the twin prices the scenario as if each were alone)."""
    e = s.execution
    if e.device != "auto" and e.device != device:
        raise ValueError(f"execution.device is {e.device!r} but this run is on {device}; "
                         "set execution.device: auto, or run where that device is")
    cuda = device == "cuda"
    kernels = {name: _kernel(name, getattr(e, name), cuda) for name in ("attention_kernel", "embedding_kernel")}
    kernels["ffn_kernel"] = _ffn_kernel(s, e.ffn_kernel, cuda)
    compile_ = cuda if e.compile == "auto" else e.compile
    fused = _fused_sparse_update(s, kernels["embedding_kernel"], world_size)
    graphs = _cuda_graphs(s, cuda, kernels, fused)
    bucket = (DEFAULT_TOKEN_BUCKET if graphs else 0) if e.token_bucket == "auto" else e.token_bucket
    if graphs and not bucket:
        raise ValueError("execution.cuda_graphs needs static-shape batches: execution.token_bucket must be "
                         f"> 0 ids (auto: {DEFAULT_TOKEN_BUCKET})")
    return ResolvedExecution(device=device, **kernels, attention_in_graph=e.attention_in_graph,
                             compile=compile_, max_autotune=list(e.max_autotune), cuda_graphs=graphs,
                             token_bucket=bucket, fused_sparse_update=fused, data_processes=e.data_processes,
                             flash=e.flash)  # fmt: skip


_AUTO_KERNEL = {"attention_kernel": ("triton", "reference"), "embedding_kernel": ("triton", "torch")}  # (on CUDA, on CPU)


def _kernel(name: str, choice: str, cuda: bool) -> str:
    on_cuda, on_cpu = _AUTO_KERNEL[name]
    return (on_cuda if cuda else on_cpu) if choice == "auto" else choice


def _ffn_kernel(s: Scenario, choice: str, cuda: bool) -> str:
    """The sequence FFN's activation kernel: the Triton op computes exact GELU, cuBLASLt's epilogues
    the tanh approximation (``model.sequence.ffn_activation``), torch either."""
    tanh = isinstance(s.model, GEMModel) and s.model.sequence.ffn_activation == "gelu_tanh"
    if choice == "auto":
        return ("cublaslt" if tanh else "triton") if cuda else "torch"
    if choice == "triton" and tanh:
        raise ValueError("execution.ffn_kernel triton computes exact GELU, but model.sequence.ffn_activation is "
                         "gelu_tanh; set ffn_kernel to cublaslt, torch or auto")
    if choice == "cublaslt" and not tanh:
        raise ValueError("execution.ffn_kernel cublaslt applies cuBLASLt's tanh GELU; set "
                         "model.sequence.ffn_activation: gelu_tanh, or ffn_kernel to triton, torch or auto")
    if choice == "cublaslt" and not cuda:
        raise ValueError("execution.ffn_kernel cublaslt needs CUDA (cuBLASLt); set ffn_kernel to torch or auto on CPU")
    return choice


def _fused_sparse_update(s: Scenario, embedding_kernel: str, world_size: int) -> bool:
    """Exact where every lookup runs on the Triton kernels, a step is one micro-batch (the fused
    update runs once per backward) and the run is one process: the executor's ranks replicate the
    tables for now and average their gradients after the backward (``executor.replicated``)."""
    exact = embedding_kernel == "triton" and max(s.grad_accum, 1) == 1 and world_size == 1
    wanted = s.execution.fused_sparse_update
    if wanted == "auto":
        return exact
    if wanted and not exact:
        raise ValueError("execution.fused_sparse_update needs the Triton embedding lookups, one "
                         "micro-batch per step (training.global_batch = micro_batch × num_gpus) and one "
                         "process (several ranks replicate the tables and average their gradients after the "
                         "backward); set it to auto or false")
    return wanted


def _cuda_graphs(s: Scenario, cuda: bool, kernels: dict[str, str], fused: bool) -> bool:
    why = _why_no_graphs(s, cuda, kernels, fused)
    wanted = s.execution.cuda_graphs
    if wanted == "auto":
        return not why
    if wanted and why:
        raise ValueError(f"execution.cuda_graphs: {why}; set it to auto or false")
    return wanted


def _why_no_graphs(s: Scenario, cuda: bool, kernels: dict[str, str], fused: bool) -> str:
    """Why a step cannot be captured in a CUDA graph here ('' when it can)."""
    p = s.precision
    moe = isinstance(s.model, GEMModel) and s.model.moe.num_experts > 0
    if not cuda:
        return "they need CUDA"
    if kernels["embedding_kernel"] != "triton":
        return "they need the Triton embedding lookups"
    if kernels["attention_kernel"] != "triton":
        return "they need the Triton attention kernels"
    if not fused:
        return "they need the sparse update fused into the backward (no host sync)"
    if "mxfp8" in (p.mlp, p.attention):
        return "MXFP8 layers check their error on the host"
    if moe and p.mlp not in ("bf16", "fp8_block", "auto"):  # fp8_block leaves the experts in bf16
        return "the MoE's per-expert loop syncs with the host (its grouped matmuls need precision.mlp bf16)"
    return ""
