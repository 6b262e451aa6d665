"""Loss parity: train one scenario in bf16 and in a low precision (MXFP8, or blockwise fp8 with
``--low fp8_block``), same seed and data, and compare the losses.

    python3 executor/bench/mxfp8_parity.py debug-cpu --steps 60 --out parity_debug-cpu
        [--low mxfp8|fp8_block] [--set model.sequence.attention=gdpa ...] [--tail 10] [--threads 1]

A whole-model experiment on the executor (``executor.train``), so it lives with the executor's
benches (until issue 19 it was ``kernels/mxfp8/parity.py``; kernels/ imports nothing above it).

The bf16 run sets ``precision.mlp = precision.attention = bf16``, the MXFP8 run ``mxfp8`` for both,
the fp8_block run ``precision.mlp = fp8_block`` (attention bf16; every other field as the
scenario says). The low run's results are under its precision's key. Writes ``<out>.json`` (both loss curves, final losses, the
relative gap, eval metrics, the guard's per-layer errors and decisions) and ``<out>.png``.
Pass = no NaN/Inf and ``|final_low - final_bf16| / final_bf16 <= max_gap`` (1%; ``--max-gap``), where "final" is the mean
training loss of the last ``--tail`` steps (default 5; one step's loss is one batch's).
Also recorded per precision: every step's time (host clock on CPU, CUDA events on CUDA), the
run's wall time, the held-out eval metrics (``executor.train.evaluate``), how many sequence
layers ran MXFP8 attention (only GDPA has it; other kinds stay bf16) and, for MXFP8, a guard
summary (layers, max relative error, fallbacks).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def run(ref: str, *, steps: int, overrides=(), tail: int = 5, log=print, low: str = "mxfp8",
        max_gap: float = 0.01) -> dict:
    import time

    import torch

    from executor.train import train
    from kernels.mxfp8.linear import MXFP8Linear
    from scenarios.loader import load

    if low not in ("mxfp8", "fp8_block"):
        raise ValueError(f"--low '{low}': use mxfp8 or fp8_block")
    out: dict = {"scenario": ref, "overrides": list(overrides), "steps": steps, "tail": tail, "low": low}
    for prec in ("bf16", low):
        att = "bf16" if prec == "fp8_block" else prec
        sc = load(ref, [*overrides, f"precision.mlp={prec}", f"precision.attention={att}"])
        MXFP8Linear.decisions.clear()
        models = []
        import executor.train as tr

        build = tr.build_model
        tr.build_model = lambda s: models.append(build(s)) or models[-1]  # keep the model for the guard report
        t0 = time.perf_counter()
        try:
            rec = train(sc, steps=steps, profile_steps=0, warmup_steps=1, log=log)
        finally:
            tr.build_model = build
        wall = time.perf_counter() - t0
        losses = [s.loss for s in rec.steps]
        from executor.model import SequenceLayer
        from kernels.mxfp8.linear import report

        out[prec] = {"loss": losses, "final": sum(losses[-tail:]) / min(tail, len(losses)),
                     "eval": rec.metrics, "step_time_s": rec.step_time_s,
                     "step_times_s": [s.step_time_s for s in rec.steps], "wall_s": wall,
                     "finite": all(math.isfinite(x) for x in losses),
                     "eval_finite": all(math.isfinite(v) for v in rec.metrics.values()),
                     "mxfp8_attention_layers": sum(bool(getattr(m, "mxfp8", False)) for m in models[-1].modules()
                                                   if isinstance(m, SequenceLayer)),
                     "device": rec.environment.device_name, "cpu_threads": rec.environment.cpu_threads,
                     "low_precision_layers": rec.low_precision_layers}
        if prec == low:
            g = report(models[-1])
            out[prec]["guard"] = g
            out[prec]["guard_summary"] = {
                "layers": len(g), "max_rel_err": max((v["max_rel_err"] for v in g.values()), default=0.0),
                "min_rel_err": min((v["max_rel_err"] for v in g.values()), default=0.0),
                "fallbacks": sorted(k for k, v in g.items() if v["fallback"])}
            out[prec]["decisions"] = list(MXFP8Linear.decisions)
        del models
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    b, m = out["bf16"]["final"], out[low]["final"]
    out["rel_gap"] = abs(m - b) / abs(b)
    eb, em = out["bf16"]["eval"]["loss"], out[low]["eval"]["loss"]
    out["eval_rel_gap"] = abs(em - eb) / abs(eb)
    out["max_gap"] = max_gap
    out["pass"] = bool(out["bf16"]["finite"] and out[low]["finite"] and out["rel_gap"] <= max_gap
                       and not out[low]["guard_summary"]["fallbacks"])
    return out


def plot(res: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    low = res.get("low", "mxfp8")
    for prec, style in (("bf16", "-"), (low, "--")):
        ax.plot(res[prec]["loss"], style, label=f"{prec} (final {res[prec]['final']:.4f})")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"{res['scenario']}: {low} vs bf16, gap {100 * res['rel_gap']:.2f}% (last {res['tail']} steps)\n"
                 f"eval loss bf16 {res['bf16']['eval']['loss']:.4f}, {low} {res[low]['eval']['loss']:.4f}",
                 fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--tail", type=int, default=5)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--out", required=True, help="path prefix for .json and .png")
    p.add_argument("--low", default="mxfp8", choices=["mxfp8", "fp8_block"], help="the precision set against bf16")
    p.add_argument("--max-gap", type=float, default=0.01, help="pass: final-loss relative gap at most this")
    a = p.parse_args(argv)
    if a.threads > 0:
        import torch

        torch.set_num_threads(a.threads)
    res = run(a.scenario, steps=a.steps, overrides=a.overrides, tail=a.tail, low=a.low, max_gap=a.max_gap)
    low = a.low
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    try:
        plot(res, out.with_suffix(".png"))
    except ImportError as e:  # matplotlib absent
        print(f"no plot: {e}", file=sys.stderr)
    print(f"parity {a.scenario}: bf16 {res['bf16']['final']:.5f} {low} {res[low]['final']:.5f} "
          f"gap {100 * res['rel_gap']:.3f}% pass={res['pass']}; eval bf16 {res['bf16']['eval']['loss']:.5f} "
          f"{low} {res[low]['eval']['loss']:.5f}; s/step bf16 {res['bf16']['step_time_s']:.3f} "
          f"{low} {res[low]['step_time_s']:.3f}; guard {res[low]['guard_summary']}")
    for line in res[low]["decisions"]:
        print(line)
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
