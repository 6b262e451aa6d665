"""Analytic FLOPs, bytes and parameters of one micro-batch, layer by layer, torch-free.

Follows ``executor/MODEL.md`` exactly; ``tests/executor/test_flops_parity.py`` holds the total
against ``torch.utils.flop_counter.FlopCounterMode`` on the executor's model. The twin uses
expectations over the scenario's length laws (``SeqStats.expected``); the executor passes the
real lengths of its batch (``SeqStats.from_lengths``) to report MFU with the same formulas.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from hwmodels.kernels import ELEM_BYTES  # bytes per element (MXFP8: an E4M3 byte + an E8M0 scale per 32)
from kernels.attention import cost as attention_costs
from kernels.attention.cost import attention_cost, cross_pairs
from kernels.fp8block import eligible
from kernels.fp8block.table import pays
from scenarios.cost import Cost
from scenarios.placement import cross_stages, routed_tokens
from scenarios.memo import memo
from scenarios.schema import DLRMModel, GEMModel, Precision, SequenceStack, TableFamily
from scenarios.vocab import AttentionKind, OpClass, attention_label

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OpCost:
    """One op of the step, forward and backward. ``params`` are dense parameters it owns, of
    ``param_shapes``; ``sparse_params`` the embedding rows of ``sparse_shapes`` (``[rows, dim]``
    per table). A shape lists the weight's matmul dims as the op uses them (``[k, n]`` for
    ``x [m,k] · W [k,n]``); ``tests/test_same_layers.py`` holds them to the executor's model."""

    name: str
    layer: str
    op_class: OpClass
    dtype: str
    cost: Cost = Cost()
    params: int = 0
    sparse_params: int = 0
    lookups: float = 0.0  # embedding rows read per micro-batch
    bags: float = 0.0  # embedding outputs per micro-batch (pooled: samples x tables; sequence: = lookups)
    row_bytes: float = 0.0  # bytes of one embedding row
    attention: AttentionKind | None = None  # which attention kernel (attention ops only)
    act_bytes: float = 0.0  # forward output autograd keeps for backward (twin.memory)
    segments: float = 0.0  # attention: independent (sample, head) sequences in the call
    param_shapes: tuple[Shape, ...] = ()
    sparse_shapes: tuple[Shape, ...] = ()
    mkn: tuple[float, float, float] | None = None  # a Linear's rows, in and out widths (fp8_block pricing)

    @property
    def fwd_flops(self) -> float:
        return self.cost.fwd_flops

    @property
    def bwd_flops(self) -> float:
        return self.cost.bwd_flops

    @property
    def fwd_bytes(self) -> float:
        return self.cost.fwd_bytes

    @property
    def bwd_bytes(self) -> float:
        return self.cost.bwd_bytes

    @property
    def flops(self) -> float:
        return self.cost.flops

    @property
    def kernel(self) -> str:
        """The op's kernel label, ``attention.<kind>`` for attention, else '' (its op class)."""
        return attention_label(self.attention) if self.attention is not None else ""


@dataclass(frozen=True, slots=True)
class SeqStats:
    """Sequence totals of one micro-batch: tokens per group and attended pairs."""

    batch: int
    group_tokens: tuple[float, ...]
    self_pairs: float  # Σ_b pairs(L_b) for the sequence stack's attention kind

    @property
    def tokens(self) -> float:
        return float(sum(self.group_tokens))

    @classmethod
    def expected(cls, model: GEMModel | DLRMModel, batch: int) -> SeqStats:
        groups = model.embeddings.sequences
        if not groups:
            return cls(batch, (), 0.0)
        pmf = np.array([1.0])
        for g in groups:
            pmf = np.convolve(pmf, g.length.pmf)
        n = np.arange(len(pmf), dtype=np.float64)
        per_sample = float(np.dot(pmf, self_pairs(model.sequence, n)))
        tokens = tuple(batch * g.length.expected for g in groups)
        return cls(batch, tokens, batch * per_sample)

    @classmethod
    def from_lengths(cls, model: GEMModel | DLRMModel, group_lengths: list[list[int]]) -> SeqStats:
        """``group_lengths[g][b]``: tokens of group g in sample b, as in the real batch."""
        groups = model.embeddings.sequences
        if len(group_lengths) != len(groups):
            raise ValueError(
                f"group_lengths has {len(group_lengths)} groups; the model has {len(groups)}"
            )
        if not groups:
            return cls(0, (), 0.0)
        per = np.array(group_lengths, dtype=np.float64)
        total = per.sum(axis=0)
        pairs = float(np.sum(self_pairs(model.sequence, total)))
        return cls(per.shape[1], tuple(float(x) for x in per.sum(axis=1)), pairs)


def self_pairs(stack: SequenceStack, n: np.ndarray) -> np.ndarray:
    block = stack.block_size if stack.attention == "block" else 0
    return attention_costs.self_pairs(n, causal=stack.causal, block=block)


# ---- building blocks ---------------------------------------------------------------------
@dataclass
class _Ops:
    """Collects OpCosts with the element sizes of the scenario's precision."""

    precision: Precision
    ops: list[OpCost] = field(default_factory=list)

    def linear(self, name, m, k, n, *, bias=True, first=False, dtype=None, params=True,
               weight_left=False, per_output=False) -> None:
        """``[m,k] × [k,n]``; ``first``: the input needs no gradient (one backward matmul).

        The weight is the right ``[k,n]`` operand (a Linear), or the left ``[m,k]`` one with
        ``weight_left`` (token-mixing matmuls: ``W [m,k]`` times activations ``[k, B·d]``);
        ``per_output``: it is ``n`` Linear(k→1), one per output (the task heads).
        """
        dtype = _linear_dtype(name, dtype or self.precision.mlp, m, k, n, params and not weight_left and not per_output)
        e = ELEM_BYTES[dtype]
        f = 2.0 * m * k * n
        io = e * (m * k + k * n + m * n)
        shapes = _linear_shapes(m, k, n, bias, weight_left, per_output) if params else ()
        self.ops.append(
            OpCost(name, _layer(name), OpClass.GEMM, dtype, Cost(f, f if first else 2 * f, io, 2 * io),
                   _numel(shapes), act_bytes=_out_elem(dtype) * m * n, param_shapes=shapes,
                   mkn=(float(m), float(k), float(n)))
        )  # fmt: skip

    def norm(self, name, rows, width) -> None:
        self.ops.append(self._norm_op(name, rows, width))

    def _norm_op(self, name, rows, width, fused: bool = False) -> OpCost:
        """A LayerNorm of ``rows × width``. ``fused``: taken into the blockwise-fp8 quantizer of the
        Linears it feeds (``kernels.fp8block.linear.normed`` / ``fp8_block_ffn``): its forward reads
        its input once for the statistics and writes no output (the quantizer's read of the input is
        in the fp8 GEMM's measured price), and autograd keeps only the statistics."""
        e = ELEM_BYTES["bf16" if self.precision.mlp != "fp32" else "fp32"]
        b = e * rows * width
        return OpCost(name, _layer(name), OpClass.NORM, "fp32", Cost(0, 0, b if fused else 2 * b, 3 * b), 2 * width,
                      act_bytes=(0.0 if fused else b) + 8.0 * rows,  # output + fp32 mean, rstd
                      param_shapes=((width,), (width,)))  # fmt: skip

    def fuse_norm(self, norm: str, rows, width, *linears: str) -> None:
        """The norm ``norm`` (``rows × width``) as the executor runs it where every Linear in
        ``linears`` (the ones it feeds) is blockwise fp8: fused (``_norm_op``). Call it after them."""
        if self.precision.mlp not in ("fp8_block", "auto"):
            return
        at = {}  # the norm and its Linears are among the layer's last ops: look back from the end
        for i in range(len(self.ops) - 1, -1, -1):
            if self.ops[i].name in (norm, *linears):
                at[self.ops[i].name] = i
                if len(at) == 1 + len(linears):
                    break
        if all(self.ops[at[n]].dtype == "fp8_block" for n in linears):
            self.ops[at[norm]] = self._norm_op(norm, rows, width, fused=True)

    def elementwise(self, name, elems, *, reads=1, writes=1) -> None:
        e = ELEM_BYTES["bf16" if self.precision.mlp != "fp32" else "fp32"]
        b = e * elems * (reads + writes)
        self.ops.append(OpCost(name, _layer(name), OpClass.ELEMENTWISE, "fp32", Cost(0, 0, b, 1.5 * b),
                               act_bytes=e * elems * writes))

    def attention(self, name, *, pairs, q_tokens, kv_tokens, heads, head_dim, kind, samples) -> None:
        dtype = self.precision.attention
        c = attention_cost(
            pairs=pairs, q_tokens=q_tokens, kv_tokens=kv_tokens, heads=heads,
            head_dim=head_dim, elem_bytes=ELEM_BYTES[dtype],
        )  # fmt: skip
        self.ops.append(
            OpCost(name, _layer(name), OpClass.ATTENTION, dtype, Cost.of(c), attention=AttentionKind(kind),
                   act_bytes=q_tokens * heads * (head_dim * _out_elem(dtype) + 4.0),  # O, lse
                   segments=float(samples * heads))
        )  # fmt: skip

    def lookup(self, name, fam: TableFamily, ids: float, bags: float) -> None:
        """Embedding rows read forward; backward writes the rows and their Adagrad state."""
        e = ELEM_BYTES[self.precision.embeddings]
        fwd = ids * fam.dim * e + bags * fam.dim * e
        bwd = bags * fam.dim * e + ids * (2 * fam.dim * e + 8)
        self.ops.append(
            OpCost(name, _layer(name), OpClass.EMBEDDING, self.precision.embeddings, Cost(0, 0, fwd, bwd),
                   0, fam.params, ids, bags, fam.dim * e, act_bytes=bags * fam.dim * e,
                   sparse_shapes=((fam.rows, fam.dim),) * fam.count)
        )  # fmt: skip


def _linear_dtype(name: str, dtype: str, m: float, k: int, n: int, linear: bool) -> str:
    """The dtype a matmul runs in, as the executor converts its layers (``executor.parallelize``):
    ``fp8_block`` and ``auto`` apply to the ``nn.Linear`` layers only (not the token-mixing
    matmuls, the task heads or MoE routers and experts), whose widths are multiples of 128; ``auto``
    only where the measured table says the shape pays (``kernels.fp8block.table``); the rest bf16."""
    if dtype not in ("fp8_block", "auto"):
        return dtype
    if not linear or name.endswith("router") or not eligible(int(k), int(n)):
        return "bf16"
    return "fp8_block" if dtype == "fp8_block" or pays(m, k, n) else "bf16"


def _linear_shapes(m, k, n, bias: bool, weight_left: bool, per_output: bool) -> tuple[Shape, ...]:
    if per_output:
        return ((k, 1),) * n + (((1,),) * n if bias else ())
    return ((m, k) if weight_left else (k, n),) + (((n,),) if bias else ())


def _numel(shapes: tuple[Shape, ...]) -> int:
    total = 0
    for shape in shapes:
        n = 1
        for x in shape:
            n *= x
        total += n
    return total


def _out_elem(dtype: str) -> float:  # fp8_block and mxfp8 matmuls write bf16
    """Bytes per output element of a matmul: bf16 and MXFP8 matmuls write bf16."""
    return ELEM_BYTES["fp32" if dtype == "fp32" else "bf16"]


def _layer(name: str) -> str:
    return name.split(".")[0]


def _mlp(ops: _Ops, prefix: str, rows: float, widths: list[int], d_in: int, *, first=False):
    for i, w in enumerate(widths):
        ops.linear(f"{prefix}.{i}", rows, d_in, w, first=first and i == 0)
        ops.elementwise(f"{prefix}.{i}.act", rows * w)
        d_in = w
    return d_in


# ---- GEM -----------------------------------------------------------------------------------
def _gem_inputs(ops: _Ops, m: GEMModel, B: int, seq: SeqStats) -> None:
    _mlp(ops, "bottom", B, m.bottom_mlp, m.dense_features, first=True)
    for fam in m.embeddings.pooled:
        ops.lookup(f"emb.{fam.name}", fam, B * fam.count * fam.pooling.expected, B * fam.count)
        if fam.dim != m.d_model:
            ops.linear(f"pooled_proj.{fam.name}", B * fam.count, fam.dim, m.d_model)
    for g, tokens in zip(m.embeddings.sequences, seq.group_tokens):
        for fam in g.tables:
            ops.lookup(f"emb.{g.name}.{fam.name}", fam, tokens * fam.count, tokens * fam.count)
        width = sum(f.count * f.dim for f in g.tables)
        ops.linear(f"seq_in.{g.name}", tokens, width, m.d_model)
    t0 = 1 + sum(f.count for f in m.embeddings.pooled)
    ops.linear("compress.in", m.nonseq.num_tokens, t0, B * m.d_model, bias=False, weight_left=True)


def _seq_layer(ops: _Ops, m: GEMModel, i: int, seq: SeqStats) -> None:
    s, d, T = m.sequence, m.d_model, seq.tokens
    hd = s.heads * s.head_dim
    ops.norm(f"seq{i}.norm1", T, d)
    ops.linear(f"seq{i}.qkv", T, d, 3 * hd, bias=False)
    ops.attention(f"seq{i}.attn", pairs=seq.self_pairs, q_tokens=T, kv_tokens=T,
                  heads=s.heads, head_dim=s.head_dim, kind=s.attention, samples=seq.batch)  # fmt: skip
    ops.linear(f"seq{i}.out", T, hd, d, bias=False)
    ops.elementwise(f"seq{i}.residual1", T * d, reads=2)
    ops.norm(f"seq{i}.norm2", T, d)
    ops.linear(f"seq{i}.mlp_up", T, d, s.ffn_mult * d)
    ops.elementwise(f"seq{i}.mlp_act", T * s.ffn_mult * d)
    ops.linear(f"seq{i}.mlp_down", T, s.ffn_mult * d, d)
    ops.elementwise(f"seq{i}.residual2", T * d, reads=2)
    ops.fuse_norm(f"seq{i}.norm1", T, d, f"seq{i}.qkv")
    ops.fuse_norm(f"seq{i}.norm2", T, d, f"seq{i}.mlp_up", f"seq{i}.mlp_down")


def _nonseq_layer(ops: _Ops, m: GEMModel, i: int, B: int) -> None:
    w, d = m.nonseq, m.d_model
    N, F, k, rows = w.num_tokens, w.fm_tokens, w.fm_rank, B * w.num_tokens
    ops.norm(f"ns{i}.norm", rows, d)
    ops.linear(f"ns{i}.fm_proj", B * d, N, k, bias=False)
    ops.linear(f"ns{i}.fm_inter", B * N, d, k, bias=False, params=False)
    ops.norm(f"ns{i}.fm_norm", B, N * k)
    ops.linear(f"ns{i}.fm_mlp1", B, N * k, w.fm_mlp_hidden)
    ops.elementwise(f"ns{i}.fm_act", B * w.fm_mlp_hidden)
    ops.linear(f"ns{i}.fm_mlp2", B, w.fm_mlp_hidden, F * d)
    ops.linear(f"ns{i}.lcb", N - F, N, B * d, bias=False, weight_left=True)
    ops.elementwise(f"ns{i}.residual1", rows * d, reads=2)
    ops.norm(f"ns{i}.ffn_norm", rows, d)
    if m.moe.num_experts:
        e = m.moe
        routed = routed_tokens(m, B)  # B·N·top_k (token, expert) pairs
        ops.linear(f"ns{i}.router", rows, d, e.num_experts, bias=False)
        ops.linear(f"ns{i}.experts_up", routed, d, e.expert_hidden, params=False)
        ops.elementwise(f"ns{i}.experts_act", routed * e.expert_hidden)
        ops.linear(f"ns{i}.experts_down", routed, e.expert_hidden, d, params=False)
        _add_expert_params(ops, f"ns{i}", e.num_experts, d, e.expert_hidden)
        ops.elementwise(f"ns{i}.combine", routed * d, reads=2)
    else:
        ops.linear(f"ns{i}.ffn_up", rows, d, w.ffn_hidden)
        ops.elementwise(f"ns{i}.ffn_act", rows * w.ffn_hidden)
        ops.linear(f"ns{i}.ffn_down", rows, w.ffn_hidden, d)
        ops.fuse_norm(f"ns{i}.ffn_norm", rows, d, f"ns{i}.ffn_up", f"ns{i}.ffn_down")
    ops.elementwise(f"ns{i}.residual2", rows * d, reads=2)


def _add_expert_params(ops: _Ops, layer: str, experts: int, d: int, hidden: int) -> None:
    """Expert weights belong to the expert ops; record them on the up op, stacked over the experts
    as the executor holds them (``executor.moe.GroupedExperts``: w1, b1, w2, b2)."""
    shapes = ((experts, hidden, d), (experts, hidden), (experts, d, hidden), (experts, d))
    ops.ops[-3] = replace(ops.ops[-3], params=_numel(shapes), param_shapes=shapes)


def _cross_layer(ops: _Ops, m: GEMModel, j: int, B: int, seq: SeqStats) -> None:
    c, d, T = m.cross, m.d_model, seq.tokens
    hd, rows = c.heads * c.head_dim, B * m.nonseq.num_tokens
    pairs = cross_pairs(m.nonseq.num_tokens, T)  # Σ_b N·L_b, either direction
    for name, q_rows, kv_rows in (("s", T, rows), ("x", rows, T)):
        p = f"cross{j}.{name}"
        ops.norm(f"{p}.norm_q", q_rows, d)
        ops.norm(f"{p}.norm_kv", kv_rows, d)
        ops.linear(f"{p}.q", q_rows, d, hd, bias=False)
        ops.linear(f"{p}.kv", kv_rows, d, 2 * hd, bias=False)
        ops.fuse_norm(f"{p}.norm_q", q_rows, d, f"{p}.q")
        ops.fuse_norm(f"{p}.norm_kv", kv_rows, d, f"{p}.kv")
        ops.attention(f"{p}.attn", pairs=pairs, q_tokens=q_rows, kv_tokens=kv_rows,
                      heads=c.heads, head_dim=c.head_dim, kind="asym", samples=B)  # fmt: skip
        ops.linear(f"{p}.out", q_rows, hd, d, bias=False)
        ops.elementwise(f"{p}.residual", q_rows * d, reads=2)


def cross_positions(m: GEMModel) -> set[int]:
    """Stages after which a cross layer runs (MODEL.md 5)."""
    return set(cross_stages(m))


def _gem(ops: _Ops, m: GEMModel, B: int, seq: SeqStats) -> None:
    _gem_inputs(ops, m, B, seq)
    stages = max(m.sequence.num_layers, m.nonseq.num_layers)
    after = sorted(cross_positions(m)) if m.cross.num_layers else []
    j = 0
    for i in range(stages):
        if i < m.sequence.num_layers:
            _seq_layer(ops, m, i, seq)
        if i < m.nonseq.num_layers:
            _nonseq_layer(ops, m, i, B)
        while j < len(after) and after[j] == i:
            _cross_layer(ops, m, j, B, seq)
            j += 1
    d_in = m.nonseq.num_tokens * m.d_model + (m.d_model if m.embeddings.sequences else 0)
    d_in = _mlp(ops, "head.mlp", B, m.tasks.mlp, d_in)
    ops.linear("head.tasks", B, d_in, len(m.tasks.names), per_output=True)


# ---- DLRM ----------------------------------------------------------------------------------
def _dlrm(ops: _Ops, m: DLRMModel, B: int) -> None:
    D = _mlp(ops, "bottom", B, m.bottom_mlp, m.dense_features, first=True)
    T = 0
    for fam in m.embeddings.pooled:
        ops.lookup(f"emb.{fam.name}", fam, B * fam.count * fam.pooling.expected, B * fam.count)
        T += fam.count
    if m.interaction == "dot":
        ops.linear("interaction.dot", B * (T + 1), D, T + 1, bias=False, params=False)
        d_in = D + T * (T + 1) // 2
    else:
        n = D * (T + 1)
        for i in range(m.dcn_layers):
            ops.linear(f"dcn{i}.v", B, n, m.dcn_rank, bias=False)
            ops.linear(f"dcn{i}.u", B, m.dcn_rank, n)
            ops.elementwise(f"dcn{i}.cross", B * n, reads=3)
        d_in = n
    d_in = _mlp(ops, "top", B, m.top_mlp, d_in)
    ops.linear("head.tasks", B, d_in, len(m.tasks.names), per_output=True)


# ---- public ----------------------------------------------------------------------------------
def model_costs(
    model: GEMModel | DLRMModel, *, batch: int, precision: Precision | None = None,
    seq: SeqStats | None = None,
) -> list[OpCost]:  # fmt: skip
    """Every op of one micro-batch of ``batch`` samples, in forward order. The same list for the
    same model object and arguments (a plan builds thousands of graphs of one model): do not
    change it."""
    return memo(_COSTS, (model,), (batch, precision, seq), lambda: _model_costs(model, batch, precision, seq),
                cap=1024)


_COSTS: dict = {}  # scenarios.memo's table


def _model_costs(model, batch: int, precision: Precision | None, seq: SeqStats | None) -> list[OpCost]:
    ops = _Ops(precision or Precision())
    if isinstance(model, DLRMModel):
        _dlrm(ops, model, batch)
    else:
        _gem(ops, model, batch, seq or SeqStats.expected(model, batch))
    return ops.ops


def step_flops(
    model: GEMModel | DLRMModel, *, batch: int, lengths: list[int] | None = None,
    group_lengths: list[list[int]] | None = None,
) -> float:  # fmt: skip
    """Model FLOPs (forward + backward) of one micro-batch.

    Give the real lengths of a batch as ``group_lengths[g][b]`` (or ``lengths[b]`` when the model
    has one sequence group); without them, the expectation over the scenario's length laws.
    """
    seq = None
    if lengths is not None and group_lengths is None:
        if len(model.embeddings.sequences) != 1:
            raise ValueError("lengths is for one sequence group; pass group_lengths instead")
        group_lengths = [list(lengths)]
    if group_lengths is not None:
        seq = SeqStats.from_lengths(model, group_lengths)
    return sum(op.flops for op in model_costs(model, batch=batch, seq=seq))
