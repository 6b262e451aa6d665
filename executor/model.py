"""The GEM model and the classic DLRM, single device, exactly as ``executor/MODEL.md`` says.

``build_model(scenario)`` returns a ``GEMModule`` or a ``DLRMModule``; ``forward(batch)``
returns ``(logits [B, tasks], aux_loss)`` and ``compute_loss`` adds the BCE. Every matmul of
MODEL.md is an explicit ``mm``/``bmm``/``linear`` (no ``einsum``: it lowers size-1
contractions to ``mul``+``sum``, which ``FlopCounterMode`` does not count), and nothing else is
a matmul, so the FLOP counter agrees with the analytic count in ``twin/flops.py``.

This file is the architecture. The embedding tables are in ``executor/embeddings.py``, the MoE
in ``executor/moe.py``. How a run executes the model (which kernels, MXFP8, activation
checkpointing, compile, sharding) is applied from outside, in one order, by
``executor/parallelize.py``: the layers only carry the attributes it sets (``attention_kernel``,
``ffn_kernel``, ``mxfp8``, ``recompute_attention``, ``checkpointing``...), whose defaults run the
model as ``execution: auto`` would.

Precision (``scenario.precision``): ``mlp`` bf16 runs the forward under ``torch.autocast``
(bf16); ``attention`` bf16 casts q, k, v to bf16 inside attention. ``embeddings`` bf16: the tables
are built in bf16 (a storage choice that decides the memory at build: an fp32 table cast later would
hold both copies at once); ``mxfp8`` (``MXFP8Linear`` layers, MXFP8 GDPA) and ``fp8_block`` /
``auto`` (``Fp8BlockLinear`` layers, the fused fp8 FFN) are applied by ``executor.parallelize``.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from executor.attention import (
    cross_attention, jagged_attention, packed_cross_attention,
    packed_self_attention, use_triton,
)
from executor.data import Batch
from executor.embeddings import PooledTables, SequenceGroupTokens, table_dtype
from executor.moe import MoE
from kernels.attention.op import dense_offsets
from kernels.attention.spec import FlashOptions
from scenarios.schema import DLRMModel, GEMModel, Scenario


def build_model(scenario: Scenario) -> GEMModule | DLRMModule:
    """The single-device model of ``scenario.model``, with ``scenario.training.seed`` init.

    The architecture only: how it runs (kernels, MXFP8, checkpointing, compile, sharding) is
    applied from outside by ``executor.parallelize``."""
    torch.manual_seed(scenario.training.seed)
    m = scenario.model
    return GEMModule(m, scenario.precision) if m.kind == "gem" else DLRMModule(m, scenario.precision)


def compute_loss(logits: Tensor, labels: Tensor, aux: Tensor | float = 0.0) -> Tensor:
    """Mean over tasks of BCE-with-logits, plus the MoE load-balancing loss ``aux``."""
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float()) + aux


def _lowp(dtype: str) -> bool:
    return dtype in ("bf16", "mxfp8", "fp8_block", "auto")  # low-precision matmuls: bf16 around them


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


# ---- GEM ---------------------------------------------------------------------------------------
class SequenceLayer(nn.Module):
    """Pre-norm transformer layer over the jagged sequence ``S [ΣL, d]``."""

    def __init__(self, m: GEMModel, attention_dtype: torch.dtype):
        super().__init__()
        c, d = m.sequence, m.d_model
        self.cfg, self.dtype = c, attention_dtype
        # how attention runs: set by executor.parallelize from the Scenario (these are the defaults)
        self.attention_kernel = "auto"  # auto | triton | reference
        self.attention_in_graph = True  # the Triton op inside the compiled layer's graph
        self.flash = FlashOptions()  # the Triton core's variants (execution.flash)
        self.mxfp8 = False  # MXFP8 Q·Kᵀ and P·V (kernels.mxfp8.gdpa; GDPA only)
        self.recompute_attention = False  # activation_checkpointing: selective
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * c.heads * c.head_dim, bias=False)
        self.out = nn.Linear(c.heads * c.head_dim, d, bias=False)
        self.ffn1, self.ffn2 = nn.Linear(d, c.ffn_mult * d), nn.Linear(c.ffn_mult * d, d)
        self.ffn_kernel = "auto"  # auto | triton | torch | cublaslt (executor.parallelize)

    def forward(self, S: Tensor, offsets: Tensor, max_len: int) -> Tensor:
        """``S [rows, d]``: the samples' tokens (``offsets``), then any padding rows of a
        static-shape batch, which attention neither reads nor writes (its output there is zero)."""
        c = self.cfg
        qkv = normed(self.ln1, self.qkv, S).view(-1, 3, c.heads, c.head_dim).to(self.dtype)
        if not self.mxfp8 and use_triton(self.attention_kernel, S.device):  # an op: compiled with the layer
            attend = packed_self_attention if self.attention_in_graph else _packed_self_eager
            a = attend(qkv, offsets, kind=c.attention, causal=c.causal, block_size=c.block_size,
                       activation=c.gdpa_activation, max_len=max_len, recompute=self.recompute_attention,
                       flash=self.flash)
        else:
            with torch.autocast(S.device.type, enabled=False):
                a = _self_attention(qkv, offsets, c, max_len, self.attention_kernel, self.mxfp8,
                                    self.recompute_attention)
        S = S + self.out(a.reshape(-1, c.heads * c.head_dim).to(S.dtype))  # attention may run lower than the MLPs
        return S + self._ffn(S)

    def _ffn(self, S: Tensor) -> Tensor:
        """``ffn2(gelu(ffn1(ln2(S))))``; both layers blockwise fp8 with their guards done: one fused op
        (``kernels.fp8block.linear.fp8_block_ffn``: the quantization inside the LayerNorm and inside
        the bias + GELU)."""
        from kernels.fp8block.linear import ffn_ready, fp8_block_ffn

        if self.cfg.ffn_activation == "gelu_tanh":
            return self._ffn_tanh(self.ln2(S))
        if ffn_ready(self.ffn1, self.ffn2):
            return fp8_block_ffn(S, self.ffn1, self.ffn2, norm=self.ln2)
        return self.ffn2(self._ffn1_gelu(self.ln2(S)))

    def _ffn_tanh(self, x: Tensor) -> Tensor:
        """``ffn2(gelu_tanh(ffn1(x)))`` (``model.sequence.ffn_activation: gelu_tanh``): on CUDA
        (``ffn_kernel`` auto or cublaslt) with two plain Linears, the GELU's work in their GEMMs'
        cuBLASLt epilogues (``kernels.ffn.epilogue``); else torch's tanh GELU between them (an fp8 or
        MXFP8 layer quantizes around it: the fused fp8 FFN applies exact GELU)."""
        plain = type(self.ffn1) is nn.Linear and type(self.ffn2) is nn.Linear and self.ffn1.bias is not None
        if plain and x.is_cuda and self.ffn_kernel in ("auto", "cublaslt"):
            from kernels.ffn.epilogue import gelu_ffn_linear

            return gelu_ffn_linear(x, self.ffn1, self.ffn2)
        return self.ffn2(F.gelu(self.ffn1(x), approximate="tanh"))

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


def normed(norm: nn.Module, lin: nn.Module, x: Tensor) -> Tensor:
    """``lin(norm(x))``; a blockwise-fp8 ``lin`` past its guard takes the LayerNorm into its input's
    quantizer (``kernels.fp8block.linear.normed``: the normalized rows never written)."""
    from kernels.fp8block.linear import normed as fused

    return fused(norm, lin, x)


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


def _cross_attention(q: Tensor, kv: Tensor, offsets: Tensor, jagged: str, max_len: int, kernel: str,
                     recompute: bool = False, dense_off: Tensor | None = None, in_graph: bool = True,
                     flash: FlashOptions | None = None) -> Tensor:
    """Cross attention with ``kv`` packed (``[B, N, 2, H, D]`` dense or ``[rows, 2, H, D]`` jagged).
    The jagged side's rows past ``offsets[-1]`` (padding) are not read; padded query rows get zero
    outputs. On the Triton kernels it is an op inside the compiled graph (``flash``: the core's
    variants), and the gradient of ``kv`` comes back whole (``packed_cross_attention``); the
    reference runs eagerly."""
    if use_triton(kernel, q.device):
        attend = packed_cross_attention if in_graph else _packed_cross_eager
        return attend(q, kv, offsets, jagged=jagged, max_len=max_len, recompute=recompute, dense_off=dense_off,
                      flash=flash)
    return _cross_reference(q, kv, offsets, jagged, max_len, kernel, recompute)


_packed_self_eager = torch.compiler.disable(packed_self_attention)  # execution.attention_in_graph: false
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
        if self.moe is None:
            return X + self._ffn(X), X.new_zeros(())
        y, aux = self.moe(self.ln_ffn(X).reshape(B * N, d))
        return X + y.view(B, N, d), self.aux_weight * aux

    def _ffn(self, X: Tensor) -> Tensor:
        """The dense token FFN of ``ln_ffn(X)``; both its Linears blockwise fp8 past their guards (and
        its GELU exact): one fused op with the norm in its first quantizer, as ``SequenceLayer._ffn``."""
        from kernels.fp8block.linear import ffn_ready, fp8_block_ffn

        lin1, act, lin2 = self.ffn
        if ffn_ready(lin1, lin2) and act.approximate == "none":
            return fp8_block_ffn(X, lin1, lin2, norm=self.ln_ffn)
        B, N, d = X.shape
        return self.ffn(self.ln_ffn(X).reshape(B * N, d)).view(B, N, d)


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
        self.attention_kernel = "auto"  # auto | triton | reference (executor.parallelize)
        self.attention_in_graph = True
        self.flash = FlashOptions()  # the Triton core's variants (execution.flash)
        self.recompute_attention = False  # activation_checkpointing: selective

    def forward(self, S: Tensor, X: Tensor, offsets: Tensor, max_len: int,
                dense_off: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``dense_off``: ``X``'s offsets ``arange(B+1)·N`` for the Triton kernels (default: made
        here; ``GEMModule`` passes one tensor to every layer, so the kernels' work lists for it
        are built once per step)."""
        B, N, _ = X.shape
        H, D = self.H, self.D
        q = normed(self.s_ln_q, self.s_q, S).view(-1, H, D)
        kv = normed(self.s_ln_kv, self.s_kv, X).view(B, N, 2, H, D)
        a = _cross_attention(q, kv, offsets, "q", max_len, self.attention_kernel, self.recompute_attention,
                             dense_off, self.attention_in_graph, self.flash)
        S_new = S + self.s_out(a.reshape(-1, H * D))
        q = normed(self.x_ln_q, self.x_q, X).view(B, N, H, D)
        kv = normed(self.x_ln_kv, self.x_kv, S).view(-1, 2, H, D)
        a = _cross_attention(q, kv, offsets, "kv", max_len, self.attention_kernel, self.recompute_attention,
                             dense_off, self.attention_in_graph, self.flash)
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
        self.pooled = PooledTables(m.embeddings, table_dtype(precision))
        self.family_proj = nn.ModuleDict(
            {fam.name: nn.Linear(fam.dim, d) for fam in m.embeddings.pooled if fam.dim != d}
        )
        self.groups = nn.ModuleList(SequenceGroupTokens(g, d, table_dtype(precision)) for g in m.embeddings.sequences)
        T0 = 1 + sum(fam.count for fam in m.embeddings.pooled)
        self.W_in = nn.Parameter(torch.randn(N, T0) / T0**0.5)
        self.seq_layers = nn.ModuleList(SequenceLayer(m, attn_dtype) for _ in range(m.sequence.num_layers))
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
        self.checkpointing = "none"  # none | selective | full (executor.parallelize)

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
class DCNMix(nn.Module):
    """A DCNv2 cross layer's element-wise part, ``x0 ⊙ u + x`` with ``u = U(V(x))``. A module of
    its own, with no parameters, so that ``executor.parallelize.compile_dense`` compiles it (the
    layer's V and U stay where the placements name them): Inductor fuses the multiply and the add,
    forward and backward, where eager runs each apart (dlrm-dcnv2 at 6,912 samples: 0.62 ms of eager
    multiplies and adds on the H200, 2026-12-04; compiled, 0.45 ms of fused kernels and a 5.58-ms
    step against 6.40-6.83 on an H100, ``hwmodels/data/runs/h100-2026-12-05d-dcn/``)."""

    def forward(self, x0: Tensor, u: Tensor, x: Tensor) -> Tensor:
        return x0 * u + x


class DLRMModule(nn.Module):
    def __init__(self, m: DLRMModel, precision=None):
        super().__init__()
        self.cfg = m
        self.lowp = precision is not None and _lowp(precision.mlp)
        D = m.bottom_mlp[-1]
        T = sum(fam.count for fam in m.embeddings.pooled)
        self.bottom = mlp(m.bottom_mlp, m.dense_features, relu_last=True)
        self.pooled = PooledTables(m.embeddings, table_dtype(precision))
        if m.interaction == "dot":
            self.register_buffer("triu", torch.triu_indices(T + 1, T + 1, offset=1), persistent=False)
            top_in = D + T * (T + 1) // 2
        else:
            n = D * (T + 1)
            self.V = nn.ModuleList(nn.Linear(n, m.dcn_rank, bias=False) for _ in range(m.dcn_layers))
            self.U = nn.ModuleList(nn.Linear(m.dcn_rank, n) for _ in range(m.dcn_layers))
            self.mix = DCNMix()
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
            # [B, count, D] per family, in table order: with the Triton lookups, splits of one TBE
            # output (backward: one cat), not a select per table (backward: a zero-fill and an add
            # of the whole [B, T, D] gradient per table)
            fams = [f.to(bottom.dtype) for f in self.pooled.families(batch)]
            if self.cfg.interaction == "dot":
                Z = torch.cat([bottom[:, None]] + fams, dim=1)  # [B, T+1, D]
                inter = torch.bmm(Z, Z.transpose(1, 2))[:, self.triu[0], self.triu[1]]
                x = torch.cat([bottom, inter.to(bottom.dtype)], dim=1)
            else:
                x0 = torch.cat([bottom] + [f.flatten(1) for f in fams], dim=1)
                x = x0
                for V, U in zip(self.V, self.U):
                    x = self.mix(x0, U(V(x)), x)
            logits = self.heads(self.top(x))
        return logits.float(), bottom.new_zeros((), dtype=torch.float32)
