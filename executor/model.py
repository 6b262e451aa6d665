"""The GEM model and the classic DLRM, single device, exactly as ``executor/MODEL.md`` says.

``build_model(scenario)`` returns a ``GEMModule`` or a ``DLRMModule``; ``forward(batch)``
returns ``(logits [B, tasks], aux_loss)`` and ``compute_loss`` adds the BCE. Every matmul of
MODEL.md is an explicit ``mm``/``bmm``/``linear`` (no ``einsum``: it lowers size-1
contractions to ``mul``+``sum``, which ``FlopCounterMode`` does not count), and nothing else is
a matmul, so the FLOP counter agrees with the analytic count in ``twin/flops.py``.

Precision (``scenario.precision``): ``mlp`` bf16 runs the forward under ``torch.autocast``
(bf16); ``attention`` bf16 casts q, k, v to bf16 inside attention; ``embeddings`` bf16 stores
the tables in bf16. ``mxfp8`` runs everything else as bf16 and: ``mlp: mxfp8`` replaces the
``nn.Linear`` layers (all but the task heads and the MoE router) by ``kernels.mxfp8.MXFP8Linear``
(forward, dgrad and wgrad in MXFP8, with a per-layer guard that falls back to bf16);
``attention: mxfp8`` runs GDPA's Q·Kᵀ and P·V in MXFP8 (``kernels.mxfp8.gdpa``; other attention
kinds stay bf16).
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from executor.attention import (
    ATTENTION_KERNELS, attention_in_graph, cross_attention, jagged_attention, packed_cross_attention,
    packed_self_attention, use_triton,
)
from executor.data import Batch, TableGroup, pooled_table_groups, sequence_table_groups
from executor.env import env_choice
from kernels.embedding.layout import FusedTables
from kernels.jfa.registration import dense_offsets
from scenarios.schema import DLRMModel, Embeddings, GEMModel, Scenario, SequenceGroup
from scenarios.schema import MoE as MoEConfig


def build_model(scenario: Scenario) -> GEMModule | DLRMModule:
    """The single-device model of ``scenario.model``, with ``scenario.training.seed`` init."""
    torch.manual_seed(scenario.training.seed)
    m = scenario.model
    model = GEMModule(m, scenario.precision) if m.kind == "gem" else DLRMModule(m, scenario.precision)
    if scenario.precision.embeddings == "bf16":
        for mod in model.modules():
            if isinstance(mod, _FusedTableModule):
                mod.cast_tables(torch.bfloat16)
    if scenario.precision.mlp == "mxfp8":
        from kernels.mxfp8.linear import convert

        convert(model, skip=lambda name, lin: name.startswith("heads.") or name.endswith(".router"))
    if isinstance(model, GEMModule):
        model.set_checkpointing(scenario.parallelism.activation_checkpointing)
    return model


def compute_loss(logits: Tensor, labels: Tensor, aux: Tensor | float = 0.0) -> Tensor:
    """Mean over tasks of BCE-with-logits, plus the MoE load-balancing loss ``aux``."""
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float()) + aux


def _lowp(dtype: str) -> bool:
    return dtype in ("bf16", "mxfp8")  # mxfp8: bf16 around the MXFP8 matmuls


def mlp(widths: list[int], d_in: int, *, relu_last: bool) -> nn.Sequential:
    """Linear layers of ``widths``, ReLU between them (and after the last if ``relu_last``)."""
    layers: list[nn.Module] = []
    for i, w in enumerate(widths):
        layers.append(nn.Linear(d_in, w))
        if relu_last or i < len(widths) - 1:
            layers.append(nn.ReLU())
        d_in = w
    return nn.Sequential(*layers)


class TaskHeads(nn.Module):
    """One ``Linear(→1)`` per task, concatenated to ``[B, tasks]``."""

    def __init__(self, d_in: int, num_tasks: int):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(d_in, 1) for _ in range(num_tasks))

    def forward(self, z: Tensor) -> Tensor:
        return torch.cat([h(z) for h in self.heads], dim=1)


EMBEDDING_KERNELS = ("auto", "triton", "torch")


def default_embedding_kernel() -> str:
    """``$GEMTWIN_EMBEDDING_KERNEL`` (auto | triton | torch), default auto: Triton on CUDA, torch on CPU."""
    return env_choice("GEMTWIN_EMBEDDING_KERNEL", EMBEDDING_KERNELS)


FFN_KERNELS = ("auto", "triton", "torch")


def default_ffn_kernel() -> str:
    """``$GEMTWIN_FFN_KERNEL`` (auto | triton | torch), default auto: the sequence FFN's bias and
    GELU in one Triton op (``kernels.ffn.bias_gelu``: its backward gives the bias gradient in the
    same pass and reuses the kept GELU output) on CUDA; ``F.gelu(ffn1(x))`` on CPU and with torch."""
    return env_choice("GEMTWIN_FFN_KERNEL", FFN_KERNELS)


def set_embedding_kernel(model: nn.Module, kind: str) -> None:
    """Pick the embedding lookups of every table module of ``model``: auto, triton or torch."""
    if kind not in EMBEDDING_KERNELS:
        raise ValueError(f"embedding kernel '{kind}': use auto, triton or torch")
    for mod in model.modules():
        if isinstance(mod, _FusedTableModule):
            mod.kernel = kind


def set_attention_kernel(model: nn.Module, kind: str) -> None:
    """Pick the attention of every sequence and cross layer: auto, triton or reference
    (``executor.attention``; default ``$GEMTWIN_ATTENTION_KERNEL`` or auto)."""
    if kind not in ATTENTION_KERNELS:
        raise ValueError(f"attention kernel '{kind}': use auto, triton or reference")
    for mod in model.modules():
        if isinstance(mod, (SequenceLayer, CrossLayer)):
            mod.attention_kernel = kind


def compile_dense(model: nn.Module, *, mode: str | None = None) -> list[str]:
    """``torch.compile`` every dense block of ``model`` (sequence, non-sequence and cross layers,
    bottom and top MLPs), in place; returns the names of the compiled modules.

    Dynamic shapes (ΣL changes with every batch), so one graph serves all batches. The Triton
    attention is a torch.library op (``gemtwin::packed_<kind>_fwd``/``_bwd``) that the graphs
    call like any kernel, so a layer is one graph forward and one backward; the reference and
    MXFP8 attention (which sync with the host) and the embedding lookups stay eager between
    graphs. What compiling buys is fusion of the norms, activations, casts and residual adds
    around the matmuls and the attention (and of their gradients)."""
    tuned = max_autotune_blocks()
    names = []
    for name, mod in model.named_modules():
        kind = _block_kind(name, mod)
        if kind is not None:
            mod.compile(dynamic=True, mode="max-autotune-no-cudagraphs" if kind in tuned else mode)
            names.append(name)
    return names


BLOCK_KINDS = ("sequence", "nonsequence", "cross", "mlp")


def _block_kind(name: str, mod: nn.Module) -> str | None:
    if isinstance(mod, SequenceLayer):
        return "sequence"
    if isinstance(mod, NonSequenceLayer):
        return "nonsequence"
    if isinstance(mod, CrossLayer):
        return "cross"
    return "mlp" if name in ("bottom", "top") else None


def max_autotune_blocks() -> set[str]:
    """``$GEMTWIN_MAX_AUTOTUNE``: comma-separated block kinds (sequence, nonsequence, cross, mlp)
    that ``compile_dense`` compiles with ``mode="max-autotune-no-cudagraphs"``, so that Inductor
    may pick its Triton GEMM templates and fuse the pointwise work around a matmul (the FFN's
    GELU, its derivative) into the GEMM's epilogue. Default none: autotuning costs compile time."""
    raw = os.environ.get("GEMTWIN_MAX_AUTOTUNE", "")
    kinds = {k.strip() for k in raw.split(",") if k.strip()}
    bad = sorted(kinds - set(BLOCK_KINDS))
    if bad:
        raise ValueError(f"GEMTWIN_MAX_AUTOTUNE = '{raw}': '{bad[0]}' is not a block kind; use a comma-separated "
                         f"subset of {', '.join(BLOCK_KINDS)}")
    return kinds


class _FusedTableModule(nn.Module):
    """Tables of one dim share one buffer (``kernels.embedding.layout.FusedTables``), each table's
    weight a view of it, so that the Triton TBE looks them all up in one launch. The views are
    initialised like ``nn.Embedding``'s own (``normal_``, in config order: the same values)."""

    def _make_tables(self, families, groups: list[TableGroup], make) -> nn.ModuleDict:
        self.kernel = default_embedding_kernel()
        self.table_groups = groups
        self.fused = [FusedTables(g.rows, g.dim) for g in groups]
        views = {n: v for g, f in zip(groups, self.fused) for n, v in zip(g.names, f.views())}
        tables = {}
        for fam in families:
            for name in fam.table_names():
                with torch.no_grad():
                    nn.init.normal_(views[name])
                tables[name] = make(fam, views[name])
        return nn.ModuleDict(tables)

    def cast_tables(self, dtype: torch.dtype) -> None:
        """Store the tables in ``dtype`` (the buffer is re-made; the weights point into it again)."""
        for g, f in zip(self.table_groups, self.fused):
            f.cast(dtype)
            for name, view in zip(g.names, f.views()):
                self.tables[name].weight = nn.Parameter(view)

    def _weights(self, g: TableGroup) -> list[Tensor]:
        return [self.tables[n].weight for n in g.names]

    def use_triton(self, device: torch.device) -> bool:
        if self.kernel == "torch" or (self.kernel == "auto" and device.type != "cuda"):
            return False
        if all(f.holds(self._weights(g)) for g, f in zip(self.table_groups, self.fused)):
            return True
        msg = ("the embedding tables no longer share their fused buffer (moved or cast after build_model?); "
               "build the model on its device with build_model, or use the torch embedding kernel")
        if self.kernel == "triton":
            raise ValueError(msg)
        if not getattr(self, "_warned", False):
            warnings.warn(msg + ": falling back to torch", stacklevel=2)
            self._warned = True
        return False


class PooledTables(_FusedTableModule):
    """One ``EmbeddingBag(mode="sum", sparse=True)`` per pooled table; returns ``[B, dim]`` each
    (Triton: one TBE launch per dim, ``kernels.embedding.tbe.pooled_lookup``)."""

    def __init__(self, embeddings: Embeddings):
        super().__init__()
        self.family_cfg = list(embeddings.pooled)
        self.tables = self._make_tables(
            embeddings.pooled, pooled_table_groups(embeddings),
            lambda fam, w: nn.EmbeddingBag(fam.rows, fam.dim, mode="sum", sparse=True, include_last_offset=True,
                                           _weight=w),
        )

    def forward(self, batch: Batch) -> dict[str, Tensor]:
        """``{table: [B, dim]}``."""
        if not self.use_triton(batch.dense.device):
            return {name: t(*batch.pooled[name]).float() for name, t in self.tables.items()}
        out = {}
        for g, y in zip(self.table_groups, self._grouped(batch)):
            out.update({n: y[:, i] for i, n in enumerate(g.names)})
        return {name: out[name] for name in self.tables}

    def families(self, batch: Batch) -> list[Tensor]:
        """``[B, count, dim]`` per pooled family, in config order. With the Triton lookups a
        family is a ``split`` of its dim group's output (a group holds its families' tables
        consecutively, in config order), whose backward is one ``cat``, rather than a stack of
        per-table selects, whose backward zero-fills and copies once per table."""
        fams = self.family_cfg
        if not self.use_triton(batch.dense.device):
            pooled = self(batch)
            return [torch.stack([pooled[n] for n in fam.table_names()], dim=1) for fam in fams]
        parts = {}
        for g, y in zip(self.table_groups, self._grouped(batch)):
            members = [fam for fam in fams if fam.dim == g.dim]
            parts.update(zip((f.name for f in members), torch.split(y, [f.count for f in members], dim=1)))
        return [parts[fam.name] for fam in fams]

    def _grouped(self, batch: Batch) -> list[Tensor]:
        """One ``[B, tables, dim]`` per dim group (one TBE launch each)."""
        from kernels.embedding.tbe import pooled_lookup

        B = batch.size
        return [pooled_lookup(f, self._weights(g), *batch.pooled_packed(g), B).view(B, len(g.names), g.dim)
                for g, f in zip(self.table_groups, self.fused)]


class SequenceGroupTokens(_FusedTableModule):
    """Per token, one lookup per table; concatenated ``[ΣL_g, D_g]`` → ``Linear(D_g→d)``
    (Triton: one unpooled TBE launch per dim, ``kernels.embedding.tbe.unpooled_lookup``)."""

    def __init__(self, group: SequenceGroup, d: int):
        super().__init__()
        self.name = group.name
        self.tables = self._make_tables(
            group.tables, sequence_table_groups(group), lambda fam, w: nn.Embedding(fam.rows, fam.dim, sparse=True,
                                                                                    _weight=w),
        )
        self.width = sum(t.embedding_dim for t in self.tables.values())
        self.proj = nn.Linear(self.width, d)
        self._cols: dict[torch.device, list[Tensor]] = {}

    def forward(self, batch: Batch) -> Tensor:
        ids = batch.sequences[self.name].ids
        device = batch.dense.device
        if not self.use_triton(device):
            return self.proj(torch.cat([t(ids[name]).float() for name, t in self.tables.items()], dim=1))
        from kernels.embedding.tbe import unpooled_lookup

        if device not in self._cols:
            self._cols[device] = [torch.tensor(g.cols, dtype=torch.int64, device=device) for g in self.table_groups]
        spec = [(f, cols, self._weights(g), batch.sequence_packed(self.name, g))
                for g, f, cols in zip(self.table_groups, self.fused, self._cols[device])]
        # rows: the packed ids' width, ΣL_g or, in a static-shape batch, ΣL_g rounded up (padding)
        return self.proj(unpooled_lookup(spec, spec[0][3].shape[1], self.width))


# ---- GEM ---------------------------------------------------------------------------------------
class SequenceLayer(nn.Module):
    """Pre-norm transformer layer over the jagged sequence ``S [ΣL, d]``."""

    def __init__(self, m: GEMModel, attention_dtype: torch.dtype, mxfp8: bool = False):
        super().__init__()
        c, d = m.sequence, m.d_model
        self.cfg, self.dtype = c, attention_dtype
        self.mxfp8 = mxfp8 and c.attention == "gdpa"  # MXFP8 Q·Kᵀ and P·V (kernels.mxfp8.gdpa)
        self.attention_kernel: str | None = None  # None: $GEMTWIN_ATTENTION_KERNEL or auto
        self.recompute_attention = False  # activation_checkpointing: selective
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * c.heads * c.head_dim, bias=False)
        self.out = nn.Linear(c.heads * c.head_dim, d, bias=False)
        self.ffn1, self.ffn2 = nn.Linear(d, c.ffn_mult * d), nn.Linear(c.ffn_mult * d, d)
        self.ffn_kernel = default_ffn_kernel()

    def forward(self, S: Tensor, offsets: Tensor, max_len: int) -> Tensor:
        """``S [rows, d]``: the samples' tokens (``offsets``), then any padding rows of a
        static-shape batch, which attention neither reads nor writes (its output there is zero)."""
        c = self.cfg
        qkv = self.qkv(self.ln1(S)).view(-1, 3, c.heads, c.head_dim).to(self.dtype)
        if not self.mxfp8 and use_triton(self.attention_kernel, S.device):  # an op: compiled with the layer
            attend = packed_self_attention if attention_in_graph() else _packed_self_eager
            a = attend(qkv, offsets, kind=c.attention, causal=c.causal, block_size=c.block_size,
                       activation=c.gdpa_activation, max_len=max_len, recompute=self.recompute_attention)
        else:
            with torch.autocast(S.device.type, enabled=False):
                a = _self_attention(qkv, offsets, c, max_len, self.attention_kernel, self.mxfp8,
                                    self.recompute_attention)
        S = S + self.out(a.reshape(-1, c.heads * c.head_dim).to(S.dtype))  # attention may run lower than the MLPs
        return S + self.ffn2(self._ffn1_gelu(self.ln2(S)))

    def _ffn1_gelu(self, x: Tensor) -> Tensor:
        """``gelu(ffn1(x))``: on CUDA (``ffn_kernel`` auto or triton) the matmul without its bias,
        then the bias and GELU in one op (``kernels.ffn.bias_gelu``); an MXFP8 ffn1 keeps its own
        path."""
        lin = self.ffn1
        fused = self.ffn_kernel == "triton" or (self.ffn_kernel == "auto" and x.is_cuda)
        if fused and type(lin) is nn.Linear and lin.bias is not None:
            from kernels.ffn.bias_gelu import bias_gelu

            return bias_gelu(F.linear(x, lin.weight), lin.bias)  # x: [rows, d]
        return F.gelu(lin(x))


@torch.compiler.disable  # eager between the compiled graphs (compile_dense)
def _self_attention(qkv: Tensor, offsets: Tensor, c, max_len: int, kernel: str | None, mxfp8: bool,
                    recompute: bool = False) -> Tensor:
    """Attention over the packed ``qkv [rows, 3, H, D]`` where it is not the Triton kernels' op
    (``packed_self_attention``, which the layer calls itself, inside its compiled graph): the
    reference, or MXFP8 GDPA, outside any compiled graph (the reference syncs with the host).
    Rows past ``offsets[-1]`` (padding) get zero outputs and zero gradients. ``recompute``
    (activation checkpointing "selective"): keep q, k, v only and run the attention forward again
    in backward where the backward needs its output."""
    q, k, v = qkv.unbind(1)
    attend = _gdpa_mxfp8 if mxfp8 else jagged_attention

    def run(q, k, v):
        return attend(q, k, v, offsets, kind=c.attention, causal=c.causal, block_size=c.block_size,
                      activation=c.gdpa_activation, max_len=max_len, kernel=kernel)

    # MXFP8 GDPA on the flash kernels needs no forward output in backward either: no recompute
    return _maybe_checkpoint(recompute and not (mxfp8 and use_triton(kernel, qkv.device)), run, q, k, v)


def _maybe_checkpoint(recompute: bool, fn, *args: Tensor):
    """``fn(*args)``, its activations recomputed in backward when ``recompute`` and autograd records."""
    if recompute and torch.is_grad_enabled() and any(a.requires_grad for a in args):
        # no RNG in the model's forward: nothing to replay, and no RNG state read (which a CUDA
        # graph capture forbids)
        return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)
    return fn(*args)


def _cross_attention(q: Tensor, kv: Tensor, offsets: Tensor, jagged: str, max_len: int, kernel: str | None,
                     recompute: bool = False, dense_off: Tensor | None = None) -> Tensor:
    """Cross attention with ``kv`` packed (``[B, N, 2, H, D]`` dense or ``[rows, 2, H, D]`` jagged).
    The jagged side's rows past ``offsets[-1]`` (padding) are not read; padded query rows get zero
    outputs. On the Triton kernels it is an op inside the compiled graph, and the gradient of
    ``kv`` comes back whole (``packed_cross_attention``); the reference runs eagerly."""
    if use_triton(kernel, q.device):
        attend = packed_cross_attention if attention_in_graph() else _packed_cross_eager
        return attend(q, kv, offsets, jagged=jagged, max_len=max_len, recompute=recompute, dense_off=dense_off)
    return _cross_reference(q, kv, offsets, jagged, max_len, kernel, recompute)


_packed_self_eager = torch.compiler.disable(packed_self_attention)  # $GEMTWIN_ATTENTION_IN_GRAPH=0
_packed_cross_eager = torch.compiler.disable(packed_cross_attention)


@torch.compiler.disable  # eager between the compiled graphs: the reference syncs with the host
def _cross_reference(q: Tensor, kv: Tensor, offsets: Tensor, jagged: str, max_len: int, kernel: str | None,
                     recompute: bool) -> Tensor:
    k, v = kv.unbind(-3)
    return _maybe_checkpoint(recompute, lambda q, k, v: cross_attention(
        q, k, v, offsets, jagged=jagged, max_len=max_len, kernel=kernel), q, k, v)


@torch.compiler.disable
def _gdpa_mxfp8(q, k, v, offsets, *, causal, activation, max_len, kernel=None, **_):
    """MXFP8 GDPA: on the flash kernels where the Triton attention runs (``use_triton``), else the
    padded PyTorch emulation (``kernels.mxfp8.gdpa``)."""
    from kernels.mxfp8.gdpa import gdpa_mxfp8

    return gdpa_mxfp8(q, k, v, offsets, causal=causal, activation=activation, max_len=max_len,
                      triton=use_triton(kernel, q.device))


class MoE(nn.Module):
    """Top-k routed experts ``Linear(d→He) → GELU → Linear(He→d)``, each run on its tokens only."""

    def __init__(self, d: int, cfg: MoEConfig):
        super().__init__()
        self.top_k = cfg.top_k
        self.grouped: bool | None = None  # None: grouped matmuls on CUDA, a loop over experts elsewhere
        self.router = nn.Linear(d, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, cfg.expert_hidden), nn.GELU(), nn.Linear(cfg.expert_hidden, d))
            for _ in range(cfg.num_experts)
        )

    def route(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(gates [T, k], experts [T, k], probs [T, E])``: softmax, top-k, gates renormalised."""
        logits = self.router(h)
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        gates, experts = probs.topk(self.top_k, dim=-1)
        return gates / gates.sum(-1, keepdim=True), experts, probs

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``h [T, d]`` → ``(Σ_k gate · expert(h), aux)``; aux = Switch ``E · Σ_e f_e · P_e``."""
        gates, experts, probs = self.route(h)
        E, T = len(self.experts), h.shape[0]
        flat_e, flat_g = experts.reshape(-1), gates.reshape(-1)
        dtype = torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else h.dtype
        grouped = self.grouped
        if grouped is None:  # cuBLAS grouped GEMM takes bf16 on Hopper
            grouped = h.is_cuda and dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
        out = self._grouped(h, flat_e, flat_g, dtype) if grouped else self._looped(h, flat_e, flat_g, probs.dtype)
        f = _counts(flat_e, E).to(probs.dtype) / max(T * self.top_k, 1)  # share of assignments
        aux = E * (f * probs.mean(0)).sum()
        return out.to(probs.dtype), aux

    def _looped(self, h: Tensor, flat_e: Tensor, flat_g: Tensor, dtype: torch.dtype) -> Tensor:
        """One expert at a time on its tokens (``nonzero``: a host sync per expert)."""
        token = torch.arange(h.shape[0], device=h.device).repeat_interleave(self.top_k)
        out = h.new_zeros(h.shape, dtype=dtype)
        for e, expert in enumerate(self.experts):
            sel = torch.nonzero(flat_e == e).squeeze(1)
            if len(sel):
                rows = token.index_select(0, sel)
                y = expert(h.index_select(0, rows)).to(out.dtype) * flat_g.index_select(0, sel)[:, None]
                out = out.index_add(0, rows, y)
        return out

    def _grouped(self, h: Tensor, flat_e: Tensor, flat_g: Tensor, dtype: torch.dtype) -> Tensor:
        """All experts in two grouped matmuls (``torch._grouped_mm``) over the assignments sorted
        by expert: no host sync, one launch per matmul instead of one per expert."""
        order = torch.argsort(flat_e, stable=True)
        inv = torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=order.device))
        e_of = flat_e.index_select(0, order)
        offs = torch.cumsum(_counts(flat_e, len(self.experts)), 0).to(torch.int32)
        first, second = zip(*((ex[0], ex[2]) for ex in self.experts))
        w1 = torch.stack([lin.weight for lin in first]).to(dtype)  # [E, He, d]
        w2 = torch.stack([lin.weight for lin in second]).to(dtype)  # [E, d, He]
        b1 = torch.stack([lin.bias for lin in first]).to(dtype)
        b2 = torch.stack([lin.bias for lin in second]).to(dtype)
        # each token's k copies, in expert order; gathers both ways (no index_add: atomics)
        T, d = h.shape
        x = _Permute.apply(h.to(dtype).unsqueeze(1).expand(T, self.top_k, d).reshape(-1, d), order, inv)
        # biases as one-hot matmuls: their backward is a matmul, not an index_add of every
        # assignment into E rows (atomics on a handful of addresses)
        onehot = (e_of[:, None] == torch.arange(len(self.experts), device=h.device)).to(dtype)  # [T·k, E]
        z = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs) + onehot @ b1
        y = torch._grouped_mm(F.gelu(z), w2.transpose(-2, -1), offs=offs) + onehot @ b2
        y = y.float() * _Permute.apply(flat_g, order, inv)[:, None].float()
        return _Permute.apply(y, inv, order).view(T, self.top_k, d).sum(1)  # back in token order, k summed


def _counts(ids: Tensor, n: int) -> Tensor:
    """``bincount(ids, minlength=n)`` for ids in ``[0, n)`` as a one-hot sum: no host sync
    (``bincount`` reads the max id to size its output) and no ``index_add`` (compiled, a sort-based
    deterministic index_put: 0.26 ms per MoE layer on the H200, s5-graphs.top.txt)."""
    return (ids.unsqueeze(1) == torch.arange(n, device=ids.device)).sum(0)


class _Permute(torch.autograd.Function):
    """``x.index_select(0, perm)`` whose backward gathers by the inverse permutation ``inv``
    instead of ``index_add`` (atomics) — rows move, nothing accumulates."""

    @staticmethod
    def forward(ctx, x: Tensor, perm: Tensor, inv: Tensor) -> Tensor:
        ctx.save_for_backward(inv)
        return x.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (inv,) = ctx.saved_tensors
        return grad.index_select(0, inv), None, None


class NonSequenceLayer(nn.Module):
    """Wukong layer on ``X [B, N, d]``: FMB + LCB, then the token FFN (MoE or dense)."""

    def __init__(self, m: GEMModel):
        super().__init__()
        c, d, N = m.nonseq, m.d_model, m.nonseq.num_tokens
        self.F, self.d = c.fm_tokens, d
        self.ln, self.ln_ffn, self.ln_fm = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(N * c.fm_rank)
        self.Y = nn.Parameter(torch.randn(N, c.fm_rank) / N**0.5)
        self.fm_mlp = nn.Sequential(
            nn.Linear(N * c.fm_rank, c.fm_mlp_hidden), nn.ReLU(), nn.Linear(c.fm_mlp_hidden, c.fm_tokens * d)
        )
        self.W_L = nn.Parameter(torch.randn(N - c.fm_tokens, N) / N**0.5)
        self.aux_weight = m.moe.aux_loss_weight
        if m.moe.num_experts:
            self.moe, self.ffn = MoE(d, m.moe), None
        else:
            self.moe = None
            self.ffn = nn.Sequential(nn.Linear(d, c.ffn_hidden), nn.GELU(), nn.Linear(c.ffn_hidden, d))

    def forward(self, X: Tensor) -> tuple[Tensor, Tensor]:
        B, N, d = X.shape
        Xn = self.ln(X)
        P = Xn.transpose(1, 2) @ self.Y  # [B, d, k]  (einsum bnd,nk->bdk)
        Z = torch.bmm(Xn, P.to(Xn.dtype)).flatten(1)  # [B, N·k]  (einsum bnd,bdk->bnk)
        fmb = self.fm_mlp(self.ln_fm(Z)).view(B, self.F, d)
        lcb = (Xn.transpose(1, 2) @ self.W_L.t()).transpose(1, 2)  # [B, N-F, d]
        X = X + torch.cat([fmb, lcb.to(fmb.dtype)], dim=1)
        h = self.ln_ffn(X).reshape(B * N, d)
        if self.moe is None:
            return X + self.ffn(h).view(B, N, d), X.new_zeros(())
        y, aux = self.moe(h)
        return X + y.view(B, N, d), self.aux_weight * aux


class CrossLayer(nn.Module):
    """InterFormer exchange, both directions from the same ``S`` and ``X``, softmax, no mask."""

    def __init__(self, m: GEMModel):
        super().__init__()
        d, c = m.d_model, m.cross
        self.H, self.D = c.heads, c.head_dim
        hd = c.heads * c.head_dim
        self.s_ln_q, self.s_ln_kv = nn.LayerNorm(d), nn.LayerNorm(d)  # sequence ← non-sequence
        self.s_q, self.s_kv = nn.Linear(d, hd, bias=False), nn.Linear(d, 2 * hd, bias=False)
        self.s_out = nn.Linear(hd, d, bias=False)
        self.x_ln_q, self.x_ln_kv = nn.LayerNorm(d), nn.LayerNorm(d)  # non-sequence ← sequence
        self.x_q, self.x_kv = nn.Linear(d, hd, bias=False), nn.Linear(d, 2 * hd, bias=False)
        self.x_out = nn.Linear(hd, d, bias=False)
        self.attention_kernel: str | None = None  # None: $GEMTWIN_ATTENTION_KERNEL or auto
        self.recompute_attention = False  # activation_checkpointing: selective

    def forward(self, S: Tensor, X: Tensor, offsets: Tensor, max_len: int,
                dense_off: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``dense_off``: ``X``'s offsets ``arange(B+1)·N`` for the Triton kernels (default: made
        here; ``GEMModule`` passes one tensor to every layer, so the kernels' work lists for it
        are built once per step)."""
        B, N, _ = X.shape
        H, D = self.H, self.D
        q = self.s_q(self.s_ln_q(S)).view(-1, H, D)
        kv = self.s_kv(self.s_ln_kv(X)).view(B, N, 2, H, D)
        a = _cross_attention(q, kv, offsets, "q", max_len, self.attention_kernel, self.recompute_attention,
                             dense_off)
        S_new = S + self.s_out(a.reshape(-1, H * D))
        q = self.x_q(self.x_ln_q(X)).view(B, N, H, D)
        kv = self.x_kv(self.x_ln_kv(S)).view(-1, 2, H, D)
        a = _cross_attention(q, kv, offsets, "kv", max_len, self.attention_kernel, self.recompute_attention,
                             dense_off)
        return S_new, X + self.x_out(a.reshape(B, N, H * D))


def cross_stages(num_stages: int, num_cross: int) -> list[int]:
    """Stages after which a cross layer runs: ``round((j+1)·stages/C) - 1`` (Python ``round``)."""
    return [round((j + 1) * num_stages / num_cross) - 1 for j in range(num_cross)]


class GEMModule(nn.Module):
    def __init__(self, m: GEMModel, precision=None):
        super().__init__()
        self.cfg = m
        d, N = m.d_model, m.nonseq.num_tokens
        self.lowp = precision is not None and _lowp(precision.mlp)
        attn_dtype = torch.bfloat16 if precision is not None and _lowp(precision.attention) else torch.float32
        self.bottom = mlp(m.bottom_mlp, m.dense_features, relu_last=False)
        self.pooled = PooledTables(m.embeddings)
        self.family_proj = nn.ModuleDict(
            {fam.name: nn.Linear(fam.dim, d) for fam in m.embeddings.pooled if fam.dim != d}
        )
        self.groups = nn.ModuleList(SequenceGroupTokens(g, d) for g in m.embeddings.sequences)
        T0 = 1 + sum(fam.count for fam in m.embeddings.pooled)
        self.W_in = nn.Parameter(torch.randn(N, T0) / T0**0.5)
        mx_attn = precision is not None and precision.attention == "mxfp8"
        self.seq_layers = nn.ModuleList(SequenceLayer(m, attn_dtype, mx_attn) for _ in range(m.sequence.num_layers))
        self.nonseq_layers = nn.ModuleList(NonSequenceLayer(m) for _ in range(m.nonseq.num_layers))
        self.num_stages = max(m.sequence.num_layers, m.nonseq.num_layers)
        self.cross_layers = nn.ModuleList(CrossLayer(m) for _ in range(m.cross.num_layers))
        self.cross_after = {s: j for j, s in enumerate(cross_stages(self.num_stages, m.cross.num_layers))}
        z = d * N + (d if m.embeddings.sequences else 0)
        self.top = mlp(m.tasks.mlp, z, relu_last=True)
        self.heads = TaskHeads(m.tasks.mlp[-1] if m.tasks.mlp else z, len(m.tasks.names))
        # the longest sample the scenario allows: GDPA's normaliser (1/max_len, the same for every
        # batch, as HSTU's configured max length) and the bound that sizes the attention grids
        self.max_len = sum(g.length.max for g in m.embeddings.sequences)
        self.autocast_cache = True  # off while a CUDA graph is captured (torch.cuda.graph's advice)
        self.checkpointing = "none"  # set_checkpointing

    def set_checkpointing(self, policy: str) -> None:
        """Activation checkpointing as ``parallelism.activation_checkpointing`` (``twin/memory.py``):
        ``none`` keeps every activation; ``selective`` keeps q, k, v and recomputes each attention
        (self and cross) in backward where its backward needs the forward output (not GDPA's on
        the Triton kernels); ``full`` keeps each sequence, non-sequence and cross layer's
        inputs only and recomputes the layer in backward. The input side (embeddings, bottom MLP,
        compression) and the top are never checkpointed, as in the twin."""
        if policy not in ("none", "selective", "full"):
            raise ValueError(f"activation_checkpointing '{policy}' is unknown; use none, selective or full")
        self.checkpointing = policy
        for mod in self.modules():
            if isinstance(mod, (SequenceLayer, CrossLayer)):
                mod.recompute_attention = policy == "selective"

    def embedding_modules(self) -> list[nn.Module]:
        return list(self.pooled.tables.values()) + [t for g in self.groups for t in g.tables.values()]

    def forward(self, batch: Batch) -> tuple[Tensor, Tensor]:
        batch.validate(self.cfg)
        dev = batch.dense.device.type
        ctx = (torch.autocast(dev, dtype=torch.bfloat16, cache_enabled=self.autocast_cache) if self.lowp
               else contextlib.nullcontext())
        with ctx:
            X = self._input_compression(self._nonseq_tokens(batch))
            S, offsets = self._sequence_tokens(batch)
            max_len = self.max_len
            dense_off = dense_offsets(X.shape[0], X.shape[1], offsets) if offsets is not None else None
            aux = X.new_zeros((), dtype=torch.float32)
            for i in range(self.num_stages):
                full = self.checkpointing == "full"
                if i < len(self.seq_layers):
                    S = _maybe_checkpoint(full, lambda S, l=self.seq_layers[i]: l(S, offsets, max_len), S)
                if i < len(self.nonseq_layers):
                    X, a = _maybe_checkpoint(full, self.nonseq_layers[i], X)
                    aux = aux + a
                if i in self.cross_after:
                    layer = self.cross_layers[self.cross_after[i]]
                    S, X = _maybe_checkpoint(full, lambda S, X, l=layer: l(S, X, offsets, max_len, dense_off),
                                             S, X)
            parts = [X.flatten(1)]
            if self.groups:
                parts.insert(0, _segment_mean(S, offsets).to(X.dtype))
            logits = self.heads(self.top(torch.cat(parts, dim=1)))
        return logits.float(), aux

    def _nonseq_tokens(self, batch: Batch) -> Tensor:
        """``X0 = [dense token, family 0 tables…, family 1 tables…]``: ``[B, T0, d]``."""
        tokens = [self.bottom(batch.dense).unsqueeze(1)]
        for fam, x in zip(self.cfg.embeddings.pooled, self.pooled.families(batch)):  # x [B, count, dim]
            tokens.append(self.family_proj[fam.name](x) if fam.name in self.family_proj else x)
        dtype = tokens[0].dtype
        return torch.cat([t.to(dtype) for t in tokens], dim=1)

    def _input_compression(self, X0: Tensor) -> Tensor:
        """``einsum("nt,btd->bnd", W_in, X0)`` as one mm: ``[B, N, d]``."""
        return (X0.transpose(1, 2) @ self.W_in.t()).transpose(1, 2)

    def _sequence_tokens(self, batch: Batch) -> tuple[Tensor | None, Tensor | None]:
        """Jagged ``S [rows, d]`` with groups concatenated per sample (group 0 first) and the
        samples' ``offsets [B+1]``. ``rows`` is ΣL, or in a static-shape batch (``Batch.bucket``)
        each group's padded width summed: the padding rows then come after every sample's tokens."""
        if not self.groups:
            return None, None
        lengths = batch.seq_lengths()
        offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
        toks = [g(batch) for g in self.groups]
        if len(toks) == 1:
            return toks[0], offsets
        # destination row of each group's token: its sample's slot after the earlier groups' tokens;
        # a padding row goes after all tokens (the earlier groups' padding first). No host sync.
        dests, before, pad_before = [], offsets[:-1].clone(), offsets[-1:].clone()
        for g, t in zip(self.groups, toks):
            seq = batch.sequences[g.name]
            local = torch.arange(t.shape[0], device=t.device)
            sample = torch.searchsorted(seq.offsets[1:], local, right=True)  # B for a padding row
            shift = torch.cat([before - seq.offsets[:-1], pad_before - seq.offsets[-1:]])
            dests.append(local + shift.index_select(0, sample))
            before = before + seq.lengths
            pad_before = pad_before + (t.shape[0] - seq.offsets[-1:])
        t = torch.cat(toks)
        return t.new_zeros(t.shape).index_copy(0, torch.cat(dests), t), offsets


def _segment_mean(S: Tensor, offsets: Tensor) -> Tensor:
    """Mean over each sample's rows of ``S`` (zeros for a sample of length 0): ``[B, d]``. Rows
    past ``offsets[-1]`` (a static-shape batch's padding) are summed into a row that is dropped.
    On CUDA: ``kernels.jagged.segment_mean`` (per-sample sums in fp32, no atomics)."""
    if S.is_cuda and S.stride(1) == 1:
        from kernels.jagged.segment_mean import segment_mean

        return segment_mean(S, offsets)
    lengths = offsets[1:] - offsets[:-1]
    sample = torch.searchsorted(offsets[1:], torch.arange(S.shape[0], device=S.device), right=True)
    sums = S.new_zeros((len(lengths) + 1, S.shape[1])).index_add(0, sample, S)[:-1]
    return sums / lengths.clamp(min=1).unsqueeze(1).to(S.dtype)


# ---- DLRM --------------------------------------------------------------------------------------
class DLRMModule(nn.Module):
    def __init__(self, m: DLRMModel, precision=None):
        super().__init__()
        self.cfg = m
        self.lowp = precision is not None and _lowp(precision.mlp)
        D = m.bottom_mlp[-1]
        T = sum(fam.count for fam in m.embeddings.pooled)
        self.bottom = mlp(m.bottom_mlp, m.dense_features, relu_last=True)
        self.pooled = PooledTables(m.embeddings)
        if m.interaction == "dot":
            self.register_buffer("triu", torch.triu_indices(T + 1, T + 1, offset=1), persistent=False)
            top_in = D + T * (T + 1) // 2
        else:
            n = D * (T + 1)
            self.V = nn.ModuleList(nn.Linear(n, m.dcn_rank, bias=False) for _ in range(m.dcn_layers))
            self.U = nn.ModuleList(nn.Linear(m.dcn_rank, n) for _ in range(m.dcn_layers))
            top_in = n
        self.top = mlp(m.top_mlp, top_in, relu_last=True)
        self.heads = TaskHeads(m.top_mlp[-1], len(m.tasks.names))

    def embedding_modules(self) -> list[nn.Module]:
        return list(self.pooled.tables.values())

    def forward(self, batch: Batch) -> tuple[Tensor, Tensor]:
        batch.validate(self.cfg)
        dev = batch.dense.device.type
        ctx = torch.autocast(dev, dtype=torch.bfloat16) if self.lowp else contextlib.nullcontext()
        with ctx:
            bottom = self.bottom(batch.dense)
            tables = list(self.pooled(batch).values())
            if self.cfg.interaction == "dot":
                Z = torch.stack([bottom] + [t.to(bottom.dtype) for t in tables], dim=1)  # [B, T+1, D]
                inter = torch.bmm(Z, Z.transpose(1, 2))[:, self.triu[0], self.triu[1]]
                x = torch.cat([bottom, inter.to(bottom.dtype)], dim=1)
            else:
                x0 = torch.cat([bottom] + [t.to(bottom.dtype) for t in tables], dim=1)
                x = x0
                for V, U in zip(self.V, self.U):
                    x = x0 * U(V(x)) + x
            logits = self.heads(self.top(x))
        return logits.float(), bottom.new_zeros((), dtype=torch.float32)
