"""The one configuration object: ``Scenario`` and its sections.

Everything the twin and the executor do is driven by one frozen ``Scenario``. Each section is
its own model, so a function takes only the section it needs. Validation errors name the dotted
path, the value and the fix; ``scenarios.loader`` turns pydantic's errors into one line.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scenarios.distributions import LengthDist
from scenarios.vocab import ACTIVATIONS

Dtype = Literal["fp32", "bf16", "mxfp8"]
Sharding = Literal["table", "row", "column", "grid", "data"]
Activation = Literal[ACTIVATIONS]  # the names of scenarios.vocab (Literal[("a", "b")] is Literal["a", "b"])
Pos = Annotated[int, Field(gt=0)]
NonNeg = Annotated[int, Field(ge=0)]


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ---- sparse: embedding tables --------------------------------------------------------------
class TableFamily(Section):
    """``count`` tables of one shape, named ``{name}_0 .. {name}_{count-1}`` (or ``name`` if 1)."""

    name: str = Field(..., pattern=r"^[A-Za-z][A-Za-z0-9_]*$", description="Family name.")
    count: Pos = Field(1, description="Number of tables in the family.")
    rows: Pos = Field(..., description="Rows (hash size) of each table.")
    dim: Pos = Field(..., description="Embedding dimension of each table.")
    pooling: LengthDist = Field(
        default_factory=lambda: LengthDist(max=1),
        description="Ids per sample per table (pooling factor); per token for sequence tables.",
    )
    id_skew: float = Field(
        1.05, ge=0, description="Zipf exponent of the id popularity (0 = uniform ids)."
    )
    hot_rows: NonNeg = Field(
        0, description="Hot-row replication (hybrid embedding): the table's most popular rows, its lowest "
        "ids (ids are drawn hottest-first), kept data-parallel on every rank and their gradients all-reduced "
        "like dense parameters; the other rows sharded as the plan says. 0: none.")

    @model_validator(mode="after")
    def _hot_rows_fit(self) -> TableFamily:
        if self.hot_rows > self.rows:
            raise ValueError(f"hot_rows ({self.hot_rows}) must be <= rows ({self.rows}); lower hot_rows")
        return self

    def table_names(self) -> list[str]:
        return [self.name] if self.count == 1 else [f"{self.name}_{i}" for i in range(self.count)]

    @property
    def params(self) -> int:
        return self.count * self.rows * self.dim


class SequenceGroup(Section):
    """A jagged user-history sequence: per token, one sum-pooled lookup into each table."""

    name: str = Field(..., pattern=r"^[A-Za-z][A-Za-z0-9_]*$", description="Group name.")
    length: LengthDist = Field(..., description="Tokens per sample (jagged length).")
    tables: list[TableFamily] = Field(
        ..., min_length=1, description="Tables looked up for every token; their outputs concatenate."
    )

    @model_validator(mode="after")
    def _one_id_per_token(self) -> SequenceGroup:
        for fam in self.tables:
            if fam.pooling.max != 1 or fam.pooling.shape != "fixed":
                raise ValueError(
                    f"tables[{fam.name}].pooling must be fixed 1 (one id per token); "
                    "remove pooling from sequence tables"
                )
        return self


class Embeddings(Section):
    pooled: list[TableFamily] = Field(
        default_factory=list,
        description="Non-sequence features: one pooled (summed) lookup per table per sample.",
    )
    sequences: list[SequenceGroup] = Field(
        default_factory=list,
        description="Sequence features; groups concatenate into one jagged sequence per sample.",
    )

    def families(self) -> list[TableFamily]:
        return list(self.pooled) + [t for g in self.sequences for t in g.tables]


# ---- dense GEM components ------------------------------------------------------------------
class SequenceStack(Section):
    num_layers: NonNeg = Field(2, description="Transformer layers over the jagged sequence.")
    heads: Pos = Field(4, description="Attention heads.")
    head_dim: Literal[32, 64, 128] = Field(128, description="Dimension of each head.")
    attention: Literal["jfa", "gdpa", "block"] = Field(
        "jfa", description="jfa: softmax; gdpa: act(QK^T)*scale, no softmax; block: softmax in blocks."
    )
    gdpa_activation: Activation = Field("silu", description="GDPA's element-wise activation.")
    causal: bool = Field(True, description="Causal mask inside the sequence (jfa, gdpa, block).")
    block_size: Pos = Field(64, description="Block length for attention 'block'.")
    ffn_mult: Pos = Field(4, description="MLP hidden = ffn_mult * d_model.")
    ffn_activation: Literal["gelu", "gelu_tanh"] = Field(
        "gelu", description="The sequence FFN's activation: exact GELU, or its tanh approximation "
        "(GELU(approximate='tanh'), within ~1e-3 of exact), which cuBLASLt can apply in its GEMM epilogues "
        "(execution.ffn_kernel: cublaslt).")


class NonSequenceStack(Section):
    """Wukong-style: factorization-machine block (FMB) + linear compression block (LCB)."""

    num_layers: NonNeg = Field(2, description="Wukong layers.")
    num_tokens: Pos = Field(16, description="Tokens kept per layer (input is compressed to this).")
    fm_tokens: Pos = Field(8, description="Tokens produced by the FMB; the LCB makes the rest.")
    fm_rank: Pos = Field(8, description="Rank k of the FM projection X (X^T Y), Y: tokens x k.")
    fm_mlp_hidden: Pos = Field(256, description="Hidden width of the FMB's MLP.")
    ffn_hidden: Pos = Field(512, description="Hidden width of the token FFN (when no MoE).")

    @model_validator(mode="after")
    def _tokens(self) -> NonSequenceStack:
        if self.fm_tokens >= self.num_tokens:
            raise ValueError(
                f"fm_tokens ({self.fm_tokens}) must be smaller than num_tokens "
                f"({self.num_tokens}): the linear compression block makes the rest"
            )
        return self


class CrossLayers(Section):
    """InterFormer-style exchange between the stacks, both directions, after evenly spaced stages."""

    num_layers: NonNeg = Field(1, description="Cross layers (each has both directions).")
    heads: Pos = Field(4, description="Heads of the cross attention.")
    head_dim: Literal[32, 64, 128] = Field(64, description="Head dimension of the cross attention.")


class MoE(Section):
    num_experts: NonNeg = Field(0, description="Experts per MoE layer; 0 disables MoE.")
    top_k: Pos = Field(2, description="Experts each token is routed to.")
    expert_hidden: Pos = Field(512, description="Hidden width of each expert MLP.")
    capacity_factor: float = Field(1.25, ge=1.0, description="Expert capacity over the mean load.")
    aux_loss_weight: float = Field(0.01, ge=0, description="Load-balancing loss weight.")

    @model_validator(mode="after")
    def _k(self) -> MoE:
        if self.num_experts and self.top_k > self.num_experts:
            raise ValueError(
                f"top_k ({self.top_k}) must not exceed num_experts ({self.num_experts})"
            )
        return self


class Tasks(Section):
    names: list[str] = Field(
        default_factory=lambda: ["click", "conversion"], min_length=1, description="Binary tasks."
    )
    mlp: list[Pos] = Field(default_factory=lambda: [256], description="Shared top MLP widths.")


class GEMModel(Section):
    kind: Literal["gem"] = "gem"
    d_model: Pos = Field(256, description="Token width shared by both stacks.")
    dense_features: Pos = Field(16, description="Float features per sample.")
    bottom_mlp: list[Pos] = Field(
        default_factory=lambda: [256],
        min_length=1,
        description="MLP on dense features; the last width must equal d_model.",
    )
    embeddings: Embeddings = Field(default_factory=Embeddings, description="Sparse tables.")
    sequence: SequenceStack = Field(default_factory=SequenceStack, description="Sequence stack.")
    nonseq: NonSequenceStack = Field(default_factory=NonSequenceStack, description="Wukong stack.")
    cross: CrossLayers = Field(default_factory=CrossLayers, description="InterFormer cross layers.")
    moe: MoE = Field(default_factory=MoE, description="Mixture of experts in the Wukong stack.")
    tasks: Tasks = Field(default_factory=Tasks, description="Task heads.")

    @model_validator(mode="after")
    def _shape(self) -> GEMModel:
        if self.bottom_mlp[-1] != self.d_model:
            raise ValueError(
                f"bottom_mlp[-1] ({self.bottom_mlp[-1]}) must equal d_model ({self.d_model}): "
                "the dense features become one token"
            )
        if not self.embeddings.sequences and self.sequence.num_layers:
            raise ValueError(
                f"sequence.num_layers ({self.sequence.num_layers}) needs at least one "
                "embeddings.sequences group; add one or set sequence.num_layers: 0"
            )
        if self.cross.num_layers > max(self.sequence.num_layers, self.nonseq.num_layers, 1):
            raise ValueError(
                f"cross.num_layers ({self.cross.num_layers}) must not exceed the number of "
                "stages (max of sequence.num_layers and nonseq.num_layers)"
            )
        if self.cross.num_layers and not self.embeddings.sequences:
            raise ValueError("cross.num_layers needs at least one embeddings.sequences group")
        return self


class DLRMModel(Section):
    """Classic DLRM: bottom MLP, pooled tables, dot or DCNv2 interaction, top MLP."""

    kind: Literal["dlrm"] = "dlrm"
    dense_features: Pos = Field(13, description="Float features per sample.")
    bottom_mlp: list[Pos] = Field(..., min_length=1, description="Bottom MLP widths (last = dim).")
    embeddings: Embeddings = Field(..., description="Pooled tables (no sequences in DLRM).")
    interaction: Literal["dot", "dcnv2"] = Field("dot", description="Feature interaction.")
    dcn_layers: NonNeg = Field(3, description="DCNv2 cross layers.")
    dcn_rank: Pos = Field(512, description="Low rank of each DCNv2 cross layer.")
    top_mlp: list[Pos] = Field(..., min_length=1, description="Top MLP widths.")
    tasks: Tasks = Field(default_factory=lambda: Tasks(names=["click"], mlp=[]))

    @model_validator(mode="after")
    def _dims(self) -> DLRMModel:
        if self.embeddings.sequences:
            raise ValueError("embeddings.sequences must be empty for a DLRM; use kind: gem")
        dim = self.bottom_mlp[-1]
        for fam in self.embeddings.pooled:
            if fam.dim != dim:
                raise ValueError(
                    f"embeddings.pooled[{fam.name}].dim ({fam.dim}) must equal the last "
                    f"bottom_mlp width ({dim}) for a DLRM interaction"
                )
        return self


Model = Annotated[Union[GEMModel, DLRMModel], Field(discriminator="kind")]


# ---- hardware, parallelism, precision, training -----------------------------------------------
class Hardware(Section):
    gpu: str = Field(..., description="GPU type, by catalog name (gemtwin hw list), or probe:PATH: the "
                     "machine measured by `gemtwin hw probe -o PATH` (its rates on the cpu entry's curves).")
    num_gpus: Pos = Field(..., description="GPUs in the job.")
    network: str = Field(..., description="Network preset name (hwmodels), or probe:PATH: the gloo "
                         "alpha/beta that `gemtwin hw probe -o PATH` fitted between local ranks.")
    mfu_peak_dtype: Literal["bf16", "fp8", "mxfp8", "fp32"] = Field(
        "bf16", description="Which dense peak MFU divides by (DESIGN rule 5: bf16 by default; fp32 for a "
        "scenario that computes in fp32 on hardware whose bf16 is slower, e.g. debug-cpu on the cpu)."
    )
    storage: str = Field("auto", description="Checkpoint store preset (hwmodels/data/storage.yaml): its "
                         "bandwidths price saving and restoring a checkpoint (twin.goodput). auto: local-disk "
                         "for the cpu entries, tectonic-llama3 (Meta's Tectonic, Llama 3 paper) otherwise.")
    failures: str = Field("auto", description="Failure-rate catalog (hwmodels/data/storage.yaml `failures`): "
                          "failures per GPU-hour that restart the job. auto: none for the cpu entries, "
                          "llama3-h100 (419 interruptions in 54 days on 16,384 H100s) otherwise.")
    restart_overhead_s: float | None = Field(None, ge=0, description="Seconds from a failure to training "
                                             "again, reading the checkpoint excluded (the twin adds that "
                                             "from hardware.storage). None: storage.yaml's default, 600 s, "
                                             "an assumption.")


Checkpointing = Literal["none", "selective", "full"]


class Parallelism(Section):
    dense_replicate: Pos = Field(1, description="HSDP replicas (all-reduce axis).")
    dense_shard: Pos = Field(1, description="HSDP shard group (FSDP all-gather/reduce-scatter).")
    expert: Pos = Field(1, description="Expert-parallel group size.")
    sparse_shard: Pos = Field(1, description="Embedding sharding group size.")
    sparse_replica: Pos = Field(1, description="Replicas of the embedding sharding group.")
    sparse_strategy: Literal["fully_sharded", "replicated_sync"] = Field(
        "fully_sharded", description="How embedding replicas stay in step."
    )
    sparse_sync_interval: Pos = Field(
        1, description="Steps between replica syncs (replicated_sync only)."
    )
    sparse_backend: Literal["native", "torchrec"] = Field(
        "native", description="Who runs the embedding plan in the executor: our own all-to-alls (native) or "
        "TorchRec's sharded EmbeddingBagCollection (torchrec: the pooled tables, table/column/data-wise on CPU, "
        "sequence tables native; needs the torchrec extra). The twin prices the plan, not the backend: both issue the same collectives.")
    table_sharding: Literal["auto"] | dict[str, Sharding] = Field(
        "auto", description="'auto' or a sharding per table family name."
    )
    activation_checkpointing: Checkpointing = Field(
        "none", description="Recompute activations in backward."
    )
    sm_free_collectives: bool = Field(
        False, description="Copy-engine collectives where possible (no SMs taken from compute)."
    )
    fsdp_prefetch: NonNeg = Field(1, description="FSDP units all-gathered ahead of use.")
    fsdp_reshard_after_forward: bool = Field(
        True, description="Free each FSDP unit's gathered parameters after its forward and gather them again "
        "before its backward (false: keep them from the forward to the backward, one all-gather per unit "
        "per micro-batch, for memory).")


class Precision(Section):
    embeddings: Literal["fp32", "bf16"] = Field("fp32", description="Embedding table weights.")
    attention: Dtype = Field("bf16", description="Attention matmuls (GDPA's Q·Kᵀ and P·V; mxfp8: GDPA only). "
                             "Blockwise fp8 is not offered here: at head_dim 128 the contraction is one block "
                             "and our bf16 Triton kernels run it faster than fp8 would after quantization.")
    mlp: Literal["fp32", "bf16", "mxfp8", "fp8_block", "auto"] = Field(
        "bf16", description="MLP / projection matmuls (every nn.Linear but the task heads and MoE routers). "
        "fp8_block: blockwise fp8 on Hopper (kernels.fp8block: 1x128 activations and gradients, 128x128 "
        "weights, cuBLASLt), each layer whose widths are multiples of 128, with a bf16 guard; auto: "
        "fp8_block only for the layers whose shapes pay in the measured threshold table "
        "(kernels.fp8block.table), bf16 for the rest. mxfp8: MX blocks of 32 (Blackwell's format; "
        "emulated on Hopper).")
    comm: Literal["fp32", "bf16"] = Field("bf16", description="Collective payloads.")


class Checkpoint(Section):
    """Checkpoints of a training run (``executor.checkpoint``, through torch.distributed.checkpoint):
    the dense parameters and both optimizers' states, the embedding shards, each rank's data
    position and RNG states, and the step. The twin prices saving and restarting from the same
    settings (``twin.goodput``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    dir: str | None = Field(None, description="Where checkpoints go, one step-NNNNNNNN directory each "
                            "(none: no checkpoints).")
    every: NonNeg = Field(0, description="Save after every N-th step (0: only after the last step; "
                          "with dir unset, nothing is saved).")
    keep: Pos = Field(3, description="Committed checkpoints kept; older ones are deleted after each save.")
    async_save: bool = Field(False, alias="async", description="Copy the state to host memory in the step, "
                             "write it in the background (the step blocks only for the copy).")


class Training(Section):
    global_batch: Pos = Field(..., description="Samples per optimizer step, all GPUs together.")
    micro_batch: Pos = Field(..., description="Samples per GPU per forward/backward.")
    dense_optimizer: Literal["adam", "adamw"] = Field("adamw", description="Dense optimizer.")
    dense_lr: float = Field(1e-3, gt=0, description="Dense learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="Dense weight decay.")
    sparse_optimizer: Literal["rowwise_adagrad"] = Field(
        "rowwise_adagrad", description="Embedding optimizer."
    )
    sparse_lr: float = Field(0.05, gt=0, description="Embedding learning rate.")
    grad_clip: float = Field(1.0, ge=0, description="Dense grad-norm clip (0: off).")
    lr_warmup_steps: int = Field(
        0, ge=0, description="Dense learning-rate warm-up: step i (from 0) uses dense_lr·min(1, (i+1)/warmup_steps) "
        "(0: none). Adam's first steps move every weight by ~lr whatever its gradient's size, which "
        "wide layers turn into large output changes.")
    steps: Pos = Field(100, description="Optimizer steps to train.")
    seed: int = Field(0, description="Seed for data and init.")
    eval_batches: NonNeg = Field(8, description="Held-out micro-batches evaluated after the last step (loss, "
                                 "NE, AUC per task; 0: none, e.g. for timing runs, whose evaluation would "
                                 "compile the blocks' inference graphs too).")
    checkpoint: Checkpoint = Field(default_factory=Checkpoint, description="Checkpoints (off by default).")


Auto = Literal["auto"]
BlockKind = Literal["sequence", "nonsequence", "cross", "mlp"]
AttentionKernel = Literal["auto", "triton", "reference"]
EmbeddingKernel = Literal["auto", "triton", "torch"]
FfnKernel = Literal["auto", "triton", "torch", "cublaslt"]


class FlashOptions(Section):
    """Variants of the Triton flash-attention core (``kernels/flash``), for side-by-side runs."""

    fused_short: bool = Field(True, description="Cross attention with a short side (<= 64 rows a sample) "
                              "runs its backward in one kernel per (sample, head); false: two kernels.")
    block_local: bool = Field(True, description="BlockAttention with blocks <= 128 takes the one-pass "
                              "block-local path; false: the general tiled path.")
    tma: bool = Field(True, description="The tiled path's forward and dK/dV kernels load their tiles through "
                      "TMA descriptors on GPUs that have them (compute capability 9.0 on); false: pointer loads.")


class Execution(Section):
    """How the executor runs a step: which kernels, compile, CUDA graphs, batch layout, loader.

    ``auto`` picks what is best on the device the run finds (``scenarios.execution.resolve``, one
    rule for the executor and the twin); an explicit choice that cannot run there is a one-line
    error. The RunRecord stores the resolved section; the twin prices what changes the cost."""

    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where the executor runs "
                                                   "(auto: CUDA when present). The twin: hardware.gpu.")
    attention_kernel: AttentionKernel = Field(
        "auto", description="Attention: the Triton kernels of kernels/ or the PyTorch reference (padded, "
        "masked, recomputed in backward). auto: Triton on CUDA, the reference on CPU.")
    attention_in_graph: bool = Field(True, description="The Triton attention op traced into the compiled "
                                     "layers' graphs; false: eager between them (a graph break each side).")
    embedding_kernel: EmbeddingKernel = Field(
        "auto", description="Embedding lookups: table-batched Triton kernels (one launch per table group) "
        "or torch's F.embedding_bag per table. auto: Triton on CUDA, torch on CPU.")
    ffn_kernel: FfnKernel = Field(
        "auto", description="The sequence FFN's bias + GELU: one Triton op (kernels/ffn/bias_gelu.py, exact "
        "GELU), torch, or cuBLASLt's GEMM epilogues (kernels/ffn/epilogue.py: the tanh GELU only, CUDA). "
        "auto: on CUDA Triton, or cuBLASLt for model.sequence.ffn_activation gelu_tanh; torch on CPU.")
    compile: bool | Auto = Field("auto", description="torch.compile the dense blocks. auto: on with CUDA.")
    max_autotune: list[BlockKind] = Field(
        default_factory=list, description="Block kinds compiled with mode max-autotune-no-cudagraphs "
        "(Inductor may pick its Triton GEMM templates; costs compile time).")
    cuda_graphs: bool | Auto = Field("auto", description="Replay each step from a CUDA graph, one per batch "
                                     "shape. auto: wherever it can run (CUDA, Triton lookups and attention, "
                                     "the fused sparse update, no MXFP8).")
    token_bucket: NonNeg | Auto = Field("auto", description="Static-shape batches: every id layout padded "
                                        "to a multiple of this many ids (0: none). auto: 8192 with CUDA "
                                        "graphs, else 0.")
    fused_sparse_update: bool | Auto = Field(
        "auto", description="Row-wise Adagrad inside the lookups' backward. auto: where it is exact "
        "(Triton lookups and one micro-batch per step).")
    data_processes: bool = Field(False, description="Draw batches in a worker process.")
    flash: FlashOptions = Field(default_factory=FlashOptions)


class Scenario(Section):
    name: str = Field(..., description="Scenario name.")
    description: str = Field("", description="What this scenario is and where its sizes come from.")
    model: Model = Field(..., description="The model (kind: gem | dlrm).")
    hardware: Hardware
    parallelism: Parallelism = Field(default_factory=Parallelism)
    precision: Precision = Field(default_factory=Precision)
    training: Training
    execution: Execution = Field(default_factory=Execution)

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        for check in (_check_mesh, _check_experts, _check_batch, _check_table_sharding):
            check(self)
        return self

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step on each GPU."""
        return self.training.global_batch // (self.training.micro_batch * self.hardware.num_gpus)


def _check_mesh(s: Scenario) -> None:
    p, n = s.parallelism, s.hardware.num_gpus
    for a, b in (("dense_replicate", "dense_shard"), ("sparse_replica", "sparse_shard")):
        x, y = getattr(p, a), getattr(p, b)
        if x * y != n:
            fix = f"set parallelism.{a}={n // y}" if n % y == 0 else f"set parallelism.{b} to a divisor of {n}"
            raise ValueError(
                f"parallelism.{a} × parallelism.{b} ({x} × {y} = {x * y}) must equal "
                f"hardware.num_gpus ({n}): {fix}"
            )
    if n % p.expert:
        raise ValueError(
            f"parallelism.expert ({p.expert}) must divide hardware.num_gpus ({n}): set it to a divisor of {n}"
        )


def _check_experts(s: Scenario) -> None:
    e = s.parallelism.expert
    experts = s.model.moe.num_experts if isinstance(s.model, GEMModel) else 0
    if e > 1 and experts % e:
        raise ValueError(
            f"model.moe.num_experts ({experts}) must be divisible by parallelism.expert ({e})"
        )


def _check_batch(s: Scenario) -> None:
    t, n = s.training, s.hardware.num_gpus
    if t.global_batch % (t.micro_batch * n):
        raise ValueError(
            f"training.global_batch ({t.global_batch}) must be a multiple of "
            f"training.micro_batch × hardware.num_gpus ({t.micro_batch} × {n} = {t.micro_batch * n})"
        )


def _check_table_sharding(s: Scenario) -> None:
    plan = s.parallelism.table_sharding
    if plan == "auto":
        return
    known = {f.name for f in s.model.embeddings.families()}
    for name in plan:
        if name not in known:
            raise ValueError(
                f"parallelism.table_sharding has '{name}', which is no table family; "
                f"known: {', '.join(sorted(known))}"
            )
