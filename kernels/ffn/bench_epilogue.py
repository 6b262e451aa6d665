"""The FFN with its GELU in cuBLASLt epilogues against the Triton path, on one GPU (issue 25).

    python -m kernels.ffn.bench_epilogue [--out DIR]

Per shape (``gem-h200-1gpu``'s sequence FFN, 196,608 tokens × 512 → 2,048 → 512, and
``gem-h100-4k``'s, 147,456 × 1,024 → 4,096 → 1,024), forward + backward of ``ffn2(gelu(ffn1(x)))``
in bf16, each timed as CUDA-graph replays side by side in this run:
- ``triton_exact``: the executor's path today (``kernels.fp8block.linear.bf16_ffn``: ffn1 without its
  bias, the Triton bias + exact GELU, ffn2; backward: the Triton dGELU + bias gradient);
- ``cublaslt_tanh``: ``kernels.ffn.epilogue.gelu_ffn`` (GELU_AUX_BIAS forward; backward DGELU, and
  the bias gradient summed by torch after it); ``..._dgelu_bgrad``: the bias gradient in the dGELU's
  epilogue (DGELU_BGRAD); ``..._wgrad``: in the weight gradient's epilogue (BGRADB);
- ``eager_tanh``: ``F.linear`` + ``F.gelu(approximate="tanh")`` + ``F.linear`` (torch's own kernels).
Checks first: the two epilogue GEMMs against their fp32 references (``linear_gelu_aux_ref``,
``linear_dgelu_bgrad_ref``) at a small shape, and every path's gradients against an fp32
autograd reference of its own GELU. Writes ``ffn_epilogue.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = {"gem-h200-1gpu": (196_608, 512, 2048), "gem-h100-4k": (147_456, 1024, 4096)}


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def check(res: dict) -> None:
    from kernels.ffn.epilogue import (linear_dgelu_bgrad, linear_dgelu_bgrad_ref, linear_gelu_aux, linear_gelu_aux_ref,
                                      linear_wgrad_bgrad, linear_wgrad_bgrad_ref)

    g = torch.Generator(device="cuda").manual_seed(0)
    M, K, N, N2 = 1000, 256, 1024, 256
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    w = (torch.randn(N, K, device="cuda", generator=g) / K**0.5).bfloat16()
    b = torch.randn(N, device="cuda", generator=g).bfloat16()
    a, h = linear_gelu_aux(x, w, b)
    ar, hr = linear_gelu_aux_ref(x, w, b)
    dy = torch.randn(M, N2, device="cuda", generator=g).bfloat16()
    w2 = (torch.randn(N2, N, device="cuda", generator=g) / N**0.5).bfloat16()
    dh, db = linear_dgelu_bgrad(dy, w2, h)
    dhr, dbr = linear_dgelu_bgrad_ref(dy, w2, h)
    dw, dbw = linear_wgrad_bgrad(dh, x)
    dwr, dbwr = linear_wgrad_bgrad_ref(dh, x)
    res["check"] = {"shape": [M, K, N, N2], "a_rel": _rel(a, ar), "h_rel": _rel(h, hr), "dh_rel": _rel(dh, dhr),
                    "db_rel": _rel(db, dbr), "dw_rel": _rel(dw, dwr), "db_wgrad_rel": _rel(dbw, dbwr)}
    print("check:", json.dumps(res["check"]), flush=True)


def block(name: str, tokens: int, d: int, H: int, res: dict) -> None:
    from kernels.common.timing import replay_ms
    from kernels.ffn.bias_gelu import bias_gelu
    from kernels.ffn.epilogue import gelu_ffn

    g = torch.Generator(device="cuda").manual_seed(0)
    w1 = (torch.randn(H, d, device="cuda", generator=g) / d**0.5).bfloat16().requires_grad_()
    b1 = (0.1 * torch.randn(H, device="cuda", generator=g)).bfloat16().requires_grad_()
    w2 = (torch.randn(d, H, device="cuda", generator=g) / H**0.5).bfloat16().requires_grad_()
    b2 = (0.1 * torch.randn(d, device="cuda", generator=g)).bfloat16().requires_grad_()
    x = torch.randn(tokens, d, device="cuda", generator=g).bfloat16().requires_grad_()
    gy = torch.randn(tokens, d, device="cuda", generator=g).bfloat16()
    params = [x, w1, b1, w2, b2]
    runs = {
        "triton_exact": (lambda t: F.linear(bias_gelu(F.linear(t, w1), b1), w2, b2), "none"),
        "cublaslt_tanh": (lambda t: gelu_ffn(t, w1, b1, w2, b2), "tanh"),  # the default: dbias summed by torch
        "cublaslt_tanh_dgelu_bgrad": (lambda t: gelu_ffn(t, w1, b1, w2, b2, dbias="dgelu"), "tanh"),
        "cublaslt_tanh_wgrad": (lambda t: gelu_ffn(t, w1, b1, w2, b2, dbias="wgrad"), "tanh"),
        "eager_tanh": (lambda t: F.linear(F.gelu(F.linear(t, w1, b1), approximate="tanh"), w2, b2), "tanh"),
    }
    # gradients against an fp32 reference of each GELU, on the first n tokens (all of them would
    # not fit in fp32 beside the runs)
    n = min(tokens, 16_384)
    ref = {}
    for approx in ("none", "tanh"):
        ps = [(p.detach()[:n] if p is x else p.detach()).float().requires_grad_() for p in params]
        F.linear(F.gelu(F.linear(ps[0], ps[1], ps[2]), approximate=approx), ps[3], ps[4]).backward(gy[:n].float())
        ref[approx] = [p.grad for p in ps]
    out = {"tokens": tokens, "d": d, "hidden": H, "flop": 3 * 2 * 2 * tokens * d * H}
    for run, (fn, approx) in runs.items():
        def step(fn=fn):
            for p in params:
                p.grad = None
            fn(x).backward(gy)
        out[f"{run}_ms"] = replay_ms(step, rep=200)
        xs = x.detach()[:n].clone().requires_grad_()
        for p in params:
            p.grad = None
        fn(xs).backward(gy[:n])
        out[f"{run}_grad_rel_err"] = [_rel(g_, r) for g_, r in zip([xs.grad] + [p.grad for p in params[1:]], ref[approx])]
    for run in runs:
        if run != "triton_exact":
            out[f"speedup_{run}"] = out["triton_exact_ms"] / out[f"{run}_ms"]
    out["tflops_triton_exact"] = out["flop"] / out["triton_exact_ms"] / 1e9
    out["tflops_cublaslt_tanh"] = out["flop"] / out["cublaslt_tanh_ms"] / 1e9
    res["blocks"][name] = out
    print(f"{name}:", json.dumps(out), flush=True)
    out["kernels_ms"] = {run: _kernels(lambda fn=fn: fn(x).backward(gy)) for run, (fn, _) in runs.items()}
    print(f"{name} kernels:", json.dumps(out["kernels_ms"]), flush=True)


def _kernels(step, n: int = 5) -> dict:
    """Device ms per call of ``step`` by kernel (the profiler), the 8 longest."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    rows = sorted(p.key_averages(), key=lambda e: -e.self_device_time_total)[:8]
    return {e.key[:90]: e.self_device_time_total / n / 1e3 for e in rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (cuBLASLt)")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
           "blocks": {}}
    check(res)
    for name, (t, d, H) in SHAPES.items():
        block(name, t, d, H, res)
    a.out.mkdir(parents=True, exist_ok=True)
    tmp = a.out / "ffn_epilogue.json.tmp"
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(a.out / "ffn_epilogue.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
