"""Where the quantizer's time goes at the MLP block's shapes (one device call): ``dual`` per
epilogue and orientation, per launch config (``quantize.CONFIGS``), against the bf16 bias + GELU kernels and a copy.

    python -m kernels.fp8block.bench_quantize [--tokens 147456]
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

from kernels.ffn.bias_gelu import bias_gelu_bwd, bias_gelu_fwd
from kernels.fp8block.quantize import CONFIGS, dual


def ms(fn):
    return do_bench(fn, warmup=20, rep=100, return_mode="median")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=147456)
    a = ap.parse_args(argv)
    print(json.dumps(measure(a.tokens)))
    return 0


def measure(T: int) -> dict:
    d, H = 1024, 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, d, device="cuda", generator=g).bfloat16()
    h = torch.randn(T, H, device="cuda", generator=g).bfloat16()
    dA = torch.randn(T, H, device="cuda", generator=g).bfloat16()
    b = torch.randn(H, device="cuda", generator=g)
    y = torch.empty_like(h)
    res = {"tokens": T, "copy_h_ms": ms(lambda: y.copy_(h)), "bias_gelu_fwd_ms": ms(lambda: bias_gelu_fwd(h, b)),
           "bias_gelu_bwd_ms": ms(lambda: bias_gelu_bwd(dA, h, b))}
    for w in CONFIGS:
        r = {}
        r["x_both"] = ms(lambda: dual(x, config=w))
        r["x_row"] = ms(lambda: dual(x, col=False, config=w))
        r["x_col"] = ms(lambda: dual(x, row=False, config=w))
        r["h_none_both"] = ms(lambda: dual(h, config=w))
        r["gelu_both"] = ms(lambda: dual(h, epilogue="bias_gelu", bias=b, config=w))
        r["gelu_row"] = ms(lambda: dual(h, col=False, epilogue="bias_gelu", bias=b, config=w))
        r["gelu_grad_both_db"] = ms(lambda: dual(dA, epilogue="bias_gelu_grad", bias=b, h=h, dbias=True, config=w))
        r["gelu_grad_row"] = ms(lambda: dual(dA, col=False, epilogue="bias_gelu_grad", bias=b, h=h, config=w))
        res[w] = r
        print(w, json.dumps(r), flush=True)
    return res


if __name__ == "__main__":
    raise SystemExit(main())
