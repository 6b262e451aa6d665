"""How a run executes the single-device model, applied from outside in one documented order.

    model = build_model(scenario).to(device)          # executor/model.py: the architecture
    run = resolve(scenario, device.type)              # scenarios/execution.py: execution, concrete
    applied = parallelize(model, scenario, run)       # this file

The order is torchtitan's, and each step only sets what the Scenario says:

1. **kernel choice** (``execution``): attention (Triton or the reference, inside the compiled
   graph or not, the flash variants), embedding lookups (Triton table-batched or torch), the
   sequence FFN's bias + GELU (one Triton op or torch);
2. **precision** (``precision``): embedding tables stored in bf16; ``mlp: mxfp8`` swaps the
   ``nn.Linear`` layers (not the task heads, not the MoE router) for ``MXFP8Linear``;
   ``attention: mxfp8`` runs GDPA's matmuls in MXFP8;
3. **activation checkpointing** (``parallelism.activation_checkpointing``);
4. **compile** (``execution.compile``, ``execution.max_autotune``): ``torch.compile`` per dense
   block, after the swaps so that the graphs trace what runs;
5. **sharding** (``parallelism``, over the run's ``executor.mesh.Mesh``): the five mesh axes, read
   from the placements the twin reads. At world size 1 there is nothing to shard. The embedding
   tables are sharded 2D over ``sparse_shard × sparse_replica`` (``executor.sharded_tables``);
   with ``parallelism.expert`` > 1 each rank keeps its ``expert`` group position's experts, reached
   by a capacity-padded all-to-all, and FSDP2 shards them over ``expert_replicate``
   (``executor.expert_parallel``: before the layers' units, so that those leave them out); the
   dense parameters are FSDP2 units over ``dense_replicate × dense_shard`` (HSDP). Experts with
   ``expert`` 1 and data-parallel tables are replicated and their gradients averaged
   (``executor.replicated``).

``build(scenario, run)`` is ``build_model`` followed by steps 1–3 (what tests and benchmarks
that do not compile need); ``parallelize`` is all five.
"""

from __future__ import annotations

import warnings
from typing import get_args
from dataclasses import dataclass, field

import torch
from torch import nn

from executor.attention import ATTENTION_KERNELS
from executor.collectives import fsdp_symmetric_buffers
from executor.embeddings import _FusedTableModule
from executor.expert_parallel import shard_experts
from executor.mesh import Mesh
from executor.model import CrossLayer, DCNMix, GEMModule, NonSequenceLayer, SequenceLayer, build_model
from executor.moe import GroupedExperts
from executor.optim import DisjointParams
from executor.replicated import ReplicatedGrads
from executor.sharded_tables import ShardedTables, shard_tables
from kernels.attention.spec import FlashOptions
from scenarios.execution import ResolvedExecution
from scenarios.placement import LayerPlacement, placements
from scenarios.schema import (
    BlockKind, Checkpointing, EmbeddingKernel, Execution, FfnKernel, Precision, Scenario,
)
from scenarios.vocab import CommGroup, ParamKind

EMBEDDING_KERNELS = get_args(EmbeddingKernel)
FFN_KERNELS = get_args(FfnKernel)
CHECKPOINTING = get_args(Checkpointing)


@dataclass
class Applied:
    """What ``parallelize`` did: the resolved execution and the compiled blocks' names."""

    run: ResolvedExecution
    compiled: list[str] = field(default_factory=list)
    mxfp8_linears: list[str] = field(default_factory=list)
    sharding: Sharding | None = None


def parallelize(model: nn.Module, scenario: Scenario, run: ResolvedExecution, mesh: Mesh | None = None) -> Applied:
    """Steps 1–5 of the module docstring, in place; the model must already be on its device.
    ``mesh``: the run's device mesh (``executor.mesh.build_mesh``); None at world size 1."""
    applied = Applied(run)
    apply_kernels(model, run)
    applied.mxfp8_linears = apply_precision(model, scenario.precision)
    apply_checkpointing(model, scenario.parallelism.activation_checkpointing)
    if run.compile:
        applied.compiled = compile_dense(model, max_autotune=run.max_autotune)
    applied.sharding = apply_sharding(model, scenario, mesh)
    return applied


def build(scenario: Scenario, run: ResolvedExecution | None = None) -> nn.Module:
    """``build_model`` with steps 1–3 applied (no compile, no sharding): the model a test runs.
    Without ``run`` the kernels are ``scenario.execution``'s as written (``auto`` stays auto: the
    layers decide by the device of their inputs)."""
    model = build_model(scenario)
    apply_kernels(model, run or scenario.execution)
    apply_precision(model, scenario.precision)
    apply_checkpointing(model, scenario.parallelism.activation_checkpointing)
    return model


# ---- 1. kernel choice ----------------------------------------------------------------------
def apply_kernels(model: nn.Module, run: ResolvedExecution | Execution) -> None:
    """The attention, embedding and FFN kernels of ``run`` (resolved, or as a Scenario writes them)."""
    set_attention_kernel(model, run.attention_kernel, in_graph=run.attention_in_graph, flash=run.flash)
    set_embedding_kernel(model, run.embedding_kernel)
    set_ffn_kernel(model, run.ffn_kernel)


def set_attention_kernel(model: nn.Module, kind: str, *, in_graph: bool = True, flash=None) -> None:
    """Every sequence and cross layer's attention: auto, triton or reference (``executor.attention``),
    inside the compiled graph or not, and the Triton core's variants (``flash``: the Scenario's
    ``execution.flash``; None: the core's defaults)."""
    _check("attention kernel", kind, ATTENTION_KERNELS)
    options = FlashOptions.of(flash)
    for mod in model.modules():
        if isinstance(mod, (SequenceLayer, CrossLayer)):
            mod.attention_kernel, mod.attention_in_graph, mod.flash = kind, in_graph, options


def set_embedding_kernel(model: nn.Module, kind: str) -> None:
    """Every table module's lookups: auto, triton or torch."""
    _check("embedding kernel", kind, EMBEDDING_KERNELS)
    for mod in model.modules():
        if isinstance(mod, _FusedTableModule):
            mod.kernel = kind


def set_ffn_kernel(model: nn.Module, kind: str) -> None:
    """Every sequence layer's FFN bias + GELU: auto, triton (``kernels.ffn.bias_gelu``), torch or
    cublaslt (``kernels.ffn.epilogue``: the tanh GELU of ``model.sequence.ffn_activation: gelu_tanh``)."""
    _check("ffn kernel", kind, FFN_KERNELS)
    for mod in model.modules():
        if isinstance(mod, SequenceLayer):
            mod.ffn_kernel = kind


def _check(what: str, kind: str, choices: tuple[str, ...]) -> None:
    if kind not in choices:
        raise ValueError(f"{what} '{kind}': use {', '.join(choices[:-1])} or {choices[-1]}")


# ---- 2. precision --------------------------------------------------------------------------
def apply_precision(model: nn.Module, precision: Precision) -> list[str]:
    """bf16 embedding tables; MXFP8 linears and GDPA; blockwise-fp8 linears (``fp8_block``: every
    eligible one; ``auto``: each decides at its first forward from the measured table). Returns the
    names of the converted linears."""
    if precision.embeddings == "bf16":
        for mod in model.modules():
            if isinstance(mod, _FusedTableModule):
                mod.cast_tables(torch.bfloat16)
    for mod in model.modules():
        if isinstance(mod, SequenceLayer):
            mod.mxfp8 = precision.attention == "mxfp8" and mod.cfg.attention == "gdpa"
    heads_or_router = lambda name, lin: name.startswith("heads.") or name.endswith(".router")  # noqa: E731
    if precision.mlp in ("fp8_block", "auto"):
        from kernels.fp8block.linear import convert as convert_fp8_block

        return convert_fp8_block(model, choose=lambda name, lin: not heads_or_router(name, lin),
                                 auto=precision.mlp == "auto")
    if precision.mlp != "mxfp8":
        return []
    from kernels.mxfp8.linear import convert

    return convert(model, skip=heads_or_router)


# ---- 3. activation checkpointing -----------------------------------------------------------
def apply_checkpointing(model: nn.Module, policy: str) -> None:
    """``parallelism.activation_checkpointing``, as the twin prices it (``twin/memory.py``):
    ``none`` keeps every activation; ``selective`` keeps q, k, v and recomputes each attention
    (self and cross) in backward where its backward needs the forward output (not GDPA's on the
    Triton kernels); ``full`` keeps each sequence, non-sequence and cross layer's inputs only and
    recomputes the layer in backward. The input side (embeddings, bottom MLP, compression) and
    the top are never checkpointed, as in the twin. A DLRM has nothing to checkpoint."""
    _check("activation_checkpointing", policy, CHECKPOINTING)
    if not isinstance(model, GEMModule):
        return
    model.checkpointing = policy
    for mod in model.modules():
        if isinstance(mod, (SequenceLayer, CrossLayer)):
            mod.recompute_attention = policy == "selective"


# ---- 4. compile ----------------------------------------------------------------------------
BLOCK_KINDS = get_args(BlockKind)


def compile_dense(model: nn.Module, *, max_autotune: list[str] = (), mode: str | None = None) -> list[str]:
    """``torch.compile`` every dense block of ``model`` (sequence, non-sequence and cross layers,
    bottom and top MLPs, the DCN's element-wise mixes), in place; returns the names of the compiled
    modules.

    Dynamic shapes (ΣL changes with every batch), so one graph serves all batches. The Triton
    attention is a torch.library op that the graphs call like any kernel, so a layer is one graph
    forward and one backward; the reference and MXFP8 attention (which sync with the host) and
    the embedding lookups stay eager between graphs. What compiling buys is fusion of the norms,
    activations, casts and residual adds around the matmuls and the attention (and of their
    gradients). Blocks of a kind in ``max_autotune`` compile with ``max-autotune-no-cudagraphs``,
    so that Inductor may pick its Triton GEMM templates and fuse the pointwise work around a
    matmul into the GEMM's epilogue (autotuning costs compile time)."""
    for kind in max_autotune:
        _check("execution.max_autotune block kind", kind, BLOCK_KINDS)
    names = []
    for name, mod in model.named_modules():
        kind = _block_kind(name, mod)
        if kind is not None:
            mod.compile(dynamic=True, mode="max-autotune-no-cudagraphs" if kind in max_autotune else mode)
            names.append(name)
    return names


def _block_kind(name: str, mod: nn.Module) -> str | None:
    if isinstance(mod, SequenceLayer):
        return "sequence"
    if isinstance(mod, NonSequenceLayer):
        return "nonsequence"
    if isinstance(mod, CrossLayer):
        return "cross"
    return "mlp" if name in ("bottom", "top") or isinstance(mod, DCNMix) else None


# ---- 5. sharding ---------------------------------------------------------------------------
@dataclass
class Sharding:
    """What step 5 did: each layer's parameter names by kind (the placements' claim), the FSDP
    units it made (placement layer names, in forward order; the root last, as ``"root"``), the
    replicated parameters whose gradients the step averages over the world, the sharded embedding
    tables (both None at world size 1), and the expert-parallel experts, each rank's own (None
    without expert parallelism)."""

    layers: dict[str, dict[ParamKind, list[str]]]
    fsdp_units: list[str] = field(default_factory=list)
    replicated: ReplicatedGrads | None = None
    # each FSDP2 module's fqn (as FSDP2 names it in its profiler ranges; the root "") -> the axes
    # of its (all-gathers and reduce-scatters, all-reduce): what executor.comm_profile files them under
    fsdp_axes: dict[str, tuple[str, str]] = field(default_factory=dict)
    experts: DisjointParams | None = None
    tables: ShardedTables | None = None  # the sharded embedding tables (executor.sharded_tables)
    torchrec: object = None  # the pooled tables under sparse_backend torchrec (executor.torchrec_tables)

    @property
    def table_backends(self) -> list:
        """What shards the tables, each with the step's interface (``begin``, ``start``, ``attach``,
        ``reduce``, ``after_step``): the native backend, and TorchRec for the pooled tables."""
        return [t for t in (self.torchrec, self.tables) if t is not None]


def apply_sharding(model: nn.Module, scenario: Scenario, mesh: Mesh | None = None) -> Sharding:
    """The five mesh axes of ``scenario.parallelism``, laid out as ``scenarios.placement`` declares
    them (the data the twin's workload builder reads). Without ``mesh`` (world size 1) nothing is
    sharded: a multi-GPU scenario then trains one rank's share of each step (its micro-batches,
    ``Scenario.grad_accum`` of them) without communication.

    With a mesh, the **embedding tables** are sharded 2D over ``sparse_shard × sparse_replica``
    (``executor.sharded_tables``, the ``native`` backend: the twin's table plan, ids and outputs
    all-to-all'd, replicas fully sharded or synced; data-parallel tables stay whole); the
    **experts**, with ``parallelism.expert`` > 1, are each rank's share, its tokens all-to-all'd to
    them, FSDP2 over ``expert_replicate`` (``executor.expert_parallel.shard_experts``); then the
    **dense** parameters are sharded with FSDP2 over ``dense_replicate × dense_shard`` (HSDP;
    ``shard_dense``), each layer's unit leaving the experts and tables out. Experts with ``expert``
    1 and data-parallel tables stay whole on every rank, their gradients averaged over the world
    after the backward (``executor.replicated``: plain data parallelism, exact).

    With ``parallelism.sparse_backend: torchrec`` the pooled tables are TorchRec's instead
    (``executor.torchrec_tables``: its sharded EmbeddingBagCollection and fused row-wise Adagrad,
    built from the same plan, handed over once the dense units are made); the sequence tables,
    which that backend does not shard (TorchRec's EmbeddingCollection is not wired), stay native."""
    layers = claim_parameters(model, placements(scenario))
    if mesh is None:
        return Sharding(layers)
    trec = None
    if scenario.parallelism.sparse_backend == "torchrec":  # the pooled tables, while they are still whole
        from executor.torchrec_tables import shard_pooled_torchrec

        trec = shard_pooled_torchrec(model, scenario, mesh["sparse_shard"].get_group())
    # the table weights become this rank's shards (the pooled ones TorchRec's, under torchrec)
    sharded = shard_tables(model, scenario, mesh, skip=(model.pooled,) if trec else ())
    parallel_experts = shard_experts(model, scenario, mesh)  # before the layers' units: they ignore them
    params = dict(model.named_parameters())
    kind_of = {n: kind for kinds in layers.values() for kind, names in kinds.items() for n in names}
    experts = [params[n] for n, k in kind_of.items() if k == ParamKind.EXPERT]
    tables = [params[n] for n, k in kind_of.items() if k == ParamKind.SPARSE]
    handed = {id(t.weight) for t in model.pooled.tables.values()} if trec else set()  # TorchRec trains these
    data_tables = [p for p in tables if not any(p is q for q in sharded.params) and id(p) not in handed]
    units = shard_dense(model, scenario, mesh, ignored={*experts, *tables})
    replicated = [] if parallel_experts else experts
    if trec is not None:
        from executor.torchrec_tables import hand_over

        hand_over(model, trec)
    return Sharding(layers, units, ReplicatedGrads(replicated, data_tables, mesh.world.get_group()), fsdp_axes(model),
                    parallel_experts, sharded, trec)  # fmt: skip


def fsdp_axes(model: nn.Module) -> dict[str, tuple[str, str]]:
    """Every FSDP2 module of ``model`` by fqn -> (its shard axis, its replicate axis): the dense
    units gather and reduce-scatter over ``dense_shard`` and all-reduce over ``dense_replicate``;
    the experts' units (expert parallelism) over ``expert_replicate``, with no all-reduce."""
    from torch.distributed.fsdp import FSDPModule

    dense = (str(CommGroup.DENSE_SHARD), str(CommGroup.DENSE_REPLICATE))
    experts = (str(CommGroup.EXPERT_REPLICATE),) * 2
    return {name: experts if isinstance(m, GroupedExperts) else dense
            for name, m in model.named_modules() if isinstance(m, FSDPModule)}  # fmt: skip


def shard_dense(model: nn.Module, scenario: Scenario, mesh: Mesh, *, ignored: set[nn.Parameter]) -> list[str]:
    """``fully_shard`` each placement layer's dense modules as one FSDP unit, in forward order (the
    twin's FSDP units: ``twin.workload`` gathers and reduces per placement layer), then the root,
    which holds what no module unit does (``W_in``). ``ignored`` (experts, tables) stays plain and
    whole. Each unit prefetches the all-gathers of the next ``parallelism.fsdp_prefetch`` units in
    forward and of the previous ones in backward; ``fsdp_reshard_after_forward`` frees a unit's
    gathered parameters after its forward (the root keeps them: its backward comes first)."""
    from torch.distributed.fsdp import fully_shard

    # FSDP2 warns that a Linear on a 3-D input returns a view, on which an in-place op would skip
    # its pre-backward hook; the model never writes into a layer's output (its adds are out of place)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    p = scenario.parallelism
    kw = dict(mesh=mesh.dense if p.dense_replicate > 1 else mesh["dense_shard"],
              mp_policy=mixed_precision(scenario.precision, mesh.world.device_type), ignored_params=ignored)  # fmt: skip
    units, names = [], []
    for layer, modules in dense_units(model, scenario, ignored):
        fully_shard(modules if len(modules) > 1 else modules[0], reshard_after_forward=p.fsdp_reshard_after_forward,
                    **kw)  # fmt: skip
        units.append(modules[0])  # a unit of several modules is driven through its first
        names.append(layer)
    fully_shard(model, **kw)
    backend = torch.distributed.get_backend(mesh.world.get_group())
    for m in (*units, model):
        fsdp_symmetric_buffers(m, scenario, backend)
    for i, unit in enumerate(units):
        k = p.fsdp_prefetch
        unit.set_modules_to_forward_prefetch(units[i + 1 : i + 1 + k])
        unit.set_modules_to_backward_prefetch(units[max(i - k, 0) : i][::-1])
    return [*names, "root"]


def dense_units(model: nn.Module, scenario: Scenario, ignored: set[nn.Parameter]) -> list[tuple[str, list[nn.Module]]]:
    """Each placement layer's dense modules (its ``Params.fqns`` that name a module holding dense
    parameters), in placement order; a prefix that names a parameter (``W_in``) stays with the root."""
    modules = dict(model.named_modules())
    out = []
    for lp in placements(scenario):
        named = [modules[f] for prm in lp.params if prm.kind == ParamKind.DENSE for f in prm.fqns if f in modules]
        mods = [m for m in _callables(named) if any(q not in ignored for q in m.parameters())]
        if mods:
            out.append((lp.layer, mods))
    return out


def _callables(modules: list[nn.Module]) -> list[nn.Module]:
    """``modules`` with each container (``ModuleDict``, ``ModuleList``: no forward, so no hooks
    FSDP could run) replaced by its children."""
    out = []
    for m in modules:
        out += _callables(list(m.children())) if type(m).forward is nn.Module.forward else [m]
    return out


def mixed_precision(precision: Precision, device_type: str):
    """FSDP2's policy from ``precision``: gradients reduced in ``precision.comm``; on CUDA,
    parameters all-gathered in bf16 where the MLPs compute in bf16 and collectives are bf16 (the
    twin prices the gathers in ``precision.comm``, and the gathered bf16 copy is the compute copy
    autocast would otherwise make). Inputs are not cast: autocast decides what each op computes in,
    as on one device, and the residual streams stay fp32. On the CPU the gathers stay fp32: CPU
    autocast runs LayerNorm in its input's dtype and refuses bf16 weights on an fp32 input (CUDA
    autocast runs it in fp32). An fp32 scenario (debug-cpu) runs exactly as on one process."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    comm = torch.bfloat16 if precision.comm == "bf16" else torch.float32
    bf16 = precision.mlp in ("bf16", "mxfp8", "fp8_block", "auto") and comm == torch.bfloat16 and device_type == "cuda"
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=comm,
                                cast_forward_inputs=False)  # fmt: skip


def claim_parameters(model: nn.Module, layers: list[LayerPlacement]) -> dict[str, dict[ParamKind, list[str]]]:
    """Each parameter of ``model`` under the layer and kind whose longest declared prefix names it.
    A parameter no placement names is an error: the twin would not count or move it."""
    prefixes = {f: (lp.layer, p.kind) for lp in layers for p in lp.params for f in p.fqns}
    out: dict[str, dict[ParamKind, list[str]]] = {lp.layer: {p.kind: [] for p in lp.params} for lp in layers}
    for name, _ in model.named_parameters():
        owner = max((f for f in prefixes if name == f or name.startswith(f + ".")), key=len, default=None)
        if owner is None:
            raise ValueError(f"parameter {name} is in no layer's placement: declare it in scenarios/placement.py")
        layer, kind = prefixes[owner]
        out[layer][kind].append(name)
    return out
