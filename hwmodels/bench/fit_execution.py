"""Fit the padded reference attention's coefficients (hwmodels/data/execution.yaml) to its bench, torch-free.

    .venv/bin/python -m hwmodels.bench.fit_execution            # prints the fit and each case's error

Reads ``hwmodels/data/measured/reference_attention_h200_2026-12-02.json``
(``hwmodels/bench/execution_bench.py --only reference_attention`` on the lent H200) and fits, per phase (forward;
backward, which recomputes the scores under the reference's own checkpoint), the effective bytes that
``twin.execution_cost`` prices on the elementwise curve:

    kernels_s = bmm_s + (alpha[weights] · E + rho · tensors · P) / elementwise_Bps

E = the padded score elements (G·H·n², cross attention B·H·N·n), P = the padded rows' elements
(G·n·H·D), ``tensors`` = how many of them are padded or unpadded (self: q, k, v and the output; cross:
two), ``bmm_s`` = each batched matmul at max(gemm compute, its bytes at the elementwise curve).
``alpha`` is one number per weight function (GDPA's activation·scale·mask; softmax's casts, scale,
masked fill, softmax, NaN fill); ``rho`` holds the gathers, strided copies (``permute().reshape``),
concatenations and, in backward, the atomic ``index_add_`` of every padded tensor. Weighted least
squares on the relative error over the self-attention cases (cross attention's backward has no
recompute: its scores take ``alpha_bwd - alpha_fwd``, its rows a ``rho`` of their own). The
forward's host-sync gap (wall minus kernels: the reference reads lengths and ``nonzero`` on the host)
is the mean over the cases.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hwmodels.gpus import get_gpu
from hwmodels.kernels import DEFAULT_MODEL

FILE = Path(__file__).resolve().parents[1] / "data" / "measured" / "reference_attention_h200_2026-12-02.json"
HEADS, HEAD_DIM, DENSE_TOKENS, BLOCK, ELEM = 4, 128, 32, 64, 2.0


def shapes(c: dict) -> dict:
    """E, P, tensors and the bmm's per-call FLOPs and bytes of one bench case (as twin.execution_cost counts them)."""
    B, n, kind = c["B"], c["max_len"], c["kind"]
    H, D = HEADS, HEAD_DIM
    if kind.startswith("cross"):
        E, P, tensors = B * H * DENSE_TOKENS * n, B * n * H * D, 2
        bmm_bytes = ELEM * (E + P + B * DENSE_TOKENS * H * D)
    else:
        G, m = (c["blocks"], BLOCK) if kind == "block" else (B, n)
        E, P, tensors = G * H * m * m, G * m * H * D, 4
        bmm_bytes = ELEM * (E + 2 * P)
    return {"E": float(E), "P": float(P), "tensors": tensors, "bmm_flops": 2.0 * E * D, "bmm_bytes": bmm_bytes,
            "cross": kind.startswith("cross"), "weights": "gdpa" if kind == "gdpa" else "softmax"}


def bmm_s(flops: float, nbytes: float, gpu: str = "h200") -> float:
    """One padded batched matmul: the gemm curve's compute side against its bytes at the elementwise curve."""
    spec = get_gpu(gpu)
    c = DEFAULT_MODEL.cost(kind="gemm", flops=flops, bytes=0.0, gpu=spec, dtype="bf16")
    m = DEFAULT_MODEL.cost(kind="elementwise", flops=0.0, bytes=nbytes, gpu=spec, dtype="bf16")
    return max(c.compute_s, m.memory_s) + c.launch_s


def elementwise_Bps(gpu: str = "h200") -> float:
    """Bytes per second of the elementwise curve at large sizes (what the coefficients are priced at)."""
    c = DEFAULT_MODEL.cost(kind="elementwise", flops=0.0, bytes=1e12, gpu=get_gpu(gpu), dtype="bf16")
    return 1e12 / c.memory_s


def _kernels(c: dict, side: str) -> float:
    return sum(t for _, _, t in c[f"{side}_kernels"])


def fit(path: Path = FILE) -> dict:
    cases = [c for c in json.loads(path.read_text())["cases"] if "error" not in c]
    bw = elementwise_Bps()
    out: dict = {}
    for side, n_bmm in (("fwd", 2), ("bwd", 6)):
        A, y = [], []
        for c in cases:
            s = shapes(c)
            if s["cross"]:
                if side == "bwd":
                    continue
            rest = (_kernels(c, side) - (n_bmm if side == "fwd" or not s["cross"] else 4) * bmm_s(s["bmm_flops"], s["bmm_bytes"])) * bw
            A.append([s["E"] if s["weights"] == "gdpa" else 0.0, s["E"] if s["weights"] == "softmax" else 0.0,
                      s["tensors"] * s["P"]])
            y.append(rest)
        A, y = np.array(A), np.array(y)
        x = np.linalg.lstsq(A / y[:, None], np.ones(len(y)), rcond=None)[0]
        out[side] = {"alpha_gdpa": float(x[0]), "alpha_softmax": float(x[1]), "rho": float(x[2])}
    cross = [c for c in cases if shapes(c)["cross"]]
    num = [(_kernels(c, "bwd") - 4 * bmm_s(shapes(c)["bmm_flops"], shapes(c)["bmm_bytes"])) * bw
           - shapes(c)["E"] * (out["bwd"]["alpha_softmax"] - out["fwd"]["alpha_softmax"]) for c in cross]
    den = [shapes(c)["tensors"] * shapes(c)["P"] for c in cross]
    out["bwd"]["rho_cross"] = float(np.linalg.lstsq(np.array(den)[:, None] / np.array(num)[:, None],
                                                    np.ones(len(num)), rcond=None)[0][0])
    out["sync_s"] = float(np.mean([c["fwd_s"] - _kernels(c, "fwd") for c in cases]))
    return out


def main() -> None:
    f = fit()
    print(json.dumps(f, indent=1))


if __name__ == "__main__":
    main()
