"""The twin prices the scenario's ``execution`` section (twin.execution_cost) and says what it does not.

What a user relies on: at the defaults nothing moves; a slower choice on an H200 costs more, in the
op classes it runs in and in the direction the committed runs measured; an old RunRecord (written
before it stored its execution) is simulated with the execution it ran; a choice the twin cannot
price is listed, never silently ignored.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import scenarios
from hwmodels.calibration import load_calibration
from twin.calibrate import as_measured, compare, fit, recorded_execution
from twin.cli import app
from twin.execution_cost import BASELINE, family_data, plan
from twin.flops import model_costs
from twin.runrecord import load_run
from twin.simulate import simulate
from twin.workload import Hardware, build_graph

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "hwmodels" / "data"
RUNS = DATA / "runs" / "h200-2026-11-30-executor"
FUSED = DATA / "calibrations" / "h200-fused-executor.yaml"

# simulate of every bundled scenario on main before the twin priced the execution (28fd1d9):
# (step_time_s, mfu), re-pinned when table-wise tables took the executor's placement
# (scenarios.placement.table_owners) instead of a packing over the row-wise shards' random hot ids, and
# when the Triton lookups were priced as table-batched calls (hwmodels.kernels.TbeCurve, issue 23), the
# all-to-alls by group shape and per peer (hwmodels.groups), and the lookups' outputs sent in precision.comm.
# Every bundled scenario runs the curves' default path, or a choice the twin
# does not price on its family, so none of them moves.
# Re-pinned when the all-to-all started paying per peer (issue 23 item 4, hwmodels/GROUPS.md):
# the ~1,000-rank sparse_shard all-to-alls of the large scenarios pay ~1,000 network step latencies.
# Re-pinned when the Hopper attention and norm curves were refitted to the kernels the executor runs
# (issue 25 item 5: hwmodels.bench.fit_attention with the step bench's rows, hwmodels.bench.fit_norm).
BEFORE = {
    "debug-cpu": (0.09524893795251749, 0.040836273248666295),
    "debug-cpu-5d": (0.18532449594351807, 0.010494057024333455),
    "dlrm-dcnv2": (0.005766366465951462, 0.1381429240229709),
    "gem-b200-8k": (0.4597905085497187, 0.3257017389492291),
    "gem-gb200-nvl72": (0.41703714924325064, 0.3231825069130233),
    "gem-h100-4k": (0.5971624593103563, 0.17631489454082894),
    "gem-h200-1gpu": (0.0539761444732099, 0.3843555378416616),
    "gem-h200-2gpu": (0.056904574094672394, 0.364575789726579),
    # added with issue 29 (pinned as first simulated)
    "gem-h200-4gpu": (0.05706388431503036, 0.36355797171268645),
    "gem-h200-8gpu": (0.057731819230162615, 0.35935174599141734),
}


def h200(*sets: str):
    return simulate(scenarios.load("gem-h200-1gpu", list(sets)))


# ---- (a) the defaults price as before ---------------------------------------------------------
def test_every_bundled_scenario_is_listed():
    assert sorted(BEFORE) == scenarios.bundled()


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_defaults_simulate_as_before(name):
    r = simulate(scenarios.load(name))
    assert (r.step_time_s, r.mfu) == pytest.approx(BEFORE[name], rel=1e-12)
    assert r.execution_priced == [] and r.host_s == 0.0


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_defaults_rewrite_no_op(name):
    s = scenarios.load(name)
    costs = model_costs(s.model, batch=s.training.micro_batch, precision=s.precision)
    p = plan(s, costs, gpu=Hardware.of(s).gpu.name)
    assert p.costs == costs and not p.pricing and not p.optimizer and not p.host_per_op_s


# ---- (b) each priced choice costs more, where it runs ---------------------------------------------
def _delta(a, b) -> dict[str, float]:
    return {k: b.compute_s_by_op_class.get(k, 0.0) - a.compute_s_by_op_class.get(k, 0.0)
            for k in set(a.compute_s_by_op_class) | set(b.compute_s_by_op_class)}  # fmt: skip


def test_reference_attention_costs_more_and_only_in_attention():
    # both without CUDA graphs (the reference cannot be captured), so only the kernel differs
    base, ref = h200("execution.cuda_graphs=false"), h200("execution.attention_kernel=reference")
    d = _delta(base, ref)
    assert d.pop("attention") > 0.1  # seconds: the padded reference at gem-h200-1gpu's shapes
    assert all(abs(v) < 1e-12 for v in d.values()), d
    assert ref.step_time_s > 2 * base.step_time_s
    by_kernel = {k: ref.compute_s_by_kernel[k] - base.compute_s_by_kernel[k] for k in ref.compute_s_by_kernel}
    assert by_kernel["attention.gdpa"] > 0 and by_kernel["attention.asym"] > 0
    assert any(c.startswith("execution.attention_kernel=reference") for c in ref.execution_priced)


def test_reference_attention_reproduces_its_bench():
    """Per layer, forward + backward, the twin's padded reference against the H200 bench it was
    fitted on (hwmodels/data/measured/reference_attention_h200_2026-12-02.json)."""
    cases = {c["case"]: c for c in json.loads((DATA / "measured" / "reference_attention_h200_2026-12-02.json")
                                                 .read_text())["cases"]}  # fmt: skip
    for B, ckpt, bench in ((256, "none", "fwd_bwd"), (128, "none", "fwd_bwd"), (256, "selective", "selective")):
        s = scenarios.load("gem-h200-1gpu", ["execution.attention_kernel=reference", f"training.micro_batch={B}",
                                             f"training.global_batch={B}", f"parallelism.activation_checkpointing={ckpt}"])
        ops = [op for op in build_graph(s, Hardware.of(s)) if op.op_class == "attention"]
        seq = sum(op.duration_s for op in ops if op.layer.startswith("seq")) / s.model.sequence.num_layers
        cross = sum(op.duration_s for op in ops if op.layer.startswith("cross")) / s.model.cross.num_layers
        c = cases[f"gdpa B{B}"]
        measured = c["fwd_s"] + c["bwd_s"] if bench == "fwd_bwd" else c["selective_fwd_bwd_s"]
        assert seq == pytest.approx(measured, rel=0.05), (B, ckpt)
        if bench == "fwd_bwd" and B == 256:  # a cross layer: both directions
            q, kv = cases["cross q B256"], cases["cross kv B256"]
            assert cross == pytest.approx(q["fwd_s"] + q["bwd_s"] + kv["fwd_s"] + kv["bwd_s"], rel=0.05)


@pytest.mark.parametrize("choice, classes", [
    ("execution.compile=false", {"norm", "elementwise"}),  # fp32 norms and their casts
    ("execution.ffn_kernel=torch", {"elementwise"}),  # the sequence FFN's GELU
    ("execution.flash.fused_short=false", {"attention"}),  # the cross attention's backward
])  # fmt: skip
def test_a_slower_kernel_choice_costs_more_in_its_classes(choice, classes):
    base, other = h200(), h200(choice)
    d = _delta(base, other)
    assert other.step_time_s > base.step_time_s
    assert {k for k, v in d.items() if abs(v) > 1e-12} == classes and all(d[k] > 0 for k in classes)
    assert [c.split(":")[0] for c in other.execution_priced] == [choice]


def test_eager_norms_run_at_torchs_eager_layer_norm_rate():
    """``compile: false``: each norm is torch's eager LayerNorm in fp32 under autocast (twice the
    compiled norm's bytes), priced at ``execution.yaml eager_norm``'s fraction of the HBM rate, not
    at the compiled (Inductor) norm curve's."""
    from hwmodels.kernels import memory_curve, kernel_time_s
    from twin.execution_cost import family_data

    eff = float(family_data("h200")["eager_norm"]["memory_eff_max"])
    s_c, s_e = scenarios.load("gem-h200-1gpu"), scenarios.load("gem-h200-1gpu", ["execution.compile=false"])
    compiled = {op.name: op for op in build_graph(s_c, Hardware.of(s_c)) if op.op_class == "norm"}
    eager = {op.name: op for op in build_graph(s_e, Hardware.of(s_e)) if op.op_class == "norm"}
    gpu, (eff_c, _) = Hardware.of(s_c).gpu, memory_curve(Hardware.of(s_c).gpu, "norm")
    assert eff < eff_c and compiled.keys() == eager.keys()
    for name, op in eager.items():
        assert op.bytes == pytest.approx(2 * compiled[name].bytes)
        t = kernel_time_s(kind="norm", flops=0.0, bytes=op.bytes, gpu=gpu, dtype="fp32")
        assert op.duration_s == pytest.approx(t * eff_c / eff, rel=1e-9), name


def test_torch_embeddings_cost_more_per_table_and_need_the_host():
    base, torch = h200("execution.cuda_graphs=false", "execution.fused_sparse_update=false"), \
        h200("execution.embedding_kernel=torch")  # fmt: skip
    d = _delta(base, torch)
    assert d.pop("embedding") > 0 and d.pop("optimizer") > 0  # per-table calls; torch's Adagrad step
    assert all(abs(v) < 1e-12 for v in d.values()), d
    assert torch.step_time_s > base.step_time_s > h200().step_time_s


def test_without_cuda_graphs_the_host_bounds_the_step():
    graphs, eager = h200(), h200("execution.cuda_graphs=false")
    assert eager.host_s > graphs.step_time_s and eager.step_time_s == pytest.approx(eager.host_s)
    assert eager.compute_s_by_op_class == graphs.compute_s_by_op_class  # the device's work is the same
    assert eager.breakdown_s["idle"] == pytest.approx(eager.host_s - graphs.step_time_s + graphs.breakdown_s["idle"])


def test_trace_draws_the_hosts_floor(tmp_path):
    r = simulate(scenarios.load("gem-h200-1gpu", ["execution.cuda_graphs=false"]), trace=tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    (host,) = [e for e in events if e["ph"] == "X" and e["cat"] == "host"]
    assert host["dur"] / 1e6 == pytest.approx(r.step_time_s)
    assert max(e["ts"] + e["dur"] for e in events if e["ph"] == "X") / 1e6 == pytest.approx(r.step_time_s)


# the same call, same code: each pair changes one choice (hwmodels/data/runs/h200-2026-11-30-executor/README.md)
PAIRS = [
    ("s5-graphs", "s5-eager", []),  # CUDA graphs off
    ("s2-compiled-fused-update", "s2-compiled-optimizer-step", []),  # the sparse update in the optimizer step
    ("s23", "s23-torch", ["execution.ffn_kernel=torch"]),  # torch's GELU (chosen through the environment)
    ("s21", "s21-two", ["execution.flash.fused_short=false"]),  # the two-kernel short backward (idem)
    ("s1-compiled", "s1-reference", []),  # the reference attention (and eager)
]


@pytest.mark.parametrize("before, after, sets", PAIRS)
def test_each_choice_moves_the_prediction_the_way_the_runs_measured(before, after, sets):
    a, b = load_run(RUNS / f"{before}.json"), load_run(RUNS / f"{after}.json")
    ta, tb = compare(a, None).result.step_time_s, compare(b, None, sets).result.step_time_s
    assert b.step_time_s > a.step_time_s and tb > ta


# ---- (c) old records: the execution they ran --------------------------------------------------
def test_an_old_record_is_simulated_with_the_execution_it_ran():
    r = load_run(RUNS / "s5-eager.json")  # written before RunRecord.execution: its flat fields
    assert r.execution == {}
    e, kept_all = recorded_execution(r)
    assert (e["cuda_graphs"], e["compile"], e["attention_kernel"], e["fused_sparse_update"]) == (False, True, "triton", True)
    assert e["ffn_kernel"] == "torch" and not kept_all  # before the bias + GELU op; after checkpointing
    s = as_measured(r)
    assert s.execution.cuda_graphs is False and s.execution.ffn_kernel == "torch"
    roundtrip = as_measured(load_run(DATA / "runs" / "h200-2026-11-30-roundtrip" / "h200-gem-1gpu.json"))
    assert (roundtrip.execution.attention_kernel, roundtrip.execution.embedding_kernel) == ("reference", "torch")
    assert roundtrip.parallelism.activation_checkpointing == "none"  # that executor kept every activation


def test_a_record_with_an_execution_section_says_it_all():
    r = load_run(DATA / "runs" / "h200-2026-12-01-executor" / "s27.json")
    e = {**recorded_execution(r)[0], "attention_kernel": "reference", "cuda_graphs": False, "token_bucket": 0}
    s = as_measured(r.model_copy(update={"execution": e}))
    assert s.execution.attention_kernel == "reference" and s.execution.cuda_graphs is False


@pytest.mark.parametrize("name", ["s2-compiled-optimizer-step", "s3-eager", "s4-default-30steps", "s1-compiled"])
def test_old_runs_without_graphs_validate_within_twenty_percent(name):
    """Held out from the host's fit (s5-eager): priced as graph replays they were -50 to -57%."""
    assert abs(compare(load_run(RUNS / f"{name}.json"), None).error) < 0.2


def test_old_records_still_calibrate_and_refit_the_committed_calibrations():
    for path in sorted((DATA / "calibrations").glob("h200-*.yaml")):
        cal = load_calibration(path)
        again = fit([load_run(ROOT / x.source_path) for x in cal.runs], sources=["x"])
        assert again.scale == pytest.approx(cal.scale) and again.overhead_s == pytest.approx(cal.overhead_s), path.name


# ---- (d) what is not priced is said ---------------------------------------------------------------
def test_unpriced_choices_are_listed_with_why():
    r = h200("execution.data_processes=true", "execution.max_autotune=[sequence]", "execution.attention_in_graph=false")
    assert r.step_time_s == h200().step_time_s
    fields = [c.split("=")[0] for c in r.execution_not_priced]
    assert fields == ["execution.attention_in_graph", "execution.max_autotune", "execution.data_processes"]
    assert all(": " in c for c in r.execution_not_priced)


def test_choices_that_change_nothing_are_not_listed():
    r = h200("execution.attention_kernel=reference", "execution.flash.fused_short=false", "execution.max_autotune=[]")
    assert not any("flash" in c for c in r.execution_priced + r.execution_not_priced)  # the reference runs


def test_no_hopper_numbers_on_another_generation():
    r = simulate(scenarios.load("gem-b200-8k", ["execution.attention_kernel=reference"]))
    assert r.step_time_s == simulate(scenarios.load("gem-b200-8k")).step_time_s
    assert any(c.startswith("execution.attention_kernel=reference: no measurement on the blackwell family")
               for c in r.execution_not_priced)  # fmt: skip
    assert family_data("b200") == {} and family_data("h100") == family_data("h200") != {}


def test_the_cpu_profile_prices_only_its_own_path():
    r = simulate(scenarios.load("debug-cpu", ["execution.compile=true"]))
    assert r.step_time_s == simulate(scenarios.load("debug-cpu")).step_time_s
    assert [c.split(":")[0] for c in r.execution_not_priced] == ["execution.compile=true"]
    assert BASELINE["cpu"].attention_kernel == "reference"


def test_simulate_says_what_it_priced_and_what_not():
    runner = CliRunner()
    out = runner.invoke(app, ["simulate", "--set", "execution.cuda_graphs=false", "--set", "execution.data_processes=true"])
    assert out.exit_code == 0, out.output
    assert "host time" in out.output and "bounds the step" in out.output
    assert "execution priced" in out.output and "NOT priced" in out.output and "execution.data_processes" in out.output
    brief = runner.invoke(app, ["simulate", "--brief", "--set", "execution.data_processes=true"])
    assert brief.exit_code == 0 and "warning: not priced" in brief.output and "execution.data_processes=true" in brief.output
    quiet = runner.invoke(app, ["simulate", "--brief"])
    assert "not priced" not in quiet.output


# ---- (e) the held-out validations -----------------------------------------------------------------
def test_held_out_h200_runs_with_the_fused_calibration():
    cal = load_calibration(FUSED)
    assert abs(compare(load_run(DATA / "runs" / "h200-2026-12-01-executor" / "s27.json"), cal).error) < 0.01
    torch_gelu = load_run(RUNS / "s23-torch.json")
    unpriced, priced = compare(torch_gelu, cal), compare(torch_gelu, cal, ["execution.ffn_kernel=torch"])
    assert abs(priced.error) < 0.02 and abs(priced.error) < abs(unpriced.error)  # -1.0% against -3.7%


def test_validate_takes_what_the_record_cannot_tell():
    out = CliRunner().invoke(app, ["validate", str(RUNS / "s23-torch.json"), "--calibration", str(FUSED),
                                   "--set", "execution.ffn_kernel=torch"])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert re.search(r"step time\s+│\s+58\.958\s+│\s+58\.362\s+│\s+-1\.0%", out.output), out.output  # -3.7% unpriced


# ---- the data --------------------------------------------------------------------------------------
def test_every_execution_number_cites_a_source_that_exists():
    data = yaml.safe_load((DATA / "execution.yaml").read_text())
    refs = data["references"]
    for fam, entries in data["families"].items():
        for key, entry in entries.items():
            if isinstance(entry, dict):
                assert entry.get("source") in refs, (fam, key)
    for key, text in refs.items():
        for path in re.findall(r"((?:hwmodels|kernels|executor)/[\w./-]+\.\w+)", text):
            assert (ROOT / path).exists(), (key, path)


def test_the_batch_is_uploaded_before_each_micro_batch_on_a_gpu_not_on_the_cpu():
    """dlrm-dcnv2 at 6,912 samples on one H200: 13.6 MB of ids, offsets, dense features and labels
    at the measured 55.2 GB/s host link, 0.27 ms (its trace: 0.26 ms of HtoD copies a step)."""
    from twin.workload import UPLOAD_FIXED_S, build_graph

    one = ["hardware.gpu=h200", "hardware.num_gpus=1", "hardware.network=h200x2-nv18", "parallelism.dense_replicate=1",
           "parallelism.sparse_shard=1", "training.global_batch=13824", "training.micro_batch=6912"]  # two micro-batches
    s = scenarios.load("dlrm-dcnv2", one)
    ops = [op for op in build_graph(s, Hardware.of(s)) if op.kernel == "data.h2d"]
    assert [op.name for op in ops] == ["mb0.data.h2d", "mb1.data.h2d"] and all(op.stream == "compute" for op in ops)
    assert ops[0].bytes == pytest.approx(13.6e6, rel=0.02)
    assert ops[0].duration_s == pytest.approx(UPLOAD_FIXED_S + ops[0].bytes / 55.2e9) and 0.2e-3 < ops[0].duration_s < 0.3e-3
    cpu = scenarios.load("debug-cpu")
    assert not [op for op in build_graph(cpu, Hardware.of(cpu)) if op.kernel == "data.h2d"]
