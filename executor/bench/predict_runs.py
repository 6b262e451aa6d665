"""The twin's predictions for a multi-GPU campaign, written before any run (issues 28 and 29).

    python -m executor.bench.predict_runs gem-h200-2gpu --out hwmodels/data/predictions/gem-h200-2gpu
    python -m executor.bench.predict_runs gem-h200-8gpu --plan --out hwmodels/data/predictions/gem-h200-8gpu

For the scenario and each variant the campaign trains (``variants``: the bundled layout, the
embeddings' ``replicated_sync`` instead of ``fully_sharded``, and SM-free collectives switched), and with
``--plan`` the planner's best layout for the same GPU count (written as ``plan_best.yaml``, which
the device script trains): step time, samples/s, MFU, the step's breakdown, each parallel axis's
collective time and the part of it left exposed, and memory per rank, from the twin alone and with
the H200 calibration (``--calibration``, fitted on one GPU). Writes ``predictions.json`` (whole,
then renamed) and prints a Markdown table; the campaign's ``gemtwin validate`` later sets these
beside the runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CALIBRATION = ROOT / "hwmodels" / "data" / "calibrations" / "h200-fused-executor.yaml"


def variants(s) -> dict[str, list[str]]:
    """name -> overrides of the campaign's runs; the first is the scenario as bundled. The
    ``replicated_sync`` run keeps the tables in replicas synced by all-reduce: where the bundled
    layout has no replicas (``sparse_replica`` 1), its shard group becomes the replicas."""
    p = s.parallelism
    replicated = ["parallelism.sparse_strategy=replicated_sync"]
    if p.sparse_replica == 1:
        replicated += ["parallelism.sparse_shard=1", f"parallelism.sparse_replica={p.sparse_shard}"]
    return {"bundled": [], "replicated_sync": replicated,
            "sm_free": [f"parallelism.sm_free_collectives={str(not p.sm_free_collectives).lower()}"]}

KEYS = ("step_time_s", "samples_per_s", "mfu", "breakdown_s", "compute_s_by_op_class", "comm_s_by_axis",
        "exposed_comm_s_by_axis", "memory_bytes", "memory_total_bytes", "memory_fits")


def predict(name: str, sets: list[str], calibration: Path | None) -> dict:
    from twin.api import load, simulate, to_dict

    s = load(name, sets)
    out = {"sets": sets}
    for tag, cal in (("twin", None), ("calibrated", calibration)):
        if tag == "calibrated" and cal is None:
            continue
        d = to_dict(simulate(s, calibration=cal))
        out[tag] = {k: d[k] for k in KEYS}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario")
    ap.add_argument("--out", type=Path, required=True, help="folder for predictions.json (and plan_best.yaml)")
    ap.add_argument("--plan", action="store_true", help="also the planner's best layout at the scenario's GPU count")
    ap.add_argument("--calibration", type=Path, default=DEFAULT_CALIBRATION, help="'none' for the twin alone")
    a = ap.parse_args(argv)
    from scenarios import ScenarioError, load

    try:
        base = load(a.scenario)
    except ScenarioError as e:
        print(f"predict_runs: {e}", file=sys.stderr)
        return 2
    cal = None if str(a.calibration) == "none" else a.calibration
    if cal is not None and not cal.exists():
        print(f"predict_runs: --calibration {cal} does not exist; give a file from gemtwin calibrate, or none",
              file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    result = {"scenario": a.scenario, "num_gpus": base.hardware.num_gpus, "date": time.strftime("%Y-%m-%d"),
              "commit": _commit(), "calibration": None if cal is None else str(cal.relative_to(ROOT)),
              "command": "python -m executor.bench.predict_runs " + " ".join(argv or sys.argv[1:]),
              "variants": {}}  # fmt: skip
    for name, sets in variants(base).items():
        result["variants"][name] = predict(a.scenario, sets, cal)
    if a.plan:
        from twin.api import plan, write_best_yaml

        p = plan(base, gpus=base.hardware.num_gpus)
        path = write_best_yaml(p, a.out / "plan_best.yaml", base=base, extends=a.scenario)
        result["variants"]["plan_best"] = predict(str(path), [], cal)
        result["variants"]["plan_best"]["yaml"] = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    tmp = a.out / "predictions.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(a.out / "predictions.json")
    print(table(result))
    return 0


def table(result: dict) -> str:
    """The predictions as Markdown: one row per variant and source."""
    axes = sorted({ax for v in result["variants"].values() for ax in v["twin"]["comm_s_by_axis"]})
    head = ["variant", "source", "step ms", "MFU", "samples/s", "GB/rank"] + [f"{ax} ms (exposed)" for ax in axes]
    lines = [f"{result['scenario']} on {result['num_gpus']} GPUs, twin at {result['commit']} ({result['date']})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, v in result["variants"].items():
        for tag in ("twin", "calibrated"):
            if tag not in v:
                continue
            r = v[tag]
            cells = [name, tag, f"{r['step_time_s'] * 1e3:.1f}", f"{r['mfu']:.1%}", f"{r['samples_per_s']:,.0f}",
                     f"{r['memory_total_bytes'] / 1e9:.1f}"]
            cells += [f"{r['comm_s_by_axis'].get(ax, 0) * 1e3:.2f} ({r['exposed_comm_s_by_axis'].get(ax, 0) * 1e3:.2f})"
                      for ax in axes]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
