"""Fit the Hopper attention efficiency curves (``efficiency.yaml``) to our measured kernels.

Reads the attention suite benchmark (``kernels/attention/bench.py`` on the lent H200) and the
block-local tile sweep (``kernels/flash/gpu_check.py --only block``), prices every measured call
the way the twin does (``kernels/attention/cost.py``: FLOPs of the attended pairs, bytes of a fused
kernel) and fits, per kind and direction, the saturating curves of ``hwmodels/kernels.py``
(compute ``eff_max``, ``x_half_flops``; memory ``eff_max``) by minimax relative error over the rows
with the family's launch time fixed. Prints the fitted curves and each row's error::

    python -m hwmodels.bench.fit_attention

The suite's rows are one batch shape (B = 1152, H = 4, d = 128, lengths uniform in [L/2, L], plus a
lognormal law); efficiency falls with shorter samples (fewer, smaller tiles per sample), not with
fewer samples, so these curves are marked ``x_half_per: segment``: ``x_half_flops`` is per
(sample, head) sequence and the twin multiplies it by the call's ``B·H`` (``KernelModel.cost``).

The training shapes are rows too (``STEP_BENCH``: ``python -m kernels.flash.step_bench`` on the lent
H200, each op as ``gemtwin train gem-h200-1gpu`` calls it, CUDA-graph replays): causal GDPA at
B = 256, lengths uniform in [512, 1024], and the two cross attentions against 32 non-sequence tokens,
whose backward is the one-kernel short-side path (``tiles.SHORT_SIDE_CONFIG``, ``fused_short``) that
the suite's 256-token K/V never takes. Each op's row is the variant the tile table runs today
(``TABLE_VARIANT``). The cross attention is softmax under selective checkpointing, so its measured
backward holds one recomputed forward, which the twin prices as its own op: the row's backward is
the measured backward less the measured forward.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hwmodels.gpus import get_gpu
from kernels.attention.cost import attention_cost

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "hwmodels/data/measured/attention_bench_h200_2026-11-30.json"
BLOCK = ROOT / "hwmodels/data/runs/h200-2026-11-30-flash/2026-11-30_v4_block_h200.json"
BLOCK_TILES = ("local fwd r64g1w4s1", "local bwd r64g4w4s3")  # the GPU table's tiles (core.py)
N_DENSE = 256
STEP_BENCH = ROOT / "hwmodels/data/runs/h200-2026-11-30-executor/s20-step-bench.json"
# the variant of each step-bench op that today's tile table runs (kernels/flash/tiles.py): causal GDPA
# at <= 1024 -> SHORT_CAUSAL_ACT (the table's own row then); a side <= 64 rows -> SHORT_SIDE_CONFIG,
# whose one-kernel backward (fused_short 32 rows, 4 warps, 3 stages) is the bench's short32w4s3
TABLE_VARIANT = {"self": "table", "cross": "short32w4s3"}
LAUNCH_S = 5e-6
KIND = {"jfa_causal": "jfa", "gdpa_silu": "gdpa", "gdpa_silu_dense_kv256": "gdpa",
        "block64": "block", "jagged_q_dense_kv256": "asym", "dense_q256_jagged_kv": "asym"}


def _tokens(row: dict) -> tuple[int, int]:
    dense = row["B"] * N_DENSE
    if row["case"].endswith("dense_kv256"):
        return row["tokens"], dense
    if row["case"].startswith("dense_q"):
        return dense, row["tokens"]
    return row["tokens"], row["tokens"]


def rows() -> list[tuple[str, str, float, float, float, str, int]]:
    """(kind, fwd|bwd, flops, bytes, measured seconds, label, B·H sequences) of every measured call."""
    bench = json.loads(BENCH.read_text())
    block = json.loads(BLOCK.read_text())["timing"]["block"]
    out = []
    for r in bench["rows"]:
        kind = KIND[r["case"]]
        q, kv = _tokens(r)
        c = attention_cost(pairs=r["fwd_flops"] / (4 * r["H"] * r["d"]), q_tokens=q, kv_tokens=kv,
                           heads=r["H"], head_dim=r["d"], elem_bytes=2)
        times = r["impls"]["ours"]
        if kind == "block" and r["L"] != "lognormal":  # the block-local tiles now in the table
            t = {d: next(b[f"{d}_ms"] for b in block if b["L"] == r["L"] and b["path"] == p)
                 for d, p in zip(("fwd", "bwd"), BLOCK_TILES)}
            times = {"fwd_ms": t["fwd"], "bwd_ms": t["bwd"]}
        label = f"{r['case']} L={r['L']}"
        seqs = r["B"] * r["H"]
        out.append((kind, "fwd", c.fwd_flops, c.fwd_bytes, times["fwd_ms"] * 1e-3, label, seqs))
        out.append((kind, "bwd", c.bwd_flops, c.bwd_bytes, times["bwd_ms"] * 1e-3, label, seqs))
    return out + training_rows()


def training_rows() -> list[tuple[str, str, float, float, float, str, int]]:
    """The step bench's ops at gem-h200-1gpu's shapes (module docstring), as ``rows()``' tuples.

    The bench records the batch's token count, not its lengths: the attended pairs are the
    scenario's expected causal pairs (``twin.flops.SeqStats``) scaled by the square of the
    measured over the expected tokens (lengths uniform in [512, 1024]: pairs grow as length²)."""
    import scenarios
    from twin.flops import SeqStats

    bench = json.loads(STEP_BENCH.read_text())
    meta = bench["meta"]
    s = scenarios.load(meta["scenario"])
    m = s.model
    B, rows_, N = meta["batch"], meta["rows"], m.nonseq.num_tokens
    st = SeqStats.expected(m, B)
    self_pairs = st.self_pairs * (rows_ / st.tokens) ** 2
    out = []
    for name, op in bench["ops"].items():
        cross = name.startswith("cross")
        t = op["variants"][TABLE_VARIANT["cross" if cross else "self"]]
        stack = m.cross if cross else m.sequence
        if cross:
            q, kv = (rows_, B * N) if "q jagged" in name else (B * N, rows_)
            pairs, kind = rows_ * N, "asym"
        else:
            q = kv = rows_
            pairs, kind = self_pairs, m.sequence.attention
        c = attention_cost(pairs=pairs, q_tokens=q, kv_tokens=kv, heads=stack.heads, head_dim=stack.head_dim,
                           elem_bytes=2)
        bwd = t["bwd_ms"] - (t["fwd_ms"] if cross and meta["recompute"] else 0.0)  # the recomputed forward
        label = (f"train cross {'q' if 'q jagged' in name else 'kv'} jagged N={N}" if cross
                 else f"train {kind} causal={m.sequence.causal}")
        seqs = B * stack.heads
        out.append((KIND.get(kind, kind), "fwd", c.fwd_flops, c.fwd_bytes, t["fwd_ms"] * 1e-3, label, seqs))
        out.append((KIND.get(kind, kind), "bwd", c.bwd_flops, c.bwd_bytes, bwd * 1e-3, label, seqs))
    return out


def fit(flops: np.ndarray, bytes_: np.ndarray, t: np.ndarray, seqs: np.ndarray, peak: float, bw: float):
    """Minimax fit of (eff_c, x_half_flops per sequence, eff_m): predicted = max(compute, memory) + launch."""
    eff_c = np.linspace(0.05, 0.95, 181)[:, None, None, None]
    x_half = np.concatenate([[0.0], np.logspace(4, 9, 101)])[None, :, None, None] * seqs
    eff_m = np.linspace(0.3, 1.0, 141)[None, None, :, None]
    comp = (flops + x_half) / (peak * eff_c)
    mem = bytes_ / (bw * eff_m)
    err = np.abs((np.maximum(comp, mem) + LAUNCH_S) / t - 1).max(-1)
    i = np.unravel_index(np.argmin(err), err.shape)
    return float(eff_c.flat[i[0]]), float(x_half[0, i[1], 0, 0] / seqs[0]), float(eff_m.flat[i[2]]), float(err[i])


def main() -> None:
    gpu = get_gpu("h200")
    peak, bw = gpu.peak("bf16"), gpu.hbm_bw_Bps
    data = rows()
    for kind in ("jfa", "gdpa", "block", "asym"):
        for d in ("fwd", "bwd"):
            sel = [r for r in data if r[0] == kind and r[1] == d]
            f, b, t, n = (np.array([r[i] for r in sel], dtype=float) for i in (2, 3, 4, 6))
            ec, xh, em, err = fit(f, b, t, n, peak, bw)
            print(f"attention.{kind}.{d}: compute eff_max {ec:.3f} x_half_flops {xh:.3g} per sequence; "
                  f"memory eff_max {em:.3f}; max err {err:.1%} over {len(sel)} rows")
            for (_, _, fl, by, ts, label, seqs) in sel:
                pred = max((fl + xh * seqs) / (peak * ec), by / (bw * em)) + LAUNCH_S
                print(f"    {label:34s} measured {ts * 1e3:8.3f} ms  model {pred * 1e3:8.3f} ms  "
                      f"{pred / ts - 1:+6.1%}  ({fl / ts / 1e12:5.0f} TFLOP/s, {by / ts / 1e12:4.2f} TB/s)")


if __name__ == "__main__":
    main()
