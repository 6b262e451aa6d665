"""Fit the ``cpu`` family (efficiency.yaml), the ``cpu`` catalog numbers (gpus.yaml) and the
``cpu-host`` preset (networks.yaml) to the CPU profile (``hwmodels/bench/cpu_profile.py``).

    python -m hwmodels.bench.fit_cpu        # prints the fitted numbers and every row's error

Torch-free: it reads the newest ``hwmodels/data/measured/cpu_*.json`` and prices every measured
call as the twin does (twin/flops.py, kernels/attention/cost.py: FLOPs of the attended pairs, bytes
of a fused kernel; embedding bytes as ``_Ops.lookup``), then fits, per kernel kind, the curves of
``hwmodels/kernels.py`` (compute ``eff_max``, ``x_half_flops``; memory ``eff_max``, ``x_half_bytes``)
by minimax relative error over the kind's rows, with ``launch_s`` fixed at the measured per-op
overhead. ``--yaml`` prints the numbers and notes the catalog carries. The tests
(tests/hwmodels/test_cpu_profile.py) import ``FITS`` and ``fitted_rows()`` and hold the catalog's curves
to the same rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from kernels.attention.cost import attention_cost, cross_pairs, self_pairs

MEASURED = Path(__file__).resolve().parents[1] / "data" / "measured"
LAUNCH_ROW = "add 1-element (torch.add(a, b))"
DRAM_COPY_MIN_BYTES = 2 * 64 * 2**20  # a copy of >= 64 MiB (2 x the 32 MiB L3) streams from DRAM


@cache
def profile_path() -> Path:
    """The newest CPU profile (file names sort by ISO date)."""
    files = sorted(MEASURED.glob("cpu_*.json"))
    if not files:
        raise FileNotFoundError(f"no cpu_*.json in {MEASURED}; run hwmodels/bench/cpu_profile.py")
    return files[-1]


@cache
def profile() -> dict:
    """The profile, parsed once."""
    return json.loads(profile_path().read_text(encoding="utf-8"))


def _ok(r: dict) -> bool:
    return "error" not in r


def launch_s() -> float:
    """The measured per-op overhead: an eager ``torch.add`` of two 1-element tensors."""
    return next(r["time_s"] for r in profile()["rows"] if r["name"] == LAUNCH_ROW)


def peak_flops(dtype: str) -> float:
    """The best ``torch.mm`` rate measured in ``dtype`` (a measured rate, not a datasheet peak)."""
    return max(r["achieved_flops_per_s"] for r in profile()["rows"]
               if _ok(r) and r["kind"] == "gemm" and r["dtype"] == dtype and r["flops"] > 2)


def copy_Bps() -> float:
    """The best large-tensor (DRAM) copy rate, bytes read + written per second."""
    return max(r["achieved_Bps"] for r in profile()["rows"]
               if _ok(r) and r.get("op") == "copy" and r["bytes"] >= DRAM_COPY_MIN_BYTES)


@dataclass(frozen=True)
class Row:
    """One measured call as the twin prices it."""

    kind: str  # the twin's kernel kind (hwmodels.kernels.KERNEL_KINDS)
    dtype: str
    flops: float
    bytes: float
    seconds: float
    label: str
    segments: float = 1.0  # attention: samples x heads


def _attention(r: dict) -> tuple[float, float, float, float, float]:
    """(fwd flops, bwd flops, fwd bytes, bwd bytes, segments) of a measured attention call, fp32."""
    s = r["shape"]
    if r["name"].startswith("sdpa"):
        n = s["batch"] * s["q_len"]
        c = attention_cost(pairs=s["pairs_per_head"], q_tokens=n, kv_tokens=n, heads=s["heads"],
                           head_dim=s["head_dim"], elem_bytes=4)
        return c.fwd_flops, c.bwd_flops, c.fwd_bytes, c.bwd_bytes, s["batch"] * s["heads"]
    n = np.asarray(s["lengths"], dtype=np.float64)
    kind = r["kind"].split(".")[1]
    if kind == "asym":
        dense = s["batch"] * s["dense_tokens"]
        pairs = float(cross_pairs(s["dense_tokens"], n.sum()))
        q, kv = (n.sum(), dense) if s["jagged"] == "q" else (dense, n.sum())
    else:
        pairs = float(np.sum(self_pairs(n, block=s["block_size"], causal=s["causal"]) if kind == "block"
                             else self_pairs(n, causal=s["causal"])))
        q = kv = n.sum()
    c = attention_cost(pairs=pairs, q_tokens=q, kv_tokens=kv, heads=s["heads"], head_dim=s["head_dim"],
                       elem_bytes=4)
    return c.fwd_flops, c.bwd_flops, c.fwd_bytes, c.bwd_bytes, s["batch"] * s["heads"]


@cache
def rows() -> tuple[Row, ...]:
    """Every measured kernel row of the profile, priced as the twin prices it."""
    out = []
    for r in profile()["rows"]:
        if not _ok(r) or r["kind"].startswith("launch"):
            continue
        kind, t, label, dt = r["kind"], r["time_s"], r["name"], r["dtype"]
        if kind == "gemm":
            out.append(Row("gemm", dt, r["flops"], r["bytes"], t, label))
        elif kind == "elementwise":  # copy: 1 read + 1 write, add: 2 reads + 1 write (twin/flops.py elementwise)
            out.append(Row("elementwise", dt, 0.0, r["bytes"], t, label))
        elif kind in ("norm.fwd", "norm.bwd"):  # bytes as _Ops.norm: fwd 2x, bwd 3x the activation
            out.append(Row("norm", dt, 0.0, r["bytes"], t, label))
        elif kind.startswith("attention.") and kind.rsplit(".", 1)[1] in ("fwd", "bwd"):
            ff, bf, fb, bb, seg = _attention(r)
            fwd = kind.endswith(".fwd")
            out.append(Row(kind, dt, ff if fwd else bf, fb if fwd else bb, t, label, seg))
        elif kind in ("embedding.fwd", "embedding.bwd"):  # _Ops.lookup, fp32 rows
            s, e = r["shape"], 4.0
            ids, bags = s["ids"], s["bags"]
            b = ids * s["dim"] * e + bags * s["dim"] * e if kind.endswith("fwd") else \
                bags * s["dim"] * e + ids * (2 * s["dim"] * e + 8)
            out.append(Row(kind, dt, 0.0, b, t, label))
        elif kind == "optimizer":
            out.append(Row("optimizer", dt, 0.0, r["bytes"], t, label))
    return tuple(out)


# ---- the minimax fit ---------------------------------------------------------------------------
EFF = np.logspace(-4, 0, 161)  # CPU curves reach from 1e-4 (Python-loop attention) to 1 of the roofs
X_HALF = np.concatenate([[0.0], np.logspace(2, 11, 181)])


def predict(flops, bytes_, segments, *, rate_c, xh_c, rate_m, xh_m, launch, per_segment=False):
    """The twin's time (hwmodels/kernels.py KernelModel.cost) for arrays of calls."""
    xh_c = xh_c * segments if per_segment else xh_c
    comp = np.where(flops > 0, (flops + xh_c) / rate_c, 0.0)
    mem = np.where(bytes_ > 0, (bytes_ + xh_m) / rate_m, 0.0)
    return np.maximum(comp, mem) + launch


def fit_memory(sel: list[Row], bw: float, launch: float, *, no_x_half: bool = False) -> tuple[float, float, float]:
    """(eff_max, x_half_bytes, max error) of a bytes-only curve."""
    b = np.array([r.bytes for r in sel])[None, None, :]
    t = np.array([r.seconds for r in sel])[None, None, :]
    x_half = X_HALF[:1] if no_x_half else X_HALF
    pred = (b + x_half[None, :, None]) / (bw * EFF[:, None, None]) + launch
    err = np.abs(pred / t - 1).max(-1)
    i, j = np.unravel_index(np.argmin(err), err.shape)
    return float(EFF[i]), float(x_half[j]), float(err[i, j])


def fit_compute(sel: list[Row], peak: float, bw: float, launch: float, *, per_segment: bool = False
                ) -> tuple[float, float, float, float]:
    """(compute eff_max, x_half_flops, memory eff_max, max error); memory x_half 0."""
    f = np.array([r.flops for r in sel])[None, None, :]
    b = np.array([r.bytes for r in sel])
    seg = np.array([r.segments for r in sel])[None, None, :] if per_segment else 1.0
    t = np.array([r.seconds for r in sel])[None, None, :]
    comp = (f + X_HALF[None, :, None] * seg) / (peak * EFF[:, None, None])
    best = (np.inf, 0, 0, 0)
    for k, em in enumerate(EFF):  # one memory efficiency at a time keeps the grid small
        err = np.abs((np.maximum(comp, (b / (bw * em))[None, None, :]) + launch) / t - 1).max(-1)
        i, j = np.unravel_index(np.argmin(err), err.shape)
        if err[i, j] < best[0]:
            best = (float(err[i, j]), i, j, k)
    err, i, j, k = best
    return float(EFF[i]), float(X_HALF[j]), float(EFF[k]), err


@dataclass(frozen=True)
class Fit:
    """What one kind's curve is fitted to: its rows of ``dtype`` that ``pinned`` keeps (the tests hold
    the catalog's curve to those rows), the side(s) fitted, and why rows are left out."""

    dtype: str = "fp32"
    compute: bool = False  # fit compute eff_max, x_half_flops and memory eff_max (else memory eff_max, x_half_bytes)
    pinned: object = None  # Row -> bool; None: every row
    why: str = ""
    no_x_half: bool = False  # memory x_half fixed at 0


def _dram(r: Row) -> bool:
    """A stream whose tensors are >= 64 MiB (2 x the 32 MiB L3): it runs from DRAM."""
    return "elems" in r.label and int(r.label.split()[2]) * 4 >= 64 * 2**20


_GATHER_WHY = ("the reference's jagged-q path gathers each token's N keys and values ([sum L, N, H, D]: 32x what "
               "a fused kernel moves at N = 32) while the jagged-kv path does not; the twin's bytes cannot tell "
               "them apart")


def _not_big_jagged_q(r: Row) -> bool:
    return "jagged q B64" not in r.label


FITS: dict[str, Fit] = {
    "gemm": Fit(compute=True),
    "gemm.bf16": Fit(dtype="bf16", compute=True),
    "elementwise": Fit(pinned=_dram, no_x_half=True,
                       why="in-cache streams (tensors <= 16 MiB) run up to 6x faster than the DRAM rate this curve "
                           "prices every byte at (eff_max cannot pass 1; x_half is held at 0 not to make them slower)"),
    "norm": Fit(),
    "embedding.fwd": Fit(),
    "embedding.bwd": Fit(pinned=lambda r: r.label.startswith("embedding_bag"),
                         why="nn.Embedding's sparse backward only wraps the output gradient as a sparse tensor "
                             "(~45 us at any size measured): the row traffic the twin counts happens later, "
                             "in the optimizer step's coalesce"),
    "optimizer": Fit(pinned=lambda r: "debug-cpu" in r.label or "16777216" in r.label,
                     why="AdamW on CPU costs ~50 us per parameter tensor (debug-cpu: 105 tensors), which bytes "
                         "cannot see, and runs 3-4x faster when its tensors stay in cache: the curve is fitted to "
                         "debug-cpu's own parameters and one DRAM-bound tensor"),
    **{f"attention.{a}.{d}": Fit(compute=True) for a in ("sdpa", "jfa", "gdpa", "block") for d in ("fwd", "bwd")},
    "attention.asym.fwd": Fit(compute=True, pinned=_not_big_jagged_q, why=_GATHER_WHY),
    "attention.asym.bwd": Fit(compute=True, pinned=_not_big_jagged_q, why=_GATHER_WHY),
}


def fitted_rows(name: str) -> list[Row]:
    """The rows the curve ``name`` (a FITS key) is fitted to."""
    spec = FITS[name]
    kind = name.removesuffix(".bf16")
    return [r for r in rows()
            if r.kind == kind and r.dtype == spec.dtype and (spec.pinned is None or spec.pinned(r))]


def unfitted_rows(name: str) -> list[Row]:
    """The kind's other rows of that dtype (reported, not fitted)."""
    keep = {r.label for r in fitted_rows(name)}
    kind, dt = name.removesuffix(".bf16"), FITS[name].dtype
    return [r for r in rows() if r.kind == kind and r.dtype == dt and r.label not in keep]


@cache
def fit(name: str) -> dict:
    """The fitted curve ``name``: compute/memory eff_max and x_half, and its max error on its rows."""
    spec, launch, bw = FITS[name], launch_s(), copy_Bps()
    sel = fitted_rows(name)
    if spec.compute:
        ec, xh, em, err = fit_compute(sel, peak_flops(spec.dtype), bw, launch)
        return {"compute_eff_max": ec, "compute_x_half_flops": xh, "memory_eff_max": em, "memory_x_half_bytes": 0.0,
                "max_err": err, "rows": len(sel)}
    em, xh, err = fit_memory(sel, bw, launch, no_x_half=spec.no_x_half)
    return {"compute_eff_max": None, "compute_x_half_flops": None, "memory_eff_max": em, "memory_x_half_bytes": xh,
            "max_err": err, "rows": len(sel)}


def model_s(name: str, r: Row, f: dict | None = None) -> float:
    """The fitted curve's time for one row."""
    f = f or fit(name)
    spec = FITS[name]
    kw = dict(rate_c=peak_flops(spec.dtype) * (f["compute_eff_max"] or 1.0), xh_c=f["compute_x_half_flops"] or 0.0,
              rate_m=copy_Bps() * f["memory_eff_max"], xh_m=f["memory_x_half_bytes"], launch=launch_s())
    return float(predict(np.array(r.flops), np.array(r.bytes), np.array(r.segments), **kw))


# ---- the gloo sweep -> the cpu-host tier ---------------------------------------------------------
GLOO_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def gloo_rows() -> list[tuple[str, int, float]]:
    """(kind, msg_bytes, seconds) of every row of the profile's 2-process gloo sweep."""
    return [(r["kind"], r["msg_bytes"], r["time_s"]) for r in profile()["gloo"]["rows"] if "time_s" in r]


def host_tier_fit() -> dict:
    """bw_per_gpu_Bps (the best bus bandwidth of the sweep), kind_latency_s (each kind's 4-byte
    time) and efficiency_points (``fit_efficiency_points``: exact at every measured size >= 1 KiB
    whose time exceeds the kind's latency, log-size interpolated between, flat beyond)."""
    from hwmodels.collectives import bus_factor, fit_efficiency_points
    from hwmodels.network import Tier

    data = gloo_rows()
    lat = {k: min(t for kk, m, t in data if kk == k and m <= 4) for k in GLOO_KINDS}
    # the best bus rate once the kind's latency is paid: every fitted efficiency is <= 1
    bw = max(bus_factor(k, 2) * m / (t - lat[k]) for k, m, t in data if m > 4 and t > 1.05 * lat[k])
    tier = Tier(name="host", fabric="host", domain_gpus=2, bw_per_gpu_Bps=bw, latency_s=0.0, efficiency=1.0,
                kind_latency_s=lat, sources=["x"])
    points = {k: fit_efficiency_points(tier=tier, kind=k, group_size=2,
                                       rows=[(m, t) for kk, m, t in data if kk == k and m > 4 and t > 1.05 * lat[k]])
              for k in GLOO_KINDS}
    return {"bw_per_gpu_Bps": bw, "kind_latency_s": lat, "efficiency_points": points}


# ---- the YAML the catalog carries (python -m hwmodels.bench.fit_cpu --yaml) --------------------------
def _g(x: float) -> str:
    """3 significant digits, or 4 in exponent form with its dot (PyYAML reads ``1e+06`` as a string)."""
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 or x == 0 else f"{x:.3e}".replace("e-0", "e-").replace("e+0", "e+")


WHAT = {  # what each curve's rows are (efficiency.yaml notes)
    "gemm": "torch.mm fp32, 128^3..2048^3 and the executor's skinny shapes (2048x32x96 .. 65536x64x64)",
    "gemm.bf16": "torch.mm bf16, the same shapes but 2048^3; the rate falls from ~2.9 GFLOP/s (executor-sized) to "
                 "~1 (1024^3): a saturating curve cannot follow it",
    "elementwise": "copy_ and add of fp32 tensors of 64-512 MiB (DRAM)",
    "norm": "F.layer_norm fp32 fwd and bwd, 128x32 .. 131072x256 (bytes: fwd 2x, bwd 3x the activation)",
    "embedding.fwd": "nn.EmbeddingBag sum (debug-cpu's 500x32, 128 bags of 3 .. 1M x 128, 16,384 bags of 32) "
                     "and nn.Embedding lookups, fp32",
    "embedding.bwd": "nn.EmbeddingBag's sparse backward, the same tables",
    "optimizer": "torch.optim.AdamW step (bytes: 28 per parameter, 40 with the grad-norm clip): debug-cpu's dense "
                 "parameters with its clip, and one tensor of 16.8M parameters",
    "attention.sdpa.fwd": "F.scaled_dot_product_attention fp32, B128 L16 .. B4 L1024, causal and not (the executor "
                          "does not call it on CPU)",
    "attention.jfa.fwd": "executor/attention.py's exact-pair reference (a Python loop over query positions, ~20 "
                         "ops each): debug-cpu's shape (B128 H2 D32, lengths 8..24, causal), B32, B512, L<=48, "
                         "L<=96 at H4 D64, and non-causal",
    "attention.gdpa.fwd": "the reference, SiLU, causal: debug-cpu's shape and L<=96 at H4 D64",
    "attention.block.fwd": "the reference, 64-token blocks, causal: debug-cpu's shape and L<=256",
    "attention.asym.fwd": "the reference cross attention, jagged q and jagged kv at debug-cpu's shape (x 8 dense "
                          "tokens), jagged kv at L<=96 x 32, H4 D64",
}


def _what(name: str) -> str:
    base = name.replace(".bwd", ".fwd")
    text = WHAT.get(name) or WHAT.get(base, "")
    return text + (" (backward)" if name.endswith(".bwd") and name not in WHAT else "")


def _note(name: str) -> str:
    f, spec = fit(name), FITS[name]
    text = f"{_what(name)}: max err {f['max_err']:.1%} over {f['rows']} rows"
    off = unfitted_rows(name)
    if off:
        errs = [model_s(name, r, f) / r.seconds - 1 for r in off]
        text += (f"; not fitted: {len(off)} row{'s' if len(off) > 1 else ''} ({min(errs):+.0%} .. "
                 f"{max(errs):+.0%}): {spec.why}")
    return text.replace('"', "'")


def yaml_blocks() -> str:
    """The cpu entries of gpus.yaml, efficiency.yaml and networks.yaml, from this profile (their numbers
    and fit notes; the prose around them is the YAML files' own)."""
    p = profile()
    env = p["env"]
    fp32, bf16, bw, launch = peak_flops("fp32"), peak_flops("bf16"), copy_Bps(), launch_s()
    best = {dt: max((r for r in p["rows"] if _ok(r) and r["kind"] == "gemm" and r["dtype"] == dt),
                    key=lambda r: r["achieved_flops_per_s"])["name"] for dt in ("fp32", "bf16")}
    out = ["# gpus.yaml cpu", f"fp32 {_g(fp32)} ({best['fp32']}), bf16 {_g(bf16)} ({best['bf16']}), "
           f"hbm_bytes {env['mem_total_bytes']}, hbm_bw_Bps {_g(bw)}, sms {env['os_cpu_count']}",
           "# efficiency.yaml cpu", f"    launch_s: {{value: {_g(launch)}, ...}}", "    kinds:"]
    for name, spec in FITS.items():
        if not fitted_rows(name):
            continue
        f = fit(name)
        mem = (f"memory: {{eff_max: {_g(f['memory_eff_max'])}, x_half_bytes: {_g(f['memory_x_half_bytes'])}, "
               f"source: cpu-profile}}")
        if name == "gemm.bf16":
            out.append(f"        dtypes:\n          bf16: {{compute: {{eff_max: {_g(f['compute_eff_max'])}, "
                       f"x_half_flops: {_g(f['compute_x_half_flops'])}, source: cpu-profile, "
                       f"note: \"{_note(name)}\"}}}}")
            continue
        out.append(f"      {name}:")
        if spec.compute:
            out.append(f"        compute: {{eff_max: {_g(f['compute_eff_max'])}, x_half_flops: "
                       f"{_g(f['compute_x_half_flops'])}, source: cpu-profile, note: \"{_note(name)}\"}}")
            out.append(f"        {mem}")
        else:
            out.append("        compute: {eff_max: 0.5, x_half_flops: 0.0, source: assumption-cpu, note: "
                       "\"the twin counts no FLOPs here: never binding\"}")
            out.append(f"        {mem[:-1]}, note: \"{_note(name)}\"}}")
    if p.get("gloo"):
        host = host_tier_fit()
        lat = ", ".join(f"{k}: {_g(v)}" for k, v in host["kind_latency_s"].items())
        pts = ",\n                            ".join(
            f"{k}: [" + ", ".join(f"[{m}, {e}]" for m, e in v) + "]" for k, v in host["efficiency_points"].items())
        out += ["# networks.yaml cpu-host", f"bw_per_gpu_Bps: {_g(host['bw_per_gpu_Bps'])}",
                f"         kind_latency_s: {{{lat}}},", f"         efficiency_points: {{{pts}}},"]
    return "\n".join(out)


def main() -> None:
    import sys

    if "--yaml" in sys.argv[1:]:
        print(yaml_blocks())
        return
    p = profile()
    launch, bw = launch_s(), copy_Bps()
    print(f"{profile_path().name}: torch {p['env']['torch']}, {p['env']['torch_threads']} threads, "
          f"{p['env']['lscpu'].get('Model name')}, {p['passes']} passes")
    print(f"launch_s {launch * 1e6:.2f} us; peak fp32 {peak_flops('fp32') / 1e9:.2f} GFLOP/s, "
          f"bf16 {peak_flops('bf16') / 1e9:.3f} GFLOP/s; DRAM copy {bw / 1e9:.2f} GB/s")
    for name, spec in FITS.items():
        if not fitted_rows(name):
            print(f"{name}: no rows")
            continue
        f = fit(name)
        side = (f"compute eff_max {f['compute_eff_max']:.3g} x_half_flops {f['compute_x_half_flops']:.3g}; "
                f"memory eff_max {f['memory_eff_max']:.3g}" if spec.compute else
                f"memory eff_max {f['memory_eff_max']:.3g} x_half_bytes {f['memory_x_half_bytes']:.3g}")
        print(f"{name}: {side}; max err {f['max_err']:.1%} over {f['rows']} rows")
        for tag, sel in (("", fitted_rows(name)), (" (not fitted)", unfitted_rows(name))):
            for r in sel:
                pred = model_s(name, r, f)
                print(f"    {r.label[:70]:70s} measured {r.seconds * 1e6:11.1f} us  model {pred * 1e6:11.1f} us "
                      f"{pred / r.seconds - 1:+7.1%}{tag}")
    if p.get("gloo"):
        fit_ = host_tier_fit()
        print(f"cpu-host: bw_per_gpu_Bps {fit_['bw_per_gpu_Bps']:.4g}")
        print("  kind_latency_s: {" + ", ".join(f"{k}: {v:.3g}" for k, v in fit_["kind_latency_s"].items()) + "}")
        print("  efficiency_points: {" + ", ".join(
            f"{k}: [" + ", ".join(f"[{m}, {e}]" for m, e in pts) + "]" for k, pts in fit_["efficiency_points"].items())
            + "}")
        for k, m, t in gloo_rows():
            bus = m / t * (1.0 if k == "all_reduce" else 0.5)  # bus factors at 2 ranks
            print(f"    {k:15s} {m:>10d} B  {t * 1e6:10.1f} us  bus {bus / 1e9:6.3f} GB/s")


if __name__ == "__main__":
    main()
