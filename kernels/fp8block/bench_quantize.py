"""Where the quantizer's time goes at the MLP block's shapes (one device call): ``dual`` per
epilogue and orientation, per launch config (``quantize.CONFIGS``), against the bf16 bias + GELU kernels, torch's
LayerNorm (the ``layer_norm`` epilogue's unfused producer: fp32 residual stream in) and a copy.

    python -m kernels.fp8block.bench_quantize [--tokens 147456]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from kernels.ffn.bias_gelu import bias_gelu_bwd, bias_gelu_fwd
from kernels.fp8block.quantize import CONFIGS, dual, ln_stats


def ms(fn):
    return do_bench(fn, warmup=20, rep=100, return_mode="median")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=147456)
    ap.add_argument("--configs", default="", help="comma-separated keys of quantize.CONFIGS (default: all)")
    a = ap.parse_args(argv)
    print(json.dumps(measure(a.tokens, [c for c in a.configs.split(",") if c] or None)))
    return 0


def _bytes(d) -> list:
    return [None if t is None else t.view(torch.uint8) if t.dtype.itemsize == 1 else t
            for t in (d.q, d.scale, d.qt, d.scale_t)]


def _same(a, b) -> bool:
    return all((u is None) == (v is None) and (u is None or torch.equal(u.nan_to_num(-1), v.nan_to_num(-1)))
               for u, v in zip(_bytes(a), _bytes(b)))


def measure(T: int, configs: list[str] | None = None) -> dict:
    """Per config: milliseconds per call, and ``same_as_default``: its outputs bit-equal to the
    default config's on the GPU (both use the fast erf), per epilogue."""
    d, H = 1024, 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, d, device="cuda", generator=g).bfloat16()
    h = torch.randn(T, H, device="cuda", generator=g).bfloat16()
    dA = torch.randn(T, H, device="cuda", generator=g).bfloat16()
    b = torch.randn(H, device="cuda", generator=g)
    y = torch.empty_like(h)
    s = torch.randn(T, d, device="cuda", generator=g)  # the residual stream a pre-norm FFN reads (fp32)
    gam, beta = 1 + 0.1 * torch.randn(d, device="cuda", generator=g), 0.1 * torch.randn(d, device="cuda", generator=g)
    st = ln_stats(s, 1e-5)
    res = {"tokens": T, "copy_h_ms": ms(lambda: y.copy_(h)), "bias_gelu_fwd_ms": ms(lambda: bias_gelu_fwd(h, b)),
           "bias_gelu_bwd_ms": ms(lambda: bias_gelu_bwd(dA, h, b)), "ln_stats_ms": ms(lambda: ln_stats(s, 1e-5)),
           "layer_norm_fp32_in_bf16_out_ms": ms(lambda: F.layer_norm(s, (d,), gam, beta).bfloat16()),
           "layer_norm_fp32_ms": ms(lambda: F.layer_norm(s, (d,), gam, beta))}
    ln = dict(epilogue="layer_norm", bias=beta, gain=gam, stats=st)
    calls = {"none": lambda w: dual(x, config=w), "bias_gelu": lambda w: dual(h, epilogue="bias_gelu", bias=b, config=w),
             "bias_gelu_grad": lambda w: dual(dA, epilogue="bias_gelu_grad", bias=b, h=h, config=w),
             "layer_norm": lambda w: dual(s, config=w, **ln)}
    want = {ep: call(None) for ep, call in calls.items()}
    for w in configs or CONFIGS:
        r = {"same_as_default": {ep: _same(call(w), want[ep]) for ep, call in calls.items()}}
        r["x_both"] = ms(lambda: dual(x, config=w))
        r["x_row"] = ms(lambda: dual(x, col=False, config=w))
        r["x_col"] = ms(lambda: dual(x, row=False, config=w))
        r["h_none_both"] = ms(lambda: dual(h, config=w))
        r["gelu_both"] = ms(lambda: dual(h, epilogue="bias_gelu", bias=b, config=w))
        r["gelu_row"] = ms(lambda: dual(h, col=False, epilogue="bias_gelu", bias=b, config=w))
        r["gelu_grad_both_db"] = ms(lambda: dual(dA, epilogue="bias_gelu_grad", bias=b, h=h, dbias=True, config=w))
        r["gelu_grad_row"] = ms(lambda: dual(dA, col=False, epilogue="bias_gelu_grad", bias=b, h=h, config=w))
        r["ln_both"] = ms(lambda: dual(s, config=w, **ln))
        res[w] = r
        print(w, json.dumps(r), flush=True)
    return res


if __name__ == "__main__":
    raise SystemExit(main())
