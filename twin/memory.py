"""Memory per rank: what one GPU holds at the peak of a training step, by category (torch-free).

``memory_per_rank(scenario)`` adds up the categories below for one representative rank (all
ranks are assumed alike: even shards, mean load). Sizes are bytes; ``P`` is the dense
parameter count (``twin.workload._dense_params``: every op's ``params`` except embeddings and
experts), ``E`` the expert parameter count (recorded on the ``experts_up`` ops).

Rules:

- **dense_params**: the fp32 master weights, sharded over ``dense_shard`` (FSDP) and replicated
  over ``dense_replicate``: ``4·P/dense_shard``. When ``precision.mlp`` is not fp32 and there is
  no FSDP (``dense_shard`` = 1), plus a full bf16 compute copy ``2·P`` (autocast's weight
  cache); with FSDP the bf16 compute copy is the all-gathered units (``fsdp_gathered``).
- **dense_grads**: the gradient shard, kept in **fp32** (the parameter dtype: the reduce-scatter
  runs in ``precision.comm`` into a buffer counted in ``comm_buffers`` and is accumulated into
  the fp32 shard): ``4·P/dense_shard``.
- **dense_optimizer**: Adam and AdamW keep two fp32 moments: ``8·P/dense_shard``.
- **expert_params / expert_grads / expert_optimizer**: each rank holds ``num_experts/expert``
  whole experts of every MoE layer (not sharded further): ``4·E/expert`` (+ ``2·E/expert``
  bf16 compute copy when ``precision.mlp`` is not fp32), fp32 grads ``4·E/expert``, Adam
  ``8·E/expert``.
- **embedding_shard**: tables are split evenly over ``sparse_shard`` (row-wise; table-wise
  imbalance is not modelled); ``fully_sharded`` shards each group's share again over
  ``sparse_replica`` (the replica axis all-gathers the rows a batch touches, as the workload
  models it), so a rank holds ``total/(sparse_shard·sparse_replica)`` = ``total/num_gpus``;
  ``replicated_sync`` keeps a full group share ``total/sparse_shard``. Element size
  ``precision.embeddings``. Hot rows (``scenarios.placement.hot_rows``) are on every rank whole:
  a rank holds the hot rows of every table plus its share of the cold rows.
- **embedding_optimizer**: row-wise Adagrad, one fp32 per row of the rank's shard (and per hot
  row).
- **embedding_grads**: the rows one micro-batch touches, in fp32 (``lookups·dim·4``: the sparse
  gradient before the fused row-wise update).
- **activations**: per layer, the forward outputs (``OpCost.act_bytes``) autograd keeps for
  backward at ``training.micro_batch``, under ``parallelism.activation_checkpointing``:
  ``none`` keeps every op's output that a backward reads, not a projection's that only a
  residual add consumes (the add's backward needs neither input); attention is flash-style
  (output + log-sum-exp, never the scores). ``selective`` drops the attention outputs
  (recomputed from the kept q, k, v in backward), except GDPA's, which its backward does not
  read and which is kept for the output projection (``twin.workload.recomputed_under_selective``).
  ``full`` keeps only each layer's boundary tensors (each of its streams' last residual output,
  else its last op's output: a layer's input is the previous layer's output). The input-side
  layers ``emb``, ``bottom`` and ``head`` are never checkpointed (as ``twin.workload._recompute``).
  Expert ops are padded by ``moe.capacity_factor`` under expert parallelism. The peak is the
  sum over layers plus the **backward working set** at the peak (its own entry in
  ``by_layer_activation_bytes``): walking the backward from the last layer, each layer's
  recomputed part plus twice its largest op output (the incoming and outgoing activation
  gradient) on top of the kept outputs of the layers not yet done (the later ones are freed).
  Checked against ``torch.cuda.max_memory_allocated`` on 17 configurations of gem-h200-1gpu (19 runs)
  (hwmodels/data/runs/h200-2026-12-02e-campaign): within -1.6 ... +2.9%.
- **mxfp8_copies**: for gemms in mxfp8 or fp8_block, one quantized copy (``1 + 1/32`` or
  ``1 + 4/128`` bytes per element) of the rank's weights (dense over ``dense_shard``, experts over ``expert``) and of each saved
  input activation (the previous op's output, counted when that output is kept).
- **comm_buffers**: per parallel axis of size > 1, twice (double buffering) its largest
  message, with the workload's message sizes: ``dense_shard`` the reduce-scatter input (a
  unit's unsharded gradients in ``precision.comm``; the all-gather output is
  ``fsdp_gathered``), ``dense_replicate`` a unit's gradient shard, ``expert`` the MoE
  dispatch (capacity-padded), ``expert_replicate`` a layer's expert gradients, ``sparse_shard``
  the larger of the id and the embedding-output all-to-alls, ``sparse_replica`` the touched
  rows (``fully_sharded``) or one in-place all-reduce bucket of ``SYNC_BUCKET_BYTES``
  (``replicated_sync``), ``sparse_world`` the hot rows' gradients (their all-reduce). With hot
  rows the sparse messages are the workload's cold ones.
- **fsdp_gathered** (``dense_shard`` > 1): the unsharded parameters, in ``precision.comm``, of
  the ``fsdp_prefetch + 1`` consecutive FSDP units with the most parameters; of every unit
  without ``parallelism.fsdp_reshard_after_forward`` (each stays gathered until its backward).
- **workspace**: ``WORKSPACE_BYTES`` (1 GiB) for the CUDA context, cuBLAS and NCCL workspaces.
  It counts against the HBM, but outside the caching allocator: the total without it is what
  the executor's ``torch.cuda.max_memory_allocated`` compares with (``twin.validate.twin_peak_bytes``).

Not modelled: allocator fragmentation, loss/optimizer temporaries, uneven shards.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hwmodels.gpus import GPUSpec, get_gpu
from scenarios.memo import memo
from scenarios.placement import Payload, axis_group, by_layer, dispatch_bytes, split
from scenarios.schema import GEMModel, Scenario
from scenarios.vocab import CommGroup, OpClass
from twin.flops import ELEM_BYTES, OpCost, model_costs
from twin.imbalance import hot_splits
from twin.workload import (_cold, _dense_params, _embedding_ops, _hot, _expert_param_count, _expert_params,
                           _group_layers, _payload_bytes,
                           recomputed_under_selective)

WORKSPACE_BYTES = float(2**30)  # CUDA context + cuBLAS + NCCL workspaces
SYNC_BUCKET_BYTES = float(256 * 2**20)  # replicated_sync all-reduces the shard in place, bucketed
FP32_BYTES = 4.0
ADAM_STATE_BYTES = 8.0  # two fp32 moments per parameter
WORKING_SET = "backward_working_set"
_NOT_CHECKPOINTED = ("emb", "bottom", "head")
_GB = 1e9

Layers = list[tuple[str, list[OpCost]]]


@dataclass(frozen=True)
class MemoryReport:
    """Bytes one rank holds at the step's peak, by category and activations by layer."""

    scenario: str
    gpu: str
    by_category_bytes: dict[str, float]
    by_layer_activation_bytes: dict[str, float]
    total_bytes: float
    capacity_bytes: float
    fits: bool
    hint: str = ""  # what to change when it does not fit (for the largest consumer)

    def largest(self, n: int = 3) -> list[tuple[str, float]]:
        """The ``n`` largest non-zero categories, largest first."""
        items = sorted(self.by_category_bytes.items(), key=lambda kv: (-kv[1], kv[0]))
        return [(k, v) for k, v in items if v > 0][:n]

    def message(self) -> str:
        """One line: fits or does not fit, the total against the HBM, the largest consumers."""
        top = ", ".join(f"{k} {v / _GB:.1f} GB" for k, v in self.largest())
        head = "fits" if self.fits else "does not fit"
        line = (f"{head}: {self.total_bytes / _GB:.1f} GB per rank on {self.gpu} "
                f"({self.capacity_bytes / _GB:.1f} GB); largest: {top}")  # fmt: skip
        return line if self.fits else f"{line}; try {self.hint}"

    def as_dict(self) -> dict:
        return asdict(self)


_HINTS = {  # by largest category
    "activations": "parallelism.activation_checkpointing=full or a smaller training.micro_batch",
    "embedding_shard": "parallelism.sparse_strategy=fully_sharded or a larger "
    "parallelism.sparse_shard",
    "dense_optimizer": "a larger parallelism.dense_shard",
    "dense_params": "a larger parallelism.dense_shard",
    "expert_optimizer": "a larger parallelism.expert",
    "expert_params": "a larger parallelism.expert",
    "fsdp_gathered": "a smaller parallelism.fsdp_prefetch or a larger parallelism.dense_shard",
    "comm_buffers": "a smaller training.micro_batch or precision.comm=bf16",
}


def memory_per_rank(
    s: Scenario, *, costs: list[OpCost] | None = None, gpu: GPUSpec | None = None
) -> MemoryReport:
    """The memory report of one rank of ``s`` (``costs``: one micro-batch's ops, if known)."""
    if costs is None:
        costs = model_costs(s.model, batch=s.training.micro_batch, precision=s.precision)
    gpu = gpu or get_gpu(s.hardware.gpu)
    layers = _group_layers(costs)
    by_layer = _activations(s, costs, layers)
    cats = {
        **_dense(s, costs), **_experts(s, costs), **_embeddings(s, costs),
        "activations": sum(by_layer.values()),
        "mxfp8_copies": _mxfp8_copies(s, costs, layers),
        "comm_buffers": sum(comm_buffer_bytes(s, costs, layers).values()),
        "fsdp_gathered": _fsdp_gathered(s, layers),
        "workspace": WORKSPACE_BYTES,
    }  # fmt: skip
    total = sum(cats.values())
    cap = gpu.hbm_bytes
    return MemoryReport(s.name, gpu.name, cats, by_layer, total, cap, total <= cap,
                        _hint(s, max(cats, key=cats.get)))  # fmt: skip


def memory_floor_bytes(s: Scenario, *, costs: list[OpCost] | None = None) -> float:
    """Bytes one rank of ``s`` holds at least whatever its ``dense_shard`` and sparse strategy:
    its activations (micro-batch and checkpointing), its expert states (expert degree) and the
    workspace; every other category is positive. A planner rules a whole (micro-batch,
    checkpointing, precision, expert) choice out on it before checking each layout."""
    if costs is None:
        costs = model_costs(s.model, batch=s.training.micro_batch, precision=s.precision)
    layers = _group_layers(costs)
    return sum(_activations(s, costs, layers).values()) + sum(_experts(s, costs).values()) + WORKSPACE_BYTES


def _hint(s: Scenario, largest: str) -> str:
    if largest == "activations" and s.parallelism.activation_checkpointing == "full":
        return "a smaller training.micro_batch"
    if largest.startswith("embedding") and s.parallelism.sparse_strategy == "fully_sharded":
        return "more hardware.num_gpus or precision.embeddings=bf16"
    return _HINTS.get(largest, "more hardware.num_gpus or a smaller model")


# ---- parameters, gradients, optimizer states --------------------------------------------------
def _lowp(s: Scenario) -> bool:
    return s.precision.mlp != "fp32"


def _dense(s: Scenario, costs: list[OpCost]) -> dict[str, float]:
    n, params = s.parallelism.dense_shard, _dense_params(costs)
    copy = 2.0 * params if _lowp(s) and n == 1 else 0.0
    return {
        "dense_params": FP32_BYTES * params / n + copy,
        "dense_grads": FP32_BYTES * params / n,
        "dense_optimizer": ADAM_STATE_BYTES * params / n,
    }


def _experts(s: Scenario, costs: list[OpCost]) -> dict[str, float]:
    params = _expert_param_count(costs) / s.parallelism.expert
    copy = 2.0 * params if _lowp(s) else 0.0
    return {
        "expert_params": FP32_BYTES * params + copy,
        "expert_grads": FP32_BYTES * params,
        "expert_optimizer": ADAM_STATE_BYTES * params,
    }


def embedding_split(s: Scenario) -> int:
    """Ranks one embedding row set is divided over (see the module rules): the groups that shard
    the tables in their placement (``scenarios.placement``)."""
    tables = by_layer(s).get("emb")
    return split(s, tables.params[0]) if tables else 1


def _embeddings(s: Scenario, costs: list[OpCost]) -> dict[str, float]:
    emb = [c for c in costs if c.op_class == OpClass.EMBEDDING]
    k, e = embedding_split(s), ELEM_BYTES[s.precision.embeddings]
    rows = sum(c.sparse_params * e / c.row_bytes for c in emb)  # sparse_params / dim
    hot = hot_splits(s)  # hot rows: whole on every rank, not 1/k of them
    hot_params = sum(c.sparse_params * _hot(hot, c, "rows") for c in emb) * (1.0 - 1.0 / k)
    hot_row_count = sum(c.sparse_params * e / c.row_bytes * _hot(hot, c, "rows") for c in emb) * (1.0 - 1.0 / k)
    return {
        "embedding_shard": sum(c.sparse_params for c in emb) * e / k + hot_params * e,
        "embedding_optimizer": FP32_BYTES * rows / k + FP32_BYTES * hot_row_count,
        "embedding_grads": sum(c.lookups * c.row_bytes / e * FP32_BYTES for c in emb),
    }


# ---- activations ---------------------------------------------------------------------------
def _act(s: Scenario, c: OpCost) -> float:
    """An op's kept output; expert buffers are capacity-padded under expert parallelism."""
    padded = s.parallelism.expert > 1 and ".experts_" in c.name
    return c.act_bytes * (s.model.moe.capacity_factor if padded else 1.0)


def _is_residual(c: OpCost) -> bool:
    return c.name.split(".")[-1].startswith("residual")


def _saved(ops: list[OpCost]) -> list[OpCost]:
    """The ops whose outputs some backward reads: all but those consumed only by a residual add
    (an add's backward needs neither input: the projection feeding it is never saved)."""
    return [c for c, nxt in zip(ops, [*ops[1:], None]) if nxt is None or not _is_residual(nxt) or _is_residual(c)]


def _kept(policy: str, layer: str, ops: list[OpCost]) -> list[OpCost]:
    """The ops whose outputs autograd keeps through the forward under ``policy``."""
    if policy == "none" or layer in _NOT_CHECKPOINTED:
        return _saved(ops)
    if policy == "selective":
        return [c for c in _saved(ops) if not recomputed_under_selective(c)]
    last = {c.name.rsplit(".", 1)[0]: c for c in ops if _is_residual(c)}  # each stream's last residual
    return list(last.values()) or ops[-1:]


_ACTIVATIONS: dict = {}  # scenarios.memo's table


def _activations(s: Scenario, costs: list[OpCost], layers: Layers) -> dict[str, float]:
    """``activation_bytes_by_layer``, once per op list and what it reads of the scenario (the
    checkpointing policy, and the model's capacity factor where experts are spread): a plan checks
    thousands of layouts that share one micro-batch's ops. Keyed by the objects' identities, kept
    alive with the entry."""
    return dict(memo(_ACTIVATIONS, (costs, s.model),
                     (s.parallelism.activation_checkpointing, s.parallelism.expert > 1),
                     lambda: activation_bytes_by_layer(s, layers), cap=1024))


def activation_bytes_by_layer(s: Scenario, layers: Layers) -> dict[str, float]:
    """Kept activation bytes per layer, plus the backward working set at the peak (``WORKING_SET``).

    The backward walks the layers in reverse, freeing each one's kept outputs once its backward is
    done; layer ``l``'s backward needs, besides the kept outputs of ``l`` and of the layers before
    it, its working set: its recomputed part and twice its largest op output (the incoming and
    outgoing activation gradient). The peak is the largest of those sums; ``WORKING_SET`` is what
    it adds to the sum of every layer's kept outputs."""
    policy = s.parallelism.activation_checkpointing
    out: dict[str, float] = {}
    before, peak = 0.0, 0.0  # kept outputs of the layers up to here; the peak so far
    for layer, ops in layers:
        kept = sum(_act(s, c) for c in _kept(policy, layer, ops))
        redo = sum(_act(s, c) for c in _saved(ops)) - kept  # what its recompute brings back
        out[layer] = out.get(layer, 0.0) + kept
        before += kept
        peak = max(peak, before + redo + 2.0 * max((_act(s, c) for c in ops), default=0.0))
    out[WORKING_SET] = max(0.0, peak - before)
    return out


_MXFP8: dict = {}  # scenarios.memo's table


def _mxfp8_copies(s: Scenario, costs: list[OpCost], layers: Layers) -> float:
    p = s.parallelism  # once per op list and what it reads (a planner checks thousands of layouts)
    return memo(_MXFP8, (costs, s.model), (p.activation_checkpointing, p.expert, p.dense_shard, s.training.micro_batch),
                lambda: _mxfp8_copies_of(s, costs, layers))


def _mxfp8_copies_of(s: Scenario, costs: list[OpCost], layers: Layers) -> float:
    p = s.parallelism
    policy = p.activation_checkpointing
    kept = {id(c) for layer, ops in layers for c in _kept(policy, layer, ops)}
    total = 0.0
    for prev, c in zip([None, *costs[:-1]], costs):
        if c.op_class != OpClass.GEMM or c.dtype not in ("mxfp8", "fp8_block"):
            continue
        q = ELEM_BYTES[c.dtype]
        total += q * c.params / (p.expert if _expert_params(c) else p.dense_shard)
        if prev is not None and id(prev) in kept:
            total += q * _act(s, prev) / ELEM_BYTES["bf16"]
    return total


# ---- communication ---------------------------------------------------------------------------
def largest_messages(s: Scenario, costs: list[OpCost], layers: Layers) -> dict[str, float]:
    """The largest collective message (bytes) of each parallel axis, as the workload sends it."""
    p, cb = s.parallelism, ELEM_BYTES[s.precision.comm]
    unit = max((_dense_params(ops) for _, ops in layers), default=0)
    experts = max((_expert_param_count(ops) for _, ops in layers),
                  default=0)  # fmt: skip
    emb = _embedding_ops(costs)
    touched, hot = _payload_bytes(s, Payload.ROWS, emb), hot_splits(s)  # with hot rows, the cold parts
    emb_out = _payload_bytes(s, Payload.EMB_OUTPUTS, emb)
    cold = sum(c.sparse_params * _cold(hot, c, "rows") for c in emb)
    shard = cold * ELEM_BYTES[s.precision.embeddings] / p.sparse_shard
    sync = touched if p.sparse_strategy == "fully_sharded" else min(shard, SYNC_BUCKET_BYTES)
    return {
        CommGroup.DENSE_SHARD: unit * cb,
        CommGroup.DENSE_REPLICATE: unit / p.dense_shard * cb,
        CommGroup.EXPERT: _moe_dispatch_bytes(s),
        CommGroup.EXPERT_REPLICATE: experts / p.expert * cb,
        CommGroup.SPARSE_SHARD: max(_payload_bytes(s, Payload.IDS, emb), emb_out),
        CommGroup.SPARSE_REPLICA: sync,
        CommGroup.SPARSE_WORLD: _payload_bytes(s, Payload.HOT_ROW_GRADS, emb),
    }


def _moe_dispatch_bytes(s: Scenario) -> float:
    m = s.model
    if not isinstance(m, GEMModel) or not m.moe.num_experts:
        return 0.0
    return dispatch_bytes(m, s.training.micro_batch, ELEM_BYTES[s.precision.comm])


def comm_buffer_bytes(s: Scenario, costs: list[OpCost], layers: Layers) -> dict[str, float]:
    """Double-buffered largest message of every axis with more than one rank."""
    msgs = largest_messages(s, costs, layers)
    return {a: 2.0 * m for a, m in msgs.items() if m > 0 and axis_group(s, a)[0] > 1}


def _fsdp_gathered(s: Scenario, layers: Layers) -> float:
    p = s.parallelism
    if p.dense_shard <= 1:
        return 0.0
    units = [u for u in (_dense_params(ops) for _, ops in layers) if u]
    window = p.fsdp_prefetch + 1 if p.fsdp_reshard_after_forward else len(units)  # else: all, at the last forward
    most = max((sum(units[i : i + window]) for i in range(len(units))), default=0)
    return most * ELEM_BYTES[s.precision.comm]
