"""Blockwise-fp8 training layers: ``Fp8BlockLinear`` and the fused FFN ``fp8_block_ffn``.

For ``y = x Wᵀ + b`` (``x [M, K]``, ``W [N, K]``) each matmul quantizes its operands along its
own contraction dim (rules in ``kernels/fp8block/__init__.py``):

- forward ``y = x · Wᵀ``:  ``x`` 1×128 along K, ``W`` 128×128;
- dgrad  ``dx = dy · W``:  ``dy`` 1×128 along N, ``Wᵀ`` (the same tiles, transposed);
- wgrad  ``dW = dyᵀ · x``: ``dy`` and ``x`` 1×128 along M (the tokens), both transposed.

One quantizer call per tensor writes both of its orientations (``quantize.dual``): the forward
keeps only the fp8 transposed ``x`` for the weight gradient (1 byte an element, not bf16's 2),
the backward quantizes ``dy`` once for dgrad and wgrad and takes the bias gradient from the same
pass. The weight is quantized once per forward (128×128 tiles serve both of its orientations).
Elements E4M3; gradients E4M3 (default) or E5M2. The weight gradient comes out in fp32.

``fp8_block_ffn`` runs ``ffn2(gelu(ffn1(norm(x))))`` with the quantization fused into the
producers: the pre-norm's statistics are one read of ``x`` and its output goes straight to fp8 in
both orientations (the ``layer_norm`` epilogue; the normalized rows are never written), the bias +
GELU epilogue writes ffn2's input the same way (the activation is never written in bf16), and the
GELU backward writes ffn1's output gradient the same way with ffn1's bias gradient. The
pre-activation ``h0`` (bf16) is kept for the backward; the norm's backward is torch's, from the
forward's statistics.

``Fp8BlockLinear`` is ``MXFP8Linear`` (``kernels.mxfp8.linear``: the per-layer bf16 guard, the
report, ``guard_pending``) with these matmuls. On CPU the quantizer is the PyTorch reference (or
the Triton kernel under ``TRITON_INTERPRET=1``) and the GEMM the dequantize-then-matmul emulation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels.fp8block import eligible
from kernels.fp8block.gemm import block_mm
from kernels.fp8block.quantize import dual, ln_stats, weight
from kernels.mxfp8.linear import MXFP8Linear, _range


def _weight(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(q, qt, scale)``: the weight's 128×128 tiles and their transpose (dgrad's operand)."""
    with _range("fp8block.quantize"):
        return weight(w)


def _dual(x: Tensor, elem: str, **kw):
    with _range("fp8block.quantize"):
        return dual(x, elem, **kw)


def _mm(a, sa, b, sb, out_dtype, rows: int | None = None, bias: Tensor | None = None) -> Tensor:
    with _range("fp8block.gemm"):
        y = block_mm(a, sa, b, sb, out_dtype, bias)
    return y if rows is None else y[:rows]


def _quantize_input(x: Tensor, col: bool, ln: tuple | None):
    """``x`` quantized for its matmuls (row-wise; ``col``: also the transpose for the weight
    gradient), or, with ``ln = (weight, bias, eps)`` of a LayerNorm, ``layer_norm(x)`` quantized:
    the rows' statistics (one read), then the normalized rows straight to fp8. Returns the ``Dual``
    and what the norm's backward needs (``layer_norm_grad``'s operands; empty without a norm)."""
    if ln is None:
        return _dual(x, "e4m3", row=True, col=col), ()
    gain, shift, eps = ln
    with _range("fp8block.quantize"):
        stats = ln_stats(x, eps)
    return _dual(x, "e4m3", row=True, col=col, epilogue="layer_norm", bias=shift, gain=gain, stats=stats), \
        (x, gain, shift, *stats)


class _Fp8BlockLinearFn(torch.autograd.Function):
    """``norm(x) Wᵀ + b``: the three matmuls in blockwise fp8; ``ln_w`` / ``ln_b`` / ``eps``
    (optional, last) a LayerNorm taken into the input's quantizer (``_quantize_input``)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, out_dtype: torch.dtype, grad_elem: str,
                ln_w: Tensor | None = None, ln_b: Tensor | None = None, eps: float = 0.0):
        M = x.shape[0]
        xd, norm = _quantize_input(x, weight.requires_grad, None if ln_w is None else (ln_w, ln_b, eps))
        wq, wqt, ws = _weight(weight)
        y = _mm(xd.q, xd.scale, wq, ws, torch.float32 if out_dtype == torch.float32 else torch.bfloat16, M, bias)
        ctx.save_for_backward(xd.qt, xd.scale_t, wqt, ws, *norm)
        ctx.has_bias, ctx.grad_elem, ctx.x_dtype, ctx.w_dtype, ctx.M = bias is not None, grad_elem, x.dtype, weight.dtype, M
        ctx.n_inputs = 5 if ln_w is None else 8
        return y.to(out_dtype)

    @staticmethod
    def backward(ctx, dy: Tensor):
        xq_t, xs_t, wqt, ws, *norm = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        need_dx = need_dx or (bool(norm) and any(ctx.needs_input_grad[5:7]))  # the norm's gradients start from dx
        d = _dual(dy.contiguous(), ctx.grad_elem, row=need_dx, col=need_dw, dbias=ctx.has_bias and need_db)
        dx = _mm(d.q, d.scale, wqt, ws.t(), torch.bfloat16, ctx.M) if need_dx else None
        dw = _mm(d.qt, d.scale_t, xq_t, xs_t, torch.float32).to(ctx.w_dtype) if need_dw else None
        dln_w = dln_b = None
        if norm and need_dx:
            dx, dln_w, dln_b = layer_norm_grad(dx, *norm)
        dx = dx.to(ctx.x_dtype) if dx is not None else None
        grads = (dx, dw, d.dbias if ctx.has_bias and need_db else None, None, None, dln_w, dln_b, None)
        return grads[:ctx.n_inputs]


class _Fp8BlockFFNFn(torch.autograd.Function):
    """``ffn2(gelu(ffn1(norm(x))))`` with the quantization fused into the producers (module
    docstring); ``norm`` (a LayerNorm's ``ln_w``, ``ln_b``) is optional."""

    @staticmethod
    def forward(ctx, x: Tensor, ln_w: Tensor | None, ln_b: Tensor | None, eps: float, w1: Tensor, b1: Tensor,
                w2: Tensor, b2: Tensor | None, out_dtype: torch.dtype, grad_elem: str):
        M = x.shape[0]
        xd, norm = _quantize_input(x, True, None if ln_w is None else (ln_w, ln_b, eps))
        w1q, w1qt, w1s = _weight(w1)
        w2q, w2qt, w2s = _weight(w2)
        h0 = _mm(xd.q, xd.scale, w1q, w1s, torch.bfloat16, M)  # ffn1 without its bias
        ad = _dual(h0, "e4m3", row=True, col=True, epilogue="bias_gelu", bias=b1)
        y = _mm(ad.q, ad.scale, w2q, w2s, torch.bfloat16, M, b2)
        ctx.save_for_backward(xd.qt, xd.scale_t, h0, ad.qt, ad.scale_t, w1qt, w1s, w2qt, w2s, b1, *norm)
        ctx.has_b2, ctx.grad_elem, ctx.x_dtype, ctx.M = b2 is not None, grad_elem, x.dtype, M
        ctx.dtypes = (w1.dtype, b1.dtype, w2.dtype, None if b2 is None else b2.dtype)
        return y.to(out_dtype)

    @staticmethod
    def backward(ctx, dy: Tensor):
        xq_t, xs_t, h0, aq_t, as_t, w1qt, w1s, w2qt, w2s, b1, *norm = ctx.saved_tensors
        ge, M = ctx.grad_elem, ctx.M
        w1_dt, b1_dt, w2_dt, b2_dt = ctx.dtypes
        dyd = _dual(dy.contiguous(), ge, row=True, col=True, dbias=ctx.has_b2)
        dA = _mm(dyd.q, dyd.scale, w2qt, w2s.t(), torch.bfloat16, M)
        dw2 = _mm(dyd.qt, dyd.scale_t, aq_t, as_t, torch.float32).to(w2_dt)
        dhd = _dual(dA, ge, row=True, col=True, epilogue="bias_gelu_grad", bias=b1, h=h0, dbias=True)
        dx = _mm(dhd.q, dhd.scale, w1qt, w1s.t(), torch.bfloat16, M)
        dw1 = _mm(dhd.qt, dhd.scale_t, xq_t, xs_t, torch.float32).to(w1_dt)
        db2 = dyd.dbias.to(b2_dt) if ctx.has_b2 else None
        dln_w = dln_b = None
        if norm:
            dx, dln_w, dln_b = layer_norm_grad(dx, *norm)
        return dx.to(ctx.x_dtype), dln_w, dln_b, None, dw1, dhd.dbias.to(b1_dt), dw2, db2, None, None


def layer_norm_grad(dy: Tensor, x: Tensor, gain: Tensor, shift: Tensor, mean: Tensor, rstd: Tensor):
    """``(dx, dgain, dshift)`` of ``layer_norm(x) · gain + shift`` over the last dim of ``x [R, C]``,
    from the forward's fp32 ``mean`` / ``rstd``: torch's own LayerNorm backward
    (``aten.native_layer_norm_backward``). On CUDA it runs in ``x``'s and ``gain``'s wider dtype (as
    autocast runs a LayerNorm: fp32 where the residual stream is), on CPU in fp32 (its kernel wants
    the statistics in its input's dtype)."""
    dt = torch.promote_types(x.dtype, gain.dtype) if x.is_cuda else torch.float32
    dx, dg, db = torch.ops.aten.native_layer_norm_backward(
        dy.to(dt), x.to(dt), [x.shape[1]], mean[:, None], rstd[:, None], gain.to(dt), shift.to(dt), [True, True, True])
    return dx.to(x.dtype), dg.to(gain.dtype), db.to(shift.dtype)


class Fp8BlockLinear(MXFP8Linear):
    """``nn.Linear`` whose forward, dgrad and wgrad run in blockwise fp8 (module docstring), with
    ``MXFP8Linear``'s bf16 guard. Both widths must be multiples of 128 (``eligible``).

    ``auto``: at its first forward the layer looks its shape up in the measured threshold table
    (``kernels.fp8block.table``: the rows it sees, its widths) and stays in bf16 for good unless
    fp8 pays there; the decision is logged with the guard's (``MXFP8Linear.decisions``)."""

    label = "fp8_block"
    _fn = _Fp8BlockLinearFn

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, auto: bool = False, **kw):
        if not eligible(in_features, out_features):
            raise ValueError(f"fp8_block: a Linear {in_features}->{out_features} needs both widths multiples of 128; "
                             f"keep it in bf16")
        super().__init__(in_features, out_features, bias, **kw)
        self.auto, self.decided = auto, not auto

    @torch.compiler.disable  # eager between compiled graphs: its Triton launches and glue are not traced,
    # and no recompile per input rank; under CUDA graphs the replay launches them like the rest
    def forward(self, x: Tensor) -> Tensor:
        if not self.decided:
            self._decide(x.numel() // self.in_features)
        return super().forward(x)

    def _decide(self, rows: int) -> None:
        from kernels.fp8block.table import ratio

        r = ratio(rows, self.in_features, self.out_features)
        self.decided, self.fallback = True, r <= 1.0
        MXFP8Linear.decisions.append(
            f"fp8_block auto: {self.name or 'linear'} [{self.in_features}->{self.out_features}] at {rows} rows: "
            f"measured bf16/fp8 {r:.2f}: {'bf16' if self.fallback else 'fp8'}")

    def pending(self) -> bool:
        """Whether an eager forward is still owed: the auto decision or a guard call."""
        return self.training and (not self.decided or (not self.fallback and self.calls < self.guard_calls))


def linear_ready(lin: nn.Module) -> bool:
    """Whether ``lin`` runs blockwise fp8 for good: an ``Fp8BlockLinear``, decided, not fallen back,
    no guard call pending (``fp8_block_linear`` may then take a norm into its quantizer)."""
    return isinstance(lin, Fp8BlockLinear) and lin.decided and not lin.fallback and not lin.pending()


def ffn_ready(ffn1: nn.Module, ffn2: nn.Module) -> bool:
    """Whether ``ffn2(gelu(ffn1(x)))`` can run as ``fp8_block_ffn``: both ``linear_ready`` (the
    guards run on the layers one by one first), ffn1 with a bias."""
    return linear_ready(ffn1) and linear_ready(ffn2) and ffn1.bias is not None


def norm_fusable(norm: nn.Module | None) -> bool:
    """Whether ``fp8_block_ffn`` can take ``norm`` into its quantizer: a LayerNorm over the last dim
    with a weight and a bias (others run first, on their own)."""
    return (type(norm) is nn.LayerNorm and len(norm.normalized_shape) == 1 and norm.weight is not None
            and norm.bias is not None)


@torch.compiler.disable  # eager between compiled graphs, as Fp8BlockLinear.forward
def fp8_block_ffn(x: Tensor, ffn1: Fp8BlockLinear, ffn2: Fp8BlockLinear, norm: nn.Module | None = None) -> Tensor:
    """``ffn2(gelu(ffn1(norm(x))))`` of ``x [..., d]`` with the fused quantization (module
    docstring); ``norm`` (optional) a LayerNorm, fused into the first quantizer where
    ``norm_fusable``: its statistics in one read of ``x``, its output straight to fp8."""
    dev = x.device.type
    out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    lead = x.shape[:-1]
    if norm is not None and not norm_fusable(norm):
        x, norm = norm(x), None
    ln = (norm.weight, norm.bias, norm.eps) if norm is not None else (None, None, 0.0)
    with torch.autocast(dev, enabled=False):
        y = _Fp8BlockFFNFn.apply(x.reshape(-1, x.shape[-1]), *ln, ffn1.weight, ffn1.bias, ffn2.weight, ffn2.bias,
                                 out_dtype, ffn1.grad_elem)
    return y.reshape(*lead, ffn2.out_features)


@torch.compiler.disable  # eager between compiled graphs, as Fp8BlockLinear.forward
def fp8_block_linear(x: Tensor, lin: Fp8BlockLinear, norm: nn.Module) -> Tensor:
    """``lin(norm(x))`` of ``x [..., in]``, ``lin`` ready (``linear_ready``), the LayerNorm ``norm``
    taken into the input's quantizer where ``norm_fusable`` (its statistics in one read of ``x``, its
    output straight to fp8; its backward torch's)."""
    if not norm_fusable(norm) or x.numel() == 0:
        return lin(norm(x))
    dev = x.device.type
    out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    with torch.autocast(dev, enabled=False):
        y = _Fp8BlockLinearFn.apply(x.reshape(-1, x.shape[-1]), lin.weight, lin.bias, out_dtype, lin.grad_elem,
                                    norm.weight, norm.bias, norm.eps)
    return y.reshape(*x.shape[:-1], lin.out_features)


def normed(norm: nn.Module, lin: nn.Module, x: Tensor) -> Tensor:
    """``lin(norm(x))``: the norm fused into a ready blockwise-fp8 ``lin`` (``fp8_block_linear``),
    else run as it is."""
    return fp8_block_linear(x, lin, norm) if linear_ready(lin) else lin(norm(x))


def convert(module: nn.Module, *, choose=lambda name, lin: True, auto: bool = False, **kw) -> list[str]:
    """Replace each ``nn.Linear`` under ``module`` that is ``eligible`` and ``choose(name, lin)``
    by an ``Fp8BlockLinear`` sharing its parameters; returns the converted names."""
    done = []
    for parent_name, parent in list(module.named_modules()):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if type(child) is nn.Linear and eligible(child.in_features, child.out_features) and choose(name, child):
                setattr(parent, child_name, Fp8BlockLinear.from_linear(child, name=name, auto=auto, **kw))
                done.append(name)
    return done


def settle(module: nn.Module) -> list[str]:
    """Put back the plain ``nn.Linear`` (sharing its parameters) of every ``Fp8BlockLinear`` under
    ``module`` that has settled in bf16: ``auto`` found no gain at its shape, or its guard fell back.
    Such a layer computes what ``nn.Linear`` does, but its eager forward (``torch.compiler.disable``)
    would still split the compiled graph around it; put back, it compiles with its neighbours and the
    program is the bf16 one (the executor calls this after each guarded step). The ``nn.Linear``
    keeps the layer's name and why in ``low_precision`` for the RunRecord. Parameters that are
    DTensors (FSDP2 holds the module objects it sharded) stay where they are. Returns the names."""
    from torch.distributed.tensor import DTensor

    done = []
    for parent in list(module.modules()):
        for child_name, child in list(parent.named_children()):
            if (isinstance(child, Fp8BlockLinear) and child.decided and child.fallback
                    and not isinstance(child.weight, DTensor)):
                lin = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
                lin.weight = child.weight
                lin.bias = child.bias
                lin.train(child.training)
                why = "auto" if child.auto and child.calls == 0 else "guard"
                lin.low_precision = (child.name or child_name, f"bf16 ({why})")
                setattr(parent, child_name, lin)
                done.append(child.name or child_name)
    return done


def bf16_ffn(x: Tensor, ffn1: nn.Linear, ffn2: nn.Linear) -> Tensor:
    """The bf16 baseline of ``fp8_block_ffn`` as the executor runs it on CUDA: the matmul without
    its bias, the fused bias + GELU (``kernels.ffn.bias_gelu``), the second matmul."""
    from kernels.ffn.bias_gelu import bias_gelu

    return ffn2(bias_gelu(F.linear(x, ffn1.weight), ffn1.bias))


__all__ = ["Fp8BlockLinear", "bf16_ffn", "convert", "ffn_ready", "fp8_block_ffn", "fp8_block_linear", "layer_norm_grad",
           "linear_ready", "norm_fusable", "normed", "settle"]
