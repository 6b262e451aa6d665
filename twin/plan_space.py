"""The planner's search space (torch-free): its axes and limits, ``Candidate`` (one point) and
``apply`` (a scenario with a candidate's choices). The rules are in ``twin.planner``'s docstring."""

from __future__ import annotations

from dataclasses import dataclass

from hwmodels.gpus import get_gpu
from scenarios.schema import GEMModel, Scenario

DENSE_SHARD_MAX_DOMAINS = 8
MAX_SPARSE_SHARDS = 8
MAX_GRAD_ACCUM = 8
SYNC_INTERVALS = (1, 10, 100)
EXHAUSTIVE_COMM = 12
CHECKPOINTING = ("none", "selective", "full")
PRECISIONS = {"bf16": ("bf16", "bf16"), "mxfp8-mlp": ("bf16", "mxfp8"), "mxfp8": ("mxfp8", "mxfp8")}


@dataclass(frozen=True, order=True)
class Candidate:
    """One point of the search space (the fields the planner changes)."""

    micro_batch: int
    activation_checkpointing: str
    precision: str  # a key of PRECISIONS
    expert: int
    sparse_shard: int
    dense_shard: int
    sparse_strategy: str = "fully_sharded"
    sparse_sync_interval: int = 1

    @property
    def key(self) -> tuple:
        """The compute-relevant part."""
        return (self.micro_batch, self.activation_checkpointing, self.precision, self.expert,
                self.sparse_shard)  # fmt: skip

    def label(self) -> str:
        sync = ("fs" if self.sparse_strategy == "fully_sharded"
                else f"rs/{self.sparse_sync_interval}")  # fmt: skip
        return (f"mb{self.micro_batch} ckpt={self.activation_checkpointing} {self.precision} "
                f"ds{self.dense_shard} ep{self.expert} ss{self.sparse_shard} {sync}")  # fmt: skip


# ---- the space -------------------------------------------------------------------------------
def _pow2_upto(n: int, cap: int) -> list[int]:
    return [1 << k for k in range(40) if (1 << k) <= cap and n % (1 << k) == 0]


def dense_shards(gpus: int, domain: int) -> list[int]:
    vals = set(_pow2_upto(gpus, domain))
    if gpus % domain == 0:
        vals.update(domain * (1 << k) for k in range(40)
                    if (1 << k) <= DENSE_SHARD_MAX_DOMAINS and gpus % (domain * (1 << k)) == 0)  # fmt: skip
    return sorted(vals)


def sparse_shards(gpus: int, domain: int) -> list[int]:
    vals = set(_pow2_upto(gpus, gpus))
    vals.update(domain * k for k in range(1, gpus // domain + 1)
                if gpus % (domain * k) == 0 and (k & (k - 1)) == 0)  # fmt: skip
    vals = sorted(vals)
    if len(vals) <= MAX_SPARSE_SHARDS:
        return vals
    keep = {1, gpus} | ({domain} if gpus % domain == 0 else set())
    picks = {vals[round(i * (len(vals) - 1) / (MAX_SPARSE_SHARDS - 1))]
             for i in range(MAX_SPARSE_SHARDS)}  # fmt: skip
    return sorted(keep | picks)


def experts(s: Scenario, gpus: int) -> list[int]:
    n = s.model.moe.num_experts if isinstance(s.model, GEMModel) else 0
    if not n:
        return [1]
    return [e for e in range(1, n + 1) if n % e == 0 and gpus % e == 0]


def per_gpu_batch(global_batch: int, gpus: int) -> int:
    """The per-GPU batch the planner keeps (see the module rule)."""
    if global_batch % gpus == 0:
        return global_batch // gpus
    return max(1, round(global_batch / gpus))


def micro_batches(per_gpu: int) -> list[int]:
    return [m for m in range(1, per_gpu + 1) if per_gpu % m == 0 and per_gpu // m <= MAX_GRAD_ACCUM]


def precisions(gpu_name: str) -> list[str]:
    return list(PRECISIONS) if "fp8" in get_gpu(gpu_name).peak_flops else ["bf16"]


def _comm_variants(gpus: int, ss: int, ds_list: list[int]) -> list[tuple[int, str, int]]:
    strategies = [("fully_sharded", 1)]
    if gpus // ss > 1:
        strategies += [("replicated_sync", n) for n in SYNC_INTERVALS]
    return [(d, st, n) for st, n in strategies for d in ds_list]


# ---- scenarios from candidates -----------------------------------------------------------------
def apply(s: Scenario, c: Candidate, *, gpus: int, gpu: str, network: str,
          global_batch: int) -> Scenario:  # fmt: skip
    """``s`` with the candidate's choices (no validation: the space is valid by construction)."""
    attn, mlp = PRECISIONS[c.precision]
    p = s.parallelism.model_copy(update={
        "dense_shard": c.dense_shard, "dense_replicate": gpus // c.dense_shard,
        "expert": c.expert, "sparse_shard": c.sparse_shard,
        "sparse_replica": gpus // c.sparse_shard, "sparse_strategy": c.sparse_strategy,
        "sparse_sync_interval": c.sparse_sync_interval, "table_sharding": "auto",
        "activation_checkpointing": c.activation_checkpointing,
    })  # fmt: skip
    return s.model_copy(update={
        "hardware": s.hardware.model_copy(update={"gpu": gpu, "num_gpus": gpus, "network": network}),
        "parallelism": p,
        "precision": s.precision.model_copy(update={"attention": attn, "mlp": mlp}),
        "training": s.training.model_copy(update={"micro_batch": c.micro_batch,
                                                  "global_batch": global_batch}),
    })  # fmt: skip


def _given_candidate(s: Scenario) -> Candidate | None:
    p, pr = s.parallelism, s.precision
    prec = next((k for k, v in PRECISIONS.items() if v == (pr.attention, pr.mlp)), None)
    if prec is None:
        return None
    return Candidate(s.training.micro_batch, p.activation_checkpointing, prec, p.expert,
                     p.sparse_shard, p.dense_shard, p.sparse_strategy,
                     p.sparse_sync_interval if p.sparse_strategy == "replicated_sync" else 1)  # fmt: skip
