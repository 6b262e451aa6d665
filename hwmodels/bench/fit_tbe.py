"""Fit the table-batched lookup model (``hwmodels.kernels.tbe_time_s``) to the H200 lookup sweep.

The sweep (``executor/bench/lookup_sweep.py`` → ``hwmodels/data/measured/lookup_sweep_h200_*.json``)
times our Triton TBE, one launch over ``tables`` tables: the pooled forward, and the backward with
the row-wise Adagrad update fused in. Two small models, each three numbers, minimax relative error
over the rows (grid search, as ``fit_attention`` and ``fit_cpu`` fit the curves):

    forward  = fwd_fixed_s + max(bags · per_bag_s, (ids + bags) · row_bytes / (hbm_bw · read_eff))
    backward = bwd_fixed_s + ids · per_id_s + unique_rows · (2 · row_bytes + 8) / (hbm_bw · update_eff)

The forward is bound by its bags at small pooling (one program per bag: ~0.6 ns a bag whatever its
width) and by the rows it gathers at large pooling, at an effective rate above HBM's (repeated hot
rows come from the L2, so ``read_eff`` may exceed 1). The backward has a fixed floor (sort, segment
and chunk bookkeeping: ~0.5 ms at any size), a per-occurrence cost (the gradient rows read and
sorted) and the unique rows' update (row and Adagrad state read and written once per unique row).
``unique_rows`` is what the sweep counted; the twin computes it from the id law
(``scenarios.distributions.expected_unique_ids``).

Left out of the fit, and printed: bf16 tables at pooling 100 (our bf16 path runs 1.6x slower than
fp32 there; a kernel issue, not a bytes effect).

    python -m hwmodels.bench.fit_tbe [path/to/lookup_sweep.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from hwmodels.gpus import get_gpu

SWEEP = Path(__file__).resolve().parents[1] / "data" / "measured" / "lookup_sweep_h200_2026-12-04.json"


def rows(path: Path = SWEEP) -> list[dict]:
    return json.loads(Path(path).read_text())["cases"]


def excluded(c: dict) -> bool:
    """Rows the fit leaves out (reported apart): bf16 at heavy pooling."""
    return c["dtype"] == "bf16" and c["pooling"] >= 32


def _arrays(cases: list[dict]) -> dict[str, np.ndarray]:
    """The rows as arrays; times are the profiler's device times where the sweep has them (a step
    replayed from a CUDA graph runs the kernels without the eager launches' host gaps)."""
    a = {k: np.array([c[k] for c in cases], dtype=float) for k in ("ids", "bags", "unique_rows", "dim")}
    for d in ("fwd", "bwd"):
        a[f"{d}_s"] = np.array([c.get(f"{d}_kernels_s") or c[f"{d}_s"] for c in cases], dtype=float)
    a["row_bytes"] = a["dim"] * np.array([4.0 if c["dtype"] == "fp32" else 2.0 for c in cases])
    return a


def predict_fwd(a, fixed_s, per_bag_s, read_Bps):
    return fixed_s + np.maximum(a["bags"] * per_bag_s, (a["ids"] + a["bags"]) * a["row_bytes"] / read_Bps)


def predict_bwd(a, fixed_s, per_id_s, update_Bps):
    return fixed_s + a["ids"] * per_id_s + a["unique_rows"] * (2 * a["row_bytes"] + 8) / update_Bps


def _grid(predict, a, t, axes) -> tuple[tuple[float, ...], float]:
    """The point of the 3-D grid ``axes`` with the smallest worst relative error."""
    x, y, z = np.meshgrid(*axes, indexing="ij")
    pred = predict({k: v[None, None, None, :] for k, v in a.items()}, x[..., None], y[..., None], z[..., None])
    err = np.abs(pred / t - 1).max(-1)
    i = np.unravel_index(np.argmin(err), err.shape)
    return (float(x[i]), float(y[i]), float(z[i])), float(err[i])


def fit(cases: list[dict], hbm_Bps: float) -> dict[str, float]:
    kept = [c for c in cases if not excluded(c)]
    a = _arrays(kept)
    fixed = np.linspace(0.0, 20e-6, 41)
    (f0, per_bag, read), e_f = _grid(predict_fwd, a, a["fwd_s"], (fixed, np.linspace(0.3e-9, 0.9e-9, 61),
                                                                   np.linspace(0.5, 3.0, 101) * hbm_Bps))
    (b0, per_id, upd), e_b = _grid(predict_bwd, a, a["bwd_s"], (np.linspace(0.0, 0.4e-3, 81),
                                                                np.linspace(0.0, 0.8e-9, 81),
                                                                np.linspace(0.05, 1.0, 96) * hbm_Bps))
    return dict(fwd_fixed_s=f0, per_bag_s=per_bag, read_eff=read / hbm_Bps, fwd_max_err=e_f,
                bwd_fixed_s=b0, per_id_s=per_id, update_eff=upd / hbm_Bps, bwd_max_err=e_b)


def main(argv: list[str] | None = None) -> dict[str, float]:
    argv = sys.argv[1:] if argv is None else argv
    cases = rows(Path(argv[0]) if argv else SWEEP)
    hbm = get_gpu("h200").hbm_bw_Bps
    p = fit(cases, hbm)
    print(f"forward : fixed {p['fwd_fixed_s'] * 1e6:.2f} us, per bag {p['per_bag_s'] * 1e9:.3f} ns, "
          f"read_eff {p['read_eff']:.3f} of HBM ({p['read_eff'] * hbm / 1e12:.2f} TB/s): max err {p['fwd_max_err']:.1%}")
    print(f"backward: fixed {p['bwd_fixed_s'] * 1e6:.1f} us, per id {p['per_id_s'] * 1e9:.3f} ns, "
          f"update_eff {p['update_eff']:.3f} of HBM ({p['update_eff'] * hbm / 1e12:.2f} TB/s): max err {p['bwd_max_err']:.1%}")
    a = _arrays(cases)
    pf = predict_fwd(a, p["fwd_fixed_s"], p["per_bag_s"], p["read_eff"] * hbm)
    pb = predict_bwd(a, p["bwd_fixed_s"], p["per_id_s"], p["update_eff"] * hbm)
    for c, f, b, tf, tb in zip(cases, pf, pb, a["fwd_s"], a["bwd_s"]):
        tag = "  (left out)" if excluded(c) else ""
        print(f"  T{c['tables']:<3} R{c['rows']:<9} D{c['dim']:<4} P{c['pooling']:<4} B{c['batch']:<6} {c['dtype']} "
              f"s{c['skew']:<5} fwd {tf * 1e6:7.1f} us model {f * 1e6:7.1f} ({f / tf - 1:+6.1%})  "
              f"bwd {tb * 1e6:7.1f} us model {b * 1e6:7.1f} ({b / tb - 1:+6.1%}){tag}")
    return p


if __name__ == "__main__":
    main()
