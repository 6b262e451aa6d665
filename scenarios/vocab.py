"""The shared vocabulary of both sides: op classes, kernel kinds, attention kinds and GDPA's
activations, mesh axes.

Torch-free and at the bottom of the dependency order (``scenarios`` ← ``hwmodels`` ←
``kernels/*/cost.py`` ← ``twin``; ``executor`` imports anything), so that the twin, the cost
models and the executor spell each concept once. Every enum is a ``StrEnum``: a member *is* its
string (``OpClass.GEMM == "gemm"``, ``f"{OpClass.GEMM}"`` is ``gemm``, JSON writes ``"gemm"``,
a dict keyed by strings finds it), so files and printed output read as before.

Kernel kinds and attention kinds are built and taken apart here only (``kernel_kind``,
``attention_label``, ``attention_of``): nothing else splits ``"attention.gdpa.fwd"``.
"""

from __future__ import annotations

from enum import StrEnum


class OpClass(StrEnum):
    """What an op is, as breakdowns, calibration scales and the profiler's classes name it."""

    GEMM = "gemm"
    ATTENTION = "attention"
    EMBEDDING = "embedding"
    ELEMENTWISE = "elementwise"
    NORM = "norm"
    QUANTIZE = "quantize"
    OPTIMIZER = "optimizer"
    OTHER = "other"


OP_CLASSES: tuple[OpClass, ...] = tuple(OpClass)
TENSOR_CORE_CLASSES: tuple[OpClass, ...] = (OpClass.GEMM, OpClass.ATTENTION)


class AttentionKind(StrEnum):
    """Attention kernels the cost model knows: ``sdpa`` dense softmax (the benchmarks' anchor),
    ``jfa``, ``gdpa`` and ``block`` over a jagged sequence, ``asym`` a long side against a short one."""

    SDPA = "sdpa"
    JFA = "jfa"
    GDPA = "gdpa"
    BLOCK = "block"
    ASYM = "asym"


_ATTENTION_KINDS = frozenset(k.value for k in AttentionKind)

#: GDPA's element-wise activations (``model.sequence.gdpa_activation``; ``gelu`` is its tanh form),
#: in the order of the Triton kernels' weight codes (``kernels/flash/options.py``: softmax is 0,
#: then these). The kernels' torch functions for them: ``kernels/attention/reference.py``.
ACTIVATIONS: tuple[str, ...] = ("silu", "gelu", "relu", "relu2", "identity")


class Direction(StrEnum):
    """A kernel's direction: the forward or the backward one."""

    FWD = "fwd"
    BWD = "bwd"


class Phase(StrEnum):
    """Where in a training step an op runs (the twin's ``Op.phase``)."""

    DATA = "data"  # input movement for the next micro-batch
    FWD = "fwd"
    BWD = "bwd"
    OPT = "opt"  # the optimizer step


class KernelKind(StrEnum):
    """The cost model's kernel kinds (``hwmodels/data/efficiency.yaml`` has a curve for each):
    finer than the op class where forward and backward kernels differ (attention, lookups)."""

    GEMM = "gemm"
    ATTENTION_SDPA_FWD = "attention.sdpa.fwd"
    ATTENTION_SDPA_BWD = "attention.sdpa.bwd"
    ATTENTION_JFA_FWD = "attention.jfa.fwd"
    ATTENTION_JFA_BWD = "attention.jfa.bwd"
    ATTENTION_GDPA_FWD = "attention.gdpa.fwd"
    ATTENTION_GDPA_BWD = "attention.gdpa.bwd"
    ATTENTION_BLOCK_FWD = "attention.block.fwd"
    ATTENTION_BLOCK_BWD = "attention.block.bwd"
    ATTENTION_ASYM_FWD = "attention.asym.fwd"
    ATTENTION_ASYM_BWD = "attention.asym.bwd"
    EMBEDDING_FWD = "embedding.fwd"
    EMBEDDING_BWD = "embedding.bwd"
    ELEMENTWISE = "elementwise"
    NORM = "norm"
    QUANTIZE = "quantize"
    OPTIMIZER = "optimizer"
    OTHER = "other"

    @property
    def op_class(self) -> OpClass:
        return OpClass(self.value.split(".", 1)[0])

    @property
    def attention(self) -> AttentionKind | None:
        """The attention kind of an attention kernel, else None."""
        return attention_of(self.value)

    @property
    def tensor_core(self) -> bool:
        return self.op_class in TENSOR_CORE_CLASSES


_DIRECTED = (OpClass.ATTENTION, OpClass.EMBEDDING)  # classes with forward and backward curves


def kernel_kind(op_class: OpClass | str, *, attention: AttentionKind | str | None = None,
                direction: Direction | str = Direction.FWD) -> KernelKind:
    """The kernel kind of an op: attention and lookups have one per direction, the rest one."""
    op_class = OpClass(op_class)
    if op_class not in _DIRECTED:
        return KernelKind(op_class.value)
    head = attention_label(attention) if op_class is OpClass.ATTENTION else op_class.value
    return KernelKind(f"{head}.{Direction(direction)}")


def attention_label(kind: AttentionKind | str) -> str:
    """``attention.<kind>``: how ops, profiler regions and run records name one attention kind
    (both directions together)."""
    return f"{OpClass.ATTENTION}.{AttentionKind(kind)}"


def attention_of(label: str) -> AttentionKind | None:
    """The attention kind in ``attention.<kind>`` or ``attention.<kind>.<direction>``; None for
    any other label (an op class, ``embedding.fwd``, a profiler region of another name)."""
    head, _, rest = label.partition(".")
    kind = rest.partition(".")[0]
    if head != OpClass.ATTENTION or kind not in _ATTENTION_KINDS:
        return None
    return AttentionKind(kind)


def is_attention_label(label: str) -> bool:
    return attention_of(label) is not None


class MeshAxis(StrEnum):
    """The five device-mesh axes (DESIGN rule 7): HSDP's replicate × shard for dense parameters,
    expert parallelism, and 2D embedding parallelism (sharding group × its replicas)."""

    DENSE_REPLICATE = "dense_replicate"
    DENSE_SHARD = "dense_shard"
    EXPERT = "expert"
    SPARSE_SHARD = "sparse_shard"
    SPARSE_REPLICA = "sparse_replica"


MESH_AXES: tuple[MeshAxis, ...] = tuple(MeshAxis)

# The groups collectives run over: each mesh axis, and two derived groups. ``expert_replicate``:
# the ranks that hold the same experts (every ``expert``-th rank, num_gpus / expert of them),
# over which expert gradients are all-reduced. It is the complement of ``expert`` in the world,
# not an axis of its own (torchtitan builds it as the data-parallel mesh of the experts).
# ``sparse_world``: the whole sparse mesh, ``sparse_shard × sparse_replica`` (every rank), which
# holds the tables' hot rows whole (``TableFamily.hot_rows``) and all-reduces their gradients.
CommGroup = StrEnum("CommGroup", {**{a.name: a.value for a in MeshAxis},
                                  "EXPERT_REPLICATE": "expert_replicate", "SPARSE_WORLD": "sparse_world"})  # fmt: skip
CommGroup.__doc__ = "A collective's rank group: a mesh axis, or the derived expert_replicate or sparse_world."
COMM_GROUPS: tuple[StrEnum, ...] = tuple(CommGroup)


class CollectiveKind(StrEnum):
    """Collectives in the nccl-tests convention (``hwmodels.collectives`` says what msg_bytes means)."""

    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    SEND_RECV = "send_recv"


COLLECTIVE_KINDS: tuple[CollectiveKind, ...] = tuple(CollectiveKind)


class LayerKind(StrEnum):
    """What a layer of the model is (``scenarios.placement``; ``executor/MODEL.md`` has each)."""

    BOTTOM = "bottom"  # the dense features' MLP
    EMBEDDINGS = "embeddings"  # every table, pooled and sequence
    POOLED_PROJ = "pooled_proj"  # a pooled family's Linear(dim→d)
    SEQ_IN = "seq_in"  # a sequence group's Linear(D_g→d)
    COMPRESS = "compress"  # input compression W_in
    SEQUENCE = "sequence"  # a transformer layer over the jagged sequence
    NONSEQUENCE = "nonsequence"  # a Wukong layer (FMB + LCB + FFN or MoE)
    CROSS = "cross"  # an InterFormer exchange, both directions
    INTERACTION = "interaction"  # DLRM's dot interaction (no parameters)
    DCN = "dcn"  # a DLRM DCNv2 cross layer
    TOP = "top"  # the top MLP (DLRM)
    HEAD = "head"  # GEM: the top MLP and the task heads; DLRM: the task heads


class ParamKind(StrEnum):
    """How a parameter is placed: dense (HSDP over dense_replicate × dense_shard), expert (whole
    experts over expert, replicated over expert_replicate) or sparse (tables, 2D over
    sparse_shard × sparse_replica)."""

    DENSE = "dense"
    EXPERT = "expert"
    SPARSE = "sparse"
