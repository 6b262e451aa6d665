"""What the scenario's ``execution`` section costs: the twin prices the step the executor would run.

The kernel curves (``hwmodels/data/efficiency.yaml``) describe one way of running a step per device:
on CUDA the default executor (Triton attention and embedding kernels, the sequence FFN's bias + GELU
op, compiled dense blocks, CUDA graphs, the sparse update fused into the lookups' backward); on the
``cpu`` profile the CPU executor's path (the reference attention's exact pairs, torch lookups, eager,
no graphs). ``scenarios.execution.resolve(s, device_of(s))`` says how this scenario runs; where that
differs from what the curves describe, ``plan`` rewrites the step's ops from how the executor runs
the choice, with the measured numbers of ``hwmodels/data/execution.yaml`` (one entry per GPU family,
each with its source):

- ``attention_kernel: reference`` (CUDA): each attention op becomes what the padded reference runs:
  its batched matmuls over the padded shapes (gemm compute against their bytes at the elementwise
  curve: 2 forward, 6 backward with the scores' recompute, 4 for cross attention), the weight passes
  over the G·H·n² padded scores, the gathers, copies and scatters of the padded rows, and the host
  round trip of each forward call. n is the longest sample of the micro-batch (its expectation under
  the length law). All of it is recomputed under ``selective`` checkpointing (the executor
  checkpoints the reference call, GDPA's too).
- ``ffn_kernel: torch``: the sequence FFN's activation takes Inductor's GELU time (measured ratios
  to the bias + GELU op the curves price).
- ``flash.fused_short: false``: the Triton cross attention's backward in two kernels (measured ratio
  to the one-kernel backward, which the default runs).
- ``compile: false``: the norms run in fp32 under autocast (``layer_norm`` is on autocast's fp32 list),
  twice the bytes the curves price for the compiled bf16 norms, with a cast pass each side of every
  norm (to fp32 before it, back to bf16 for the next matmul: 12 bytes an element each way).
- ``embedding_kernel: torch``: one call per table (each at least the measured per-call time) and
  the row-wise Adagrad of every table in the optimizer step; ``fused_sparse_update: false`` with the
  Triton lookups: the same optimizer step over the TBE's gradients.
- ``cuda_graphs: false`` (CUDA): the host issues the step, so the step is at least the host's time:
  a measured effective cost per modelled op (and per table for the per-table lookups and updates).

Not priced: ``token_bucket`` (its padding rows; ~2% of the tokens at gem-h200-1gpu's shapes),
``attention_in_graph``, ``max_autotune``, ``data_processes``, ``flash.block_local`` (each measured
within run-to-run noise or not measured), and any choice on the ``cpu`` profile other than its default
(no CPU measurement of them). MXFP8 GDPA under the reference runs a fake-quantized emulation of the
padded reference (``kernels.mxfp8.gdpa``): priced as the bf16 padded reference, a lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np

from hwmodels._data import load_yaml
from hwmodels.gpus import GPUSpec
from hwmodels.kernels import ELEM_BYTES, KernelModel
from scenarios.execution import ResolvedExecution, device_of, resolve
from scenarios.schema import GEMModel, Scenario
from twin.flops import OpCost

# the numbers the CUDA curves were measured with (efficiency.yaml's CUDA families)
CUDA_BASELINE = dict(attention_kernel="triton", embedding_kernel="triton", ffn_kernel="triton", compile=True,
                     cuda_graphs=True, fused_sparse_update=True)  # fmt: skip


def execution_of(s: Scenario) -> ResolvedExecution:
    """The execution the twin prices: ``s.execution`` resolved on the device its hardware is."""
    return resolve(s, device_of(s))


@cache
def family_data(gpu: str) -> dict:
    """``execution.yaml``'s entry for ``gpu``'s family (its ``inherit:`` chain resolved); {} for none."""
    fams = load_yaml("efficiency.yaml")["families"]
    name = next((n for n, f in fams.items() if gpu in f["gpus"]), None)
    return _resolved(name) if name else {}


def _resolved(name: str) -> dict:
    fam = load_yaml("execution.yaml")["families"].get(name)
    if fam is None:
        return {}
    base = _resolved(fam["inherit"]) if "inherit" in fam else {}
    return base | {k: v for k, v in fam.items() if k not in ("inherit", "note")}


@dataclass
class Plan:
    """The step's ops as this execution runs them, and the host's time to issue them."""

    costs: list[OpCost]
    optimizer: list[OpCost] = field(default_factory=list)  # run after the dense optimizer step
    host_per_op_s: float = 0.0  # 0: the host is never the bound (CUDA graphs, or the CPU profile)
    host_extra_s: dict[str, tuple[float, float]] = field(default_factory=dict)  # op name -> (fwd, bwd)

    def host_s(self, c: OpCost, fwd: bool) -> float:
        """Host seconds to issue one call of ``c``: ``host_per_op_s`` per op of the model (the parts
        this module split an op into, or added beside it, count as that one op) and the per-table
        host time of the torch lookups and of the sparse update in the optimizer step."""
        if not self.host_per_op_s:
            return 0.0
        extra = self.host_extra_s.get(c.name, (0.0, 0.0))[0 if fwd else 1]
        part = c.price.startswith(("ref.scores", "ref.rows")) or c.name.endswith(".casts")
        return (0.0 if part else self.host_per_op_s) + extra


def plan(s: Scenario, costs: list[OpCost], run: ResolvedExecution | None = None, *, gpu: str) -> Plan:
    """``costs`` (``twin.flops.model_costs`` of one micro-batch) as ``run`` executes them on ``gpu``."""
    run = run or execution_of(s)
    data = family_data(gpu)
    if run.device != "cuda" or not data:  # the cpu profile: its curves are the CPU executor's path
        return Plan(list(costs))
    out: list[OpCost] = []
    seq = _ShapeStats.of(s) if run.attention_kernel == "reference" else None
    for c in costs:
        if c.op_class == "attention" and run.attention_kernel == "reference" and isinstance(s.model, GEMModel):
            out += _reference_attention(s, c, seq)
        elif c.op_class == "norm" and not run.compile and s.precision.mlp != "fp32":
            out += _eager_norm(c)
        elif c.name.endswith(".mlp_act") and c.name.startswith("seq") and run.ffn_kernel == "torch":
            out.append(_torch_ffn_activation(c, data["ffn_torch"], run.compile))
        elif c.kernel == "attention.asym" and _two_kernel_short_bwd(s, run):
            out.append(replace(c, price=f"times:1:{float(data['flash_two_kernel_short_bwd']['bwd_factor'])}"))
        elif c.op_class == "embedding" and run.embedding_kernel == "torch":
            out.append(replace(c, price=f"torch_lookup:{_tables(s, c)}"))
        else:
            out.append(c)
    p = Plan(out)
    tables = sum(_tables(s, c) for c in costs if c.op_class == "embedding")
    if tables and not run.fused_sparse_update:
        which = "torch" if run.embedding_kernel == "torch" else "tbe"
        p.optimizer.append(OpCost("optimizer.sparse", "optimizer", "optimizer", "fp32", price=f"sparse_step:{tables}:{which}"))
    if not run.cuda_graphs:
        p.host_per_op_s = float(data["host"]["per_op_s"])
        e = data["torch_embeddings"]
        if run.embedding_kernel == "torch":
            for c in costs:
                if c.op_class == "embedding":
                    n = _tables(s, c)
                    p.host_extra_s[c.name] = (n * e["host_fwd_s"], n * e["host_bwd_s"])
        if p.optimizer:
            p.host_extra_s["optimizer.sparse"] = (tables * e["host_step_s"], 0.0)
    return p


def _tables(s: Scenario, c: OpCost) -> int:
    """Tables an embedding op looks up (one op per pooled family, and per family of a sequence group)."""
    emb = s.model.embeddings
    names = {f"emb.{f.name}": f.count for f in emb.pooled}
    names |= {f"emb.{g.name}.{f.name}": f.count for g in emb.sequences for f in g.tables}
    return names.get(c.name, 1)


# ---- the reference attention -----------------------------------------------------------------
@dataclass(frozen=True)
class _ShapeStats:
    """What the padded reference sizes its tensors by, per micro-batch (expectations over the law)."""

    samples: float  # B
    nonempty: float  # samples with at least one token
    max_len: float  # E[the micro-batch's longest sample]
    blocks: float  # E[Σ_b ceil(L_b / block)]

    @classmethod
    def of(cls, s: Scenario) -> _ShapeStats:
        m, B = s.model, s.training.micro_batch
        pmf = np.array([1.0])
        for g in m.embeddings.sequences:
            pmf = np.convolve(pmf, g.length.pmf)
        n = np.arange(len(pmf), dtype=np.float64)
        cdf = np.clip(np.cumsum(pmf), 0.0, 1.0)
        below = np.concatenate([[0.0], cdf[:-1]])
        e_max = float(np.dot(n, cdf**B - below**B))
        block = m.sequence.block_size
        return cls(float(B), B * (1.0 - float(pmf[0])), e_max, B * float(np.dot(pmf, np.ceil(n / block))))


def _reference_attention(s: Scenario, c: OpCost, st: _ShapeStats) -> list[OpCost]:
    """One attention op as the padded reference's three parts (bmm, score passes, row passes)."""
    m = s.model
    elem = ELEM_BYTES["fp32"] if s.precision.attention == "fp32" else ELEM_BYTES["bf16"]
    if c.name.startswith("cross"):
        H, D, N = m.cross.heads, m.cross.head_dim, m.nonseq.num_tokens
        B, n = st.samples, st.max_len
        E, P, tensors, weights, cross = B * H * N * n, B * n * H * D, 2, "softmax", True
        bmm_bytes = elem * (E + P + B * N * H * D)
    else:
        H, D, kind = m.sequence.heads, m.sequence.head_dim, m.sequence.attention
        if kind == "block":
            G, n = st.blocks, min(float(m.sequence.block_size), st.max_len)
        else:
            G, n = st.nonempty, st.max_len
        E, P, tensors, cross = G * H * n * n, G * n * H * D, 4, False
        weights = "gdpa" if kind == "gdpa" else "softmax"
        bmm_bytes = elem * (E + 2 * P)
    nb = 4 if cross else 6
    flops = 2.0 * E * D
    base = dict(layer=c.layer, op_class="attention", dtype="bf16" if elem == 2 else "fp32", kernel=c.kernel)
    return [
        OpCost(f"{c.name}.ref.bmm", fwd_flops=2 * flops, bwd_flops=nb * flops, fwd_bytes=2 * bmm_bytes,
               bwd_bytes=nb * bmm_bytes, act_bytes=c.act_bytes, price=f"ref.bmm:2:{nb}", **base),
        OpCost(f"{c.name}.ref.scores", fwd_bytes=elem * E, bwd_bytes=elem * E,
               price=f"ref.scores:{weights}:{'cross' if cross else 'self'}", **base),
        OpCost(f"{c.name}.ref.rows", fwd_bytes=elem * tensors * P, bwd_bytes=elem * tensors * P,
               price=f"ref.rows:{'cross' if cross else 'self'}", **base),
    ]  # fmt: skip


# ---- compile off: eager norms under autocast ----------------------------------------------------
def _eager_norm(c: OpCost) -> list[OpCost]:
    """An eager LayerNorm under bf16 autocast: fp32 in and out (2x the compiled bf16 norm's bytes),
    a cast to fp32 before it and one back to bf16 after it (6 bytes an element each), and their
    gradients' casts in backward."""
    elems = c.fwd_bytes / (2 * ELEM_BYTES["bf16"])  # twin/flops.py: norm fwd bytes = 2 x bf16 x elements
    casts = OpCost(f"{c.name}.casts", c.layer, "elementwise", "fp32", fwd_bytes=12.0 * elems, bwd_bytes=12.0 * elems)
    return [replace(c, fwd_bytes=2 * c.fwd_bytes, bwd_bytes=2 * c.bwd_bytes), casts]


def _torch_ffn_activation(c: OpCost, d: dict, compiled: bool) -> OpCost:
    """The sequence FFN's GELU as torch runs it: Inductor's (compiled) or eager (``ffn_torch`` notes),
    as time ratios to the bias + GELU op whose bytes the op counts."""
    bwd = float(d["bwd_factor"]) if compiled else 4.0 / 3.0
    return replace(c, price=f"times:{float(d['fwd_factor'])}:{bwd}")


def _two_kernel_short_bwd(s: Scenario, run: ResolvedExecution) -> bool:
    """The Triton cross attention's backward in two kernels (``flash.fused_short: false``) where its
    short side (the non-sequence tokens) would take the one-kernel path (<= 64 rows a sample)."""
    m = s.model
    return (run.attention_kernel == "triton" and not run.flash.fused_short and isinstance(m, GEMModel)
            and m.nonseq.num_tokens <= 64)  # fmt: skip


# ---- pricing of the ops this module made ---------------------------------------------------------
_FLAT = {}  # gpu name -> a KernelModel whose embedding curves have no x_half (the per-table calls)


def price(c: OpCost, fwd: bool, kind: str, gpu: GPUSpec, model: KernelModel) -> float:
    """Seconds of one call of ``c`` (``c.price`` set by ``plan``; ``kind``: its kernel kind), unscaled:
    the caller applies the calibration's scale for ``c``'s op class and kind."""
    data = family_data(gpu.name)
    rule, *args = c.price.split(":")
    flops, nbytes = (c.fwd_flops, c.fwd_bytes) if fwd else (c.bwd_flops, c.bwd_bytes)
    ew = lambda b: model.cost(kind="elementwise", flops=0.0, bytes=b, gpu=gpu, dtype="bf16").time_s  # noqa: E731
    if rule == "times":  # the curves' time for the op, times a measured ratio
        t = model.cost(kind=kind, flops=flops, bytes=nbytes, gpu=gpu, dtype=c.dtype, segments=c.segments or 1.0)
        return t.time_s * float(args[0] if fwd else args[1])
    if rule == "ref.bmm":
        calls = int(args[0] if fwd else args[1])
        g = model.cost(kind="gemm", flops=flops / calls, bytes=0.0, gpu=gpu, dtype=c.dtype)
        mem = model.cost(kind="elementwise", flops=0.0, bytes=nbytes / calls, gpu=gpu, dtype="bf16").memory_s
        return calls * (max(g.compute_s, mem) + g.launch_s)
    r = data["reference_attention"]
    side = r["fwd" if fwd else "bwd"]
    per_byte = 1.0 / ELEM_BYTES["bf16"]  # coefficients are bytes per bf16 element
    if rule == "ref.scores":
        weights, where = args
        alpha = side[f"alpha_{weights}"]
        if where == "cross" and not fwd:  # cross attention keeps its scores: no recompute in backward
            alpha -= r["fwd"][f"alpha_{weights}"]
        return ew(alpha * per_byte * nbytes)
    if rule == "ref.rows":
        rho = side["rho_cross"] if args[0] == "cross" and not fwd else side["rho"]
        return ew(rho * per_byte * nbytes) + (float(r["sync_s"]) if fwd else 0.0)
    if rule == "torch_lookup":
        return _torch_lookup_s(c, fwd, int(args[0]), gpu, data["torch_embeddings"])
    if rule == "sparse_step":
        tables, which = int(args[0]), args[1]
        d = data["torch_embeddings" if which == "torch" else "optimizer_step_sparse_update"]
        return tables * float(d["adagrad_step_s"])
    raise ValueError(f"op {c.name}: unknown execution price {c.price!r}")


def _torch_lookup_s(c: OpCost, fwd: bool, tables: int, gpu: GPUSpec, d: dict) -> float:
    """``tables`` calls, each at least the measured per-call time, or its bytes at the embedding curve's
    eff_max (no per-call x_half: that was fitted on the curve's single large calls)."""
    flat = _FLAT.get(gpu.name)
    if flat is None:
        flat = _FLAT[gpu.name] = KernelModel({k: {"memory_x_half_bytes": 0.0} for k in ("embedding.fwd", "embedding.bwd")})
    kind = "embedding.fwd" if fwd else "embedding.bwd"
    per = flat.cost(kind=kind, flops=0.0, bytes=(c.fwd_bytes if fwd else c.bwd_bytes) / tables, gpu=gpu,
                    dtype=c.dtype).memory_s  # fmt: skip
    return tables * max(float(d["lookup_fwd_s" if fwd else "lookup_bwd_s"]), per)
