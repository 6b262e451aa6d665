"""What limits a measured run's MFU: each op class's measured time against the ceiling the lent GPU
reached for that kind of work, and the MFU the step would have if a class ran at its ceiling.

    python3 executor/bench/mfu_gap.py hwmodels/data/runs/h200-2026-11-30-executor/s15.json [--target 0.40]

Inputs, all in the repo:
- the RunRecord (``gemtwin train --out``): step time, MFU, per-op-class kernel time per step;
- the twin's analytic FLOPs per op class of the same Scenario and micro-batch (``twin.flops``,
  the count the executor's MFU uses);
- the GPU's measured ceilings (``hwmodels/data/measured/<gpu>_<date>.yaml``): bf16 ``torch.mm``
  at 8192³ for ``gemm``, bf16 SDPA forward + backward at 1024 tokens (the largest measured shape
  at our lengths) for ``attention``. Both are generous bounds here: the GEMMs have K = 512 and
  the attention is causal, jagged and 512-1024 tokens long.

The memory-bound classes (element-wise, norm, optimizer, embedding, other) are kept at their
measured time: ``executor/bench/ffn_bench.py`` measured their biggest kernels at the copy rate
already (s16), so they shrink only by moving fewer bytes (fusion), not by faster kernels.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

COMPUTE = ("gemm", "attention")


def gap(record_path: str, target: float = 0.40) -> dict:
    from scenarios.schema import Scenario
    from twin.flops import model_costs
    from twin.runrecord import load_run

    r = load_run(record_path)
    if not r.mfu_peak_flops_per_s or not r.op_class_time_s:
        raise ValueError(f"run record '{record_path}' has no MFU peak or no op-class times (device "
                         f"{r.environment.device_name or r.environment.device}); pass a profiled GPU run's record")
    s = Scenario.model_validate(r.scenario)
    m = s.model
    flops: dict[str, float] = {}
    for op in model_costs(m, batch=s.training.micro_batch, precision=s.precision):
        flops[op.op_class] = flops.get(op.op_class, 0.0) + op.flops
    micro = s.training.global_batch // s.training.micro_batch
    flops = {k: v * micro for k, v in flops.items()}
    ceil = _ceilings(r, s.hardware.gpu)
    sdpa = max((x for x in ceil.sdpa if x.fwd_bwd_flops and x.q_len == x.kv_len and x.q_len <= 1024),
               key=lambda x: x.q_len)
    rate = {"gemm": (ceil.matmul_flops["bf16"], f"bf16 torch.mm 8192³ ({ceil.file})"),
            "attention": (sdpa.fwd_bwd_flops, f"bf16 SDPA fwd+bwd B{sdpa.batch} H{sdpa.heads} S{sdpa.q_len} "
                                              f"D{sdpa.head_dim} ({ceil.file})")}
    step = r.step_time_s
    total_flops = r.model_flops_per_step
    busy = sum(r.op_class_time_s.values())
    rows = []
    for cls, t in r.op_class_time_s.items():
        if t <= 0:
            continue
        row = dict(op_class=cls, ms=t * 1e3, share=t / busy)
        if cls in COMPUTE and flops.get(cls):
            peak, src = rate[cls]
            at_ceiling = flops[cls] / peak
            row.update(tflops=flops[cls] / 1e12, achieved_tflops=flops[cls] / t / 1e12, ceiling_tflops=peak / 1e12,
                       ceiling_source=src, ms_at_ceiling=at_ceiling * 1e3,
                       mfu_if_at_ceiling=total_flops / (step - t + min(t, at_ceiling)) / r.mfu_peak_flops_per_s)
        rows.append(row)
    saved = sum(r_["ms"] - r_["ms_at_ceiling"] for r_ in rows if "ms_at_ceiling" in r_ and r_["ms"] > r_["ms_at_ceiling"])
    bound_step = step - saved / 1e3
    need = total_flops / (target * r.mfu_peak_flops_per_s)
    return dict(record=record_path, step_ms=step * 1e3, mfu=r.mfu, peak=r.mfu_peak, busy_ms=busy * 1e3,
                model_tflop=total_flops / 1e12, rows=rows, step_ms_with_compute_at_ceilings=bound_step * 1e3,
                mfu_with_compute_at_ceilings=total_flops / bound_step / r.mfu_peak_flops_per_s,
                target=target, step_ms_for_target=need * 1e3,
                memory_bound_ms=sum(r_["ms"] for r_ in rows if r_["op_class"] not in COMPUTE),
                still_to_cut_ms=max(0.0, (bound_step - need) * 1e3), kernels=r.op_class_kernels_s)


def _ceilings(r, scenario_gpu: str):
    """The measured ceilings that bound the run: those of the GPU it ran on (its MFU peak names it,
    e.g. "h100 bf16 dense" for gem-h200-1gpu served on an H100) where measured, else the scenario's."""
    from hwmodels.measured import measured_ceilings

    ran_on = (r.mfu_peak or "").split(" ", 1)[0]
    if ran_on and ran_on != scenario_gpu:
        try:
            return measured_ceilings(ran_on)
        except ValueError:
            pass
    return measured_ceilings(scenario_gpu)


def short_kernel_name(name: str, width: int = 48) -> str:
    """A kernel's name for a table: C++ namespaces and template arguments dropped
    (``void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>(...)`` ->
    ``multi_tensor_apply_kernel``), mangled CUTLASS names as ``cutlass:<kernel kind>``."""
    op, sep, kernel = name.rpartition(": ")
    k = kernel.removeprefix("void ")
    if k.startswith("_ZN7cutlass"):
        m = re.search(r"6kernel(\d+)", k)  # the Itanium ABI's length-prefixed kernel class name
        k = "cutlass:" + (k[m.end():m.end() + int(m.group(1))] if m else "kernel")
        k += " (grouped)" if "GroupProblemShape" in name else ""
    elif not k.startswith(("Memcpy", "Memset")):
        k = re.split(r"[<(]", re.sub(r"\([^()]*namespace\)::", "", k), maxsplit=1)[0].rsplit("::", 1)[-1]
    return (f"{op}{sep}{k}" if sep else k)[:width]


def render(g: dict) -> str:
    out = [f"{g['record']}: step {g['step_ms']:.1f} ms, MFU {g['mfu']:.1%} of {g['peak']} "
           f"({g['model_tflop']:.2f} TFLOP per step, twin count); kernels busy {g['busy_ms']:.1f} ms",
           f"{'op class':>12} {'ms':>7} {'share':>6} {'TFLOP':>7} {'TFLOP/s':>8} {'ceiling':>8} "
           f"{'ms at ceil':>10} {'MFU if':>7}"]
    for r in g["rows"]:
        if "ceiling_tflops" in r:
            out.append(f"{r['op_class']:>12} {r['ms']:7.2f} {r['share']:6.1%} {r['tflops']:7.2f} "
                       f"{r['achieved_tflops']:8.0f} {r['ceiling_tflops']:8.0f} {r['ms_at_ceiling']:10.2f} "
                       f"{r['mfu_if_at_ceiling']:7.1%}")
        else:
            out.append(f"{r['op_class']:>12} {r['ms']:7.2f} {r['share']:6.1%}   (memory-bound: measured time kept)")
    out += ["ceilings: " + "; ".join(f"{r['op_class']}: {r['ceiling_source']}" for r in g["rows"] if "ceiling_source" in r),
            f"both compute classes at their ceilings: step {g['step_ms_with_compute_at_ceilings']:.1f} ms, "
            f"MFU {g['mfu_with_compute_at_ceilings']:.1%}",
            f"MFU {g['target']:.0%} needs a {g['step_ms_for_target']:.1f} ms step: "
            + (f"{g['still_to_cut_ms']:.1f} ms would still have to leave the {g['memory_bound_ms']:.1f} ms of "
               "memory-bound kernels (fewer bytes: fusion)" if g["still_to_cut_ms"] > 0 else
               "reachable with the compute classes at their ceilings")]
    if g["kernels"]:  # records from the eighth session on: what each class is made of
        out.append("longest kernels per class (ms per step):")
        for cls, ks in g["kernels"].items():
            out.append(f"{cls:>12}: " + ", ".join(f"{short_kernel_name(n)} {t * 1e3:.2f}" for n, t in list(ks.items())[:4]))
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("record", help="a RunRecord JSON (gemtwin train --out)")
    p.add_argument("--target", type=float, default=0.40, help="MFU to reach (default 0.40)")
    a = p.parse_args(argv)
    if not 0 < a.target < 1:
        print(f"mfu_gap: --target {a.target}: give a fraction between 0 and 1, e.g. 0.4")
        return 2
    try:
        print(render(gap(a.record, a.target)))
    except ValueError as e:
        print(f"mfu_gap: {e}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
