"""The twin end to end: scenario → op graph → engine → SimResult."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scenarios
from twin.simulate import SimResult, model_flops_per_step, simulate
from twin.workload import Hardware, build_graph


@pytest.mark.parametrize("name", scenarios.bundled())
def test_bundled_scenarios_simulate(name):
    s = scenarios.load(name)
    r = simulate(s)
    assert r.step_time_s > 0 and 0 < r.mfu <= 1
    assert r.samples_per_s == pytest.approx(s.training.global_batch / r.step_time_s)
    assert r.mfu == pytest.approx(
        r.model_flops_per_step / (r.step_time_s * s.hardware.num_gpus * r.mfu_peak_flops)
    )
    busy = r.breakdown_s["compute"] + r.breakdown_s["sm_contention"] + r.breakdown_s["exposed_comm"]
    assert busy + r.breakdown_s["idle"] == pytest.approx(r.step_time_s, rel=1e-6)


def test_single_gpu_has_no_collectives():
    g = build_graph(scenarios.load("gem-h200-1gpu"), Hardware.of(scenarios.load("gem-h200-1gpu")))
    assert set(g.streams()) == {"compute"}


def test_selective_recomputes_softmax_attention_but_not_gdpa():
    """Selective checkpointing redoes in backward the attention whose backward needs its output
    (softmax: the cross layers), not GDPA (its backward reads q, k, v and dO only), as the
    executor does; so it keeps GDPA's output and drops the cross attention's."""
    from twin.memory import memory_per_rank

    s = scenarios.load("gem-h200-1gpu", ["parallelism.activation_checkpointing=selective"])
    redone = [op.name for op in build_graph(s, Hardware.of(s)) if op.name.endswith(".recompute")]
    assert redone and all(n.startswith("cross") and n.endswith(".attn.recompute") for n in redone)
    none = scenarios.load("gem-h200-1gpu", ["parallelism.activation_checkpointing=none"])
    by_layer = {p: memory_per_rank(x).by_layer_activation_bytes for p, x in (("sel", s), ("none", none))}
    assert by_layer["sel"]["seq0"] == by_layer["none"]["seq0"]  # GDPA layers keep everything
    assert by_layer["sel"]["cross0"] < by_layer["none"]["cross0"]


def test_grad_clip_costs_a_pass_over_the_gradients():
    """A grad-norm clip reads every dense gradient for the norm and rewrites it scaled: the
    optimizer moves 40 bytes a parameter instead of Adam's 28, and takes longer."""
    def opt(clip):
        s = scenarios.load("gem-h200-1gpu", [f"training.grad_clip={clip}"])
        (op,) = [op for op in build_graph(s, Hardware.of(s)) if op.op_class == "optimizer"]
        return op

    off, on = opt(0), opt(1.0)
    assert on.bytes == pytest.approx(off.bytes * 40 / 28) and on.duration_s > off.duration_s


def test_every_axis_produces_its_collectives():
    s = scenarios.load("gem-h100-4k")
    g = build_graph(s, Hardware.of(s))
    axes = {op.axis for op in g if op.axis}
    assert axes == {"dense_shard", "dense_replicate", "expert", "expert_replicate",
                    "sparse_shard", "sparse_replica"}
    kinds = {(op.axis, op.op_class) for op in g if op.axis}
    assert ("dense_shard", "all_gather") in kinds and ("dense_shard", "reduce_scatter") in kinds
    assert ("expert", "all_to_all") in kinds and ("sparse_replica", "reduce_scatter") in kinds


def test_sm_free_collectives_remove_contention():
    base = simulate(scenarios.load("gem-h200-2gpu"))
    free = simulate(scenarios.load("gem-h200-2gpu", ["parallelism.sm_free_collectives=true"]))
    assert base.breakdown_s["sm_contention"] > 0
    assert free.breakdown_s["sm_contention"] == pytest.approx(0, abs=1e-12)
    assert free.step_time_s < base.step_time_s


def test_checkpointing_costs_time_not_model_flops():
    none = scenarios.load("gem-h200-1gpu", ["parallelism.activation_checkpointing=none"])
    full = scenarios.load("gem-h200-1gpu", ["parallelism.activation_checkpointing=full"])
    a, b = simulate(none), simulate(full)
    assert b.step_time_s > a.step_time_s
    assert a.model_flops_per_step == b.model_flops_per_step


def test_more_gpus_same_per_gpu_work_same_flops_per_gpu():
    s = scenarios.load("gem-h100-4k")
    assert model_flops_per_step(s) / 4096 == pytest.approx(
        model_flops_per_step(scenarios.load("gem-h200-1gpu", ["training.micro_batch=128",
            "training.global_batch=128"]).model_copy(update={"model": s.model}))  # fmt: skip
    )


def test_trace_and_result_files(tmp_path):
    s = scenarios.load("gem-h200-2gpu")
    r = simulate(s, trace=tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == r.num_ops
    r.save(tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["step_time_s"] == r.step_time_s


@pytest.mark.parametrize("name", scenarios.bundled())
def test_scenario_survives_its_json_dump(name):
    """What a SimResult records as resolved_scenario loads back as the same Scenario."""
    s = scenarios.load(name)
    again = scenarios.Scenario.model_validate(json.loads(json.dumps(s.model_dump(mode="json"))))
    assert again.model_dump() == s.model_dump()


@pytest.mark.parametrize("per_rank, imbalance", [(False, True), (True, True), (False, False)])
def test_result_round_trips_and_resimulates_exactly(tmp_path, per_rank, imbalance):
    s = scenarios.load("gem-h200-2gpu", ["training.micro_batch=128"])
    r = simulate(s, per_rank=per_rank, imbalance=imbalance)
    back = SimResult.model_validate_json(r.save(tmp_path / "r.json").read_text())
    assert back.model_dump(mode="json") == r.model_dump(mode="json")
    assert back.resolved_scenario.model_dump() == s.model_dump()
    assert (back.per_rank, back.imbalance, back.calibration_content) == (per_rank, imbalance, None)
    again, timeline = back.resimulate()
    assert again.model_dump(mode="json") == r.model_dump(mode="json")
    assert timeline.step_time_s == r.step_time_s


def test_unknown_gpu_names_the_field():
    s = scenarios.load("debug-cpu", ["hardware.gpu=h300"])
    with pytest.raises(ValueError, match=r"^hardware.gpu: unknown GPU 'h300'"):
        simulate(s)


# ---- property: random valid scenarios never crash and give 0 < MFU <= 1 --------------------
@st.composite
def random_scenario(draw):
    shard = draw(st.sampled_from([1, 2, 4, 8]))
    replicate = draw(st.sampled_from([1, 2, 16, 64]))
    n = shard * replicate
    sparse_shard = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16, 64) if n % d == 0]))
    experts = draw(st.sampled_from([0, 4, 8]))
    ep = draw(st.sampled_from([1] + [e for e in (2, 4, 8) if experts and experts % e == 0
                                     and n % e == 0]))  # fmt: skip
    seq_layers = draw(st.integers(0, 3))
    mb = draw(st.sampled_from([1, 8, 64]))
    mxfp8 = draw(st.booleans())
    length_max = draw(st.integers(1, 512))
    d = draw(st.sampled_from([32, 128, 256]))
    sets = [
        f"hardware.gpu={draw(st.sampled_from(['h100', 'h200', 'b200', 'gb200', 'mi300x']))}",
        f"hardware.num_gpus={n}",
        f"hardware.network={draw(st.sampled_from(['h100-ib', 'b200-ib', 'gb200-nvl72']))}",
        f"parallelism.dense_shard={shard}", f"parallelism.dense_replicate={replicate}",
        f"parallelism.sparse_shard={sparse_shard}",
        f"parallelism.sparse_replica={n // sparse_shard}", f"parallelism.expert={ep}",
        f"parallelism.sparse_strategy={draw(st.sampled_from(['fully_sharded', 'replicated_sync']))}",
        f"parallelism.activation_checkpointing={draw(st.sampled_from(['none', 'selective', 'full']))}",
        f"parallelism.sm_free_collectives={draw(st.booleans())}",
        f"model.moe.num_experts={experts}", "model.moe.top_k=2",
        f"model.d_model={d}", f"model.bottom_mlp=[{d}]",
        f"model.sequence.num_layers={seq_layers}",
        f"model.sequence.attention={draw(st.sampled_from(['jfa', 'gdpa', 'block']))}",
        f"model.sequence.causal={draw(st.booleans())}",
        f"model.cross.num_layers={draw(st.integers(0, 1))}",
        f"model.embeddings.sequences.0.length={{shape: fixed, max: {length_max}}}",
        f"training.micro_batch={mb}", f"training.global_batch={mb * n * draw(st.integers(1, 2))}",
        f"precision.attention={'mxfp8' if mxfp8 else 'bf16'}",
        f"precision.mlp={'mxfp8' if mxfp8 else 'bf16'}",
        f"hardware.mfu_peak_dtype={'mxfp8' if mxfp8 else 'bf16'}",
    ]
    return scenarios.load("debug-cpu", sets)


@given(random_scenario())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_valid_scenarios_never_crash(s):
    r = simulate(s)
    assert r.step_time_s > 0
    assert 0 < r.mfu <= 1
