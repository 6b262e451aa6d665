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
5. **sharding** (``parallelism``): the five mesh axes. At world size 1 there is nothing to shard;
   the 5D executor (next issue) applies FSDP2, expert parallelism and 2D embedding parallelism
   here, reading the placements the twin reads.

``build(scenario, run)`` is ``build_model`` followed by steps 1–3 (what tests and benchmarks
that do not compile need); ``parallelize`` is all five.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from executor.attention import ATTENTION_KERNELS
from executor.embeddings import _FusedTableModule
from executor.model import CrossLayer, GEMModule, NonSequenceLayer, SequenceLayer, build_model
from kernels.attention.spec import FlashOptions
from scenarios.execution import ResolvedExecution
from scenarios.placement import LayerPlacement, placements
from scenarios.schema import Execution, Precision, Scenario
from scenarios.vocab import ParamKind

EMBEDDING_KERNELS = ("auto", "triton", "torch")
FFN_KERNELS = ("auto", "triton", "torch")
CHECKPOINTING = ("none", "selective", "full")


@dataclass
class Applied:
    """What ``parallelize`` did: the resolved execution and the compiled blocks' names."""

    run: ResolvedExecution
    compiled: list[str] = field(default_factory=list)
    mxfp8_linears: list[str] = field(default_factory=list)
    layers: dict[str, dict[ParamKind, list[str]]] = field(default_factory=dict)  # placement -> parameter names


def parallelize(model: nn.Module, scenario: Scenario, run: ResolvedExecution) -> Applied:
    """Steps 1–5 of the module docstring, in place; the model must already be on its device."""
    applied = Applied(run)
    apply_kernels(model, run)
    applied.mxfp8_linears = apply_precision(model, scenario.precision)
    apply_checkpointing(model, scenario.parallelism.activation_checkpointing)
    if run.compile:
        applied.compiled = compile_dense(model, max_autotune=run.max_autotune)
    applied.layers = apply_sharding(model, scenario)
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
    """Every sequence layer's FFN bias + GELU: auto, triton (``kernels.ffn.bias_gelu``) or torch."""
    _check("ffn kernel", kind, FFN_KERNELS)
    for mod in model.modules():
        if isinstance(mod, SequenceLayer):
            mod.ffn_kernel = kind


def _check(what: str, kind: str, choices: tuple[str, ...]) -> None:
    if kind not in choices:
        raise ValueError(f"{what} '{kind}': use {', '.join(choices[:-1])} or {choices[-1]}")


# ---- 2. precision --------------------------------------------------------------------------
def apply_precision(model: nn.Module, precision: Precision) -> list[str]:
    """bf16 embedding tables; MXFP8 linears and GDPA. Returns the names of the MXFP8 linears."""
    if precision.embeddings == "bf16":
        for mod in model.modules():
            if isinstance(mod, _FusedTableModule):
                mod.cast_tables(torch.bfloat16)
    for mod in model.modules():
        if isinstance(mod, SequenceLayer):
            mod.mxfp8 = precision.attention == "mxfp8" and mod.cfg.attention == "gdpa"
    if precision.mlp != "mxfp8":
        return []
    from kernels.mxfp8.linear import convert

    return convert(model, skip=lambda name, lin: name.startswith("heads.") or name.endswith(".router"))


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
BLOCK_KINDS = ("sequence", "nonsequence", "cross", "mlp")


def compile_dense(model: nn.Module, *, max_autotune: list[str] = (), mode: str | None = None) -> list[str]:
    """``torch.compile`` every dense block of ``model`` (sequence, non-sequence and cross layers,
    bottom and top MLPs), in place; returns the names of the compiled modules.

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
    return "mlp" if name in ("bottom", "top") else None


# ---- 5. sharding ---------------------------------------------------------------------------
def apply_sharding(model: nn.Module, scenario: Scenario) -> dict[str, dict[ParamKind, list[str]]]:
    """The five mesh axes of ``scenario.parallelism``, laid out as ``scenarios.placement`` declares
    them (the data the twin's workload builder reads). Returns each layer's parameter names by
    kind: the units the 5D executor (next issue) shards. The executor runs one process today, so
    there is nothing to shard: a multi-GPU scenario trains one rank's share of each step (its
    micro-batches, ``Scenario.grad_accum`` of them) without communication."""
    return claim_parameters(model, placements(scenario))


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
