"""Scripts under executor/bench that run off the device's output: their logic on synthetic input."""

import gzip
import json
import runpy
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "executor/bench"
RUNS = Path(__file__).parents[2] / "hwmodels/data/runs"


def test_trace_kernels_sums_gpu_events_per_step(tmp_path, capsys):
    """Kernel, memcpy and memset events are summed by name and divided by the profiled steps
    (from the RunRecord); CPU ops are not counted."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 300.0},
        {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 100.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "dur": 50.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 9000.0},
    ]
    trace = tmp_path / "t.trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    record = tmp_path / "r.json"
    record.write_text(json.dumps({"profiled_steps": 2}))
    rows = runpy.run_path(str(BENCH / "trace_kernels.py"))["main"]([str(trace), "--record", str(record)])
    assert rows == [("gemm", 0.2, 1.0), ("Memcpy DtoD", 0.025, 0.5)]
    assert "0.23 ms of GPU events per step over 2 profiled steps" in capsys.readouterr().out


def test_ffn_bench_smoke_runs_every_variant_and_checks_the_same_function(tmp_path):
    """``ffn_bench --smoke`` (CPU, eager backend) builds every variant at a tiny shape and compares
    it with the exact GELU: the compile-only variants give the same outputs and gradients, tanh
    stays close, identity does not; a variant name it does not know is a one-line error (2)."""
    main = runpy.run_path(str(BENCH / "ffn_bench.py"))["main"]
    assert main(["--smoke", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "ffn_bench.json").read_text())["variants"]
    assert set(rows) == {"exact", "identity", "tanh", "static", "coordinate_descent", "max_autotune",
                         "max_autotune_static", "bias_gelu"}
    assert all(rows[v]["same_as_exact"]
               for v in ("static", "coordinate_descent", "max_autotune", "max_autotune_static", "bias_gelu"))
    assert rows["tanh"]["max_rel_diff_vs_exact"] < 0.05 < rows["identity"]["max_rel_diff_vs_exact"]
    assert main(["--smoke", "--variants", "relu", "--out", str(tmp_path)]) == 2


def test_mfu_gap_prices_the_compute_classes_at_the_measured_ceilings(capsys):
    """``mfu_gap`` on a committed H200 RunRecord: each compute class's achieved rate is its twin
    FLOPs over its measured time, below the measured ceiling; moving a class to its ceiling
    shortens the step by exactly the time it saves; bad input is a one-line error (2)."""
    mod = runpy.run_path(str(BENCH / "mfu_gap.py"))
    rec = RUNS / "h200-2026-11-30-executor" / "s15.json"
    g = mod["gap"](str(rec), 0.40)
    rows = {r["op_class"]: r for r in g["rows"]}
    for cls in ("gemm", "attention"):
        r = rows[cls]
        assert r["achieved_tflops"] == pytest.approx(r["tflops"] / r["ms"] * 1e3)
        assert r["achieved_tflops"] < r["ceiling_tflops"] and r["mfu_if_at_ceiling"] > g["mfu"]
    saved = sum(rows[c]["ms"] - rows[c]["ms_at_ceiling"] for c in ("gemm", "attention"))
    assert g["step_ms_with_compute_at_ceilings"] == pytest.approx(g["step_ms"] - saved)
    assert g["step_ms_for_target"] == pytest.approx(g["step_ms"] * g["mfu"] / 0.40)
    assert mod["main"]([str(rec), "--target", "40"]) == 2
    assert mod["main"]([str(rec.with_name("missing.json"))]) == 2
    assert "not found" in capsys.readouterr().out.splitlines()[-1]


def test_mfu_gap_bounds_a_run_by_the_gpu_it_ran_on():
    """gem-h200-1gpu served on an H100: its record's peak is the H100's, and so are the ceilings
    (``hwmodels/data/measured/h100_*.yaml``), not the H200's its scenario names."""
    mod = runpy.run_path(str(BENCH / "mfu_gap.py"))
    g = mod["gap"](str(RUNS / "h100-2026-12-05c-ffn-step" / "gem-gelu.json"), 0.40)
    gemm = next(r for r in g["rows"] if r["op_class"] == "gemm")
    assert "h100_" in gemm["ceiling_source"] and g["peak"].startswith("h100")
    h200 = mod["gap"](str(RUNS / "h200-2026-11-30-executor" / "s15.json"), 0.40)
    assert "h200_" in next(r for r in h200["rows"] if r["op_class"] == "gemm")["ceiling_source"]


def test_mfu_gap_refuses_a_record_without_a_peak(tmp_path, capsys):
    """A CPU run's record has no MFU peak to price against: one line naming the record, exit 2."""
    import json

    mod = runpy.run_path(str(BENCH / "mfu_gap.py"))
    r = json.loads((RUNS / "h200-2026-11-30-executor" / "s15.json").read_text())
    r.update(mfu=None, mfu_peak="", mfu_peak_flops_per_s=None)
    (tmp_path / "cpu.json").write_text(json.dumps(r))
    assert mod["main"]([str(tmp_path / "cpu.json")]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "cpu.json" in out[0] and "no MFU peak" in out[0]


def test_mfu_gap_names_kernels_short():
    """The per-class kernel lines name a kernel without its C++ namespaces and template
    arguments, keep the launching op of ``other``'s kernels, and leave copies whole."""
    short = runpy.run_path(str(BENCH / "mfu_gap.py"))["short_kernel_name"]
    assert short("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
                 "namespace)::TensorListMetadata<4>>(int)") == "multi_tensor_apply_kernel"
    assert short("aten::sort: void at_cuda_detail::cub::detail::radix_sort::DeviceRadixSortOnesweepKernel<a, b>"
                 "(c)") == "aten::sort: DeviceRadixSortOnesweepKernel"
    assert short("Memcpy HtoD (Pinned -> Device)") == "Memcpy HtoD (Pinned -> Device)"
    assert short("_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6kernel13"
                 "GemmUniversalINS5_17GroupProblemShapeIN4cute5tupleIJiiiEEEEENS") == "cutlass:GemmUniversal (grouped)"


def test_fp8_block_parity_tiny_on_cpu():
    """``mxfp8_parity --low fp8_block``: debug-cpu widened to multiples of 128 (so every projection
    and FFN layer is eligible), 4 steps through the CPU emulation: finite, within 2% of bf16, no
    guard fall-back, the sequence FFN fused once its guards are done."""
    run = runpy.run_path(str(BENCH / "mxfp8_parity.py"))["run"]
    res = run("debug-cpu", steps=4, tail=2, log=lambda s: None, low="fp8_block", max_gap=0.02, overrides=[
        "model.d_model=128", "model.sequence.head_dim=64", "model.cross.head_dim=64", "model.nonseq.ffn_hidden=256",
        "model.nonseq.fm_mlp_hidden=128", "model.tasks.mlp=[128]", "model.bottom_mlp=[128]",
        "training.global_batch=16", "training.micro_batch=16", "model.sequence.num_layers=1",
        "model.nonseq.num_layers=1", "model.moe.num_experts=2",
        "model.embeddings.sequences.0.length.max=8", "model.embeddings.sequences.0.length.mean=6"])
    assert res["pass"], (res["rel_gap"], res["fp8_block"]["guard_summary"])
    g = res["fp8_block"]["guard"]
    assert {"seq_layers.0.ffn1", "seq_layers.0.qkv", "top.0"} <= set(g) and not any(v["fallback"] for v in g.values())
    assert res["fp8_block"]["low_precision_layers"] == {name: "fp8_block" for name in g}  # the RunRecord says so
    assert res["bf16"]["low_precision_layers"] == {}
    assert res["bf16"]["loss"] != res["fp8_block"]["loss"]


def test_parity_debug_cpu_few_steps():
    """``mxfp8_parity``: debug-cpu, shrunk to seconds: bf16 vs MXFP8 (GDPA attention) for 3 steps, same seed."""
    run = runpy.run_path(str(BENCH / "mxfp8_parity.py"))["run"]
    res = run("debug-cpu", steps=3, tail=2, log=lambda s: None, overrides=[
        "model.sequence.attention=gdpa", "training.global_batch=16", "training.micro_batch=16",
        "model.sequence.num_layers=1", "model.nonseq.num_layers=1", "model.moe.num_experts=2",
        "model.embeddings.sequences.0.length.max=8", "model.embeddings.sequences.0.length.mean=6"])
    assert res["bf16"]["finite"] and res["mxfp8"]["finite"]
    assert res["rel_gap"] < 0.02, res["rel_gap"]
    assert res["mxfp8"]["guard"], "no MXFP8Linear in the model"
    assert res["bf16"]["loss"] != res["mxfp8"]["loss"]
