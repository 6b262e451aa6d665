"""Goodput (twin.goodput): Young/Daly and the goodput formula by hand, scaling with GPUs, async
against sync, one-line errors for unknown catalog names, the planner ranking by it."""

from __future__ import annotations

import math

import pytest

import scenarios
from hwmodels.storage import get_failures, get_storage, host_copy_Bps, list_failures, list_storage
from scenarios import ScenarioError
from twin.goodput import checkpoint_bytes, goodput, goodput_fraction, young_daly_interval_s
from twin.memory import memory_per_rank
from twin.planner import effective_samples_per_s, plan
from twin.simulate import SimResult, simulate


def _h100(gpus: int, *sets: str):
    nodes = gpus // 8
    return scenarios.load("gem-h100-4k", [
        f"hardware.num_gpus={gpus}", f"parallelism.dense_replicate={nodes}",
        f"parallelism.sparse_replica={gpus // 1024}", f"training.global_batch={128 * gpus}", *sets])  # fmt: skip


def _goodput(s, step_time_s=0.5):
    return goodput(s, step_time_s=step_time_s, memory=memory_per_rank(s))


def test_young_daly_and_goodput_by_hand():
    assert young_daly_interval_s(10.0, 20_000.0) == pytest.approx(math.sqrt(2 * 10 * 20_000))  # 632.46 s
    # 600 s of work, 10 s stall, 300 s restart, MTBF 20,000 s: 600/610 x (1 - (300 + 305)/20,000)
    assert goodput_fraction(interval_s=600, save_s=10, restart_s=300, mtbf_s=20_000) == pytest.approx(
        600 / 610 * (1 - 605 / 20_000))
    assert goodput_fraction(interval_s=600, save_s=10, restart_s=300, mtbf_s=None) == pytest.approx(600 / 610)
    assert goodput_fraction(interval_s=600, save_s=10, restart_s=30_000, mtbf_s=20_000) == 0.0


def test_the_llama3_rate_and_the_job_mtbf():
    rate = get_failures("llama3-h100").per_gpu_hour
    assert rate == pytest.approx(419 / (54 * 24 * 16_384), rel=1e-3)
    g = _goodput(scenarios.load("gem-h100-4k"))
    assert g.mtbf_s == pytest.approx(3600 / (4096 * rate))
    assert g.optimal_interval_s == pytest.approx(math.sqrt(2 * g.save_blocking_s * g.mtbf_s))
    assert g.interval_from == "optimal" and g.interval_steps == g.optimal_interval_steps == round(
        g.optimal_interval_s / 0.5)
    assert g.checkpoint_bytes_total / 1e12 == pytest.approx(12.7, rel=0.02)  # ~3 T fp32 embedding params
    assert g.effective_samples_per_s == pytest.approx(128 * 4096 / 0.5 * g.goodput)


def test_goodput_falls_as_gpus_grow():
    fractions = [_goodput(_h100(n)).goodput for n in (4096, 16_384, 65_536)]
    assert fractions == sorted(fractions, reverse=True) and fractions[0] > fractions[-1]
    assert 0.0 < fractions[-1] < fractions[0] < 1.0


def test_async_stalls_less_than_sync_and_every_is_used():
    sync = _goodput(scenarios.load("gem-h100-4k"))
    asy = _goodput(scenarios.load("gem-h100-4k", ["training.checkpoint.async=true"]))
    assert asy.save_blocking_s == pytest.approx(asy.stage_s) and asy.save_blocking_s < sync.save_blocking_s
    assert sync.save_blocking_s == pytest.approx(sync.stage_s + sync.write_s)
    assert asy.goodput > sync.goodput
    every = _goodput(scenarios.load("gem-h100-4k", ["training.checkpoint.every=100"]))
    assert (every.interval_steps, every.interval_s, every.interval_from) == (100, 50.0, "training.checkpoint.every")
    assert every.optimal_interval_steps == sync.optimal_interval_steps and every.goodput < sync.goodput
    # an async write longer than the interval stalls the next save by the rest
    short = _goodput(scenarios.load("gem-h100-4k", ["training.checkpoint.async=true", "training.checkpoint.every=1"]))
    assert short.save_blocking_s == pytest.approx(short.stage_s + short.write_s - 0.5)


def test_cpu_runs_have_no_failures_and_the_local_disk():
    r = simulate(scenarios.load("debug-cpu"), imbalance=False)
    g = r.goodput
    assert (g.storage, g.failures, g.mtbf_s, g.interval_s, g.goodput) == ("local-disk", "none", None, None, 1.0)
    per_rank, total = checkpoint_bytes(r.resolved_scenario, memory_per_rank(r.resolved_scenario))
    assert per_rank == g.checkpoint_bytes_per_rank and total == g.checkpoint_bytes_total
    assert SimResult.model_validate_json(r.model_dump_json()) == r


@pytest.mark.parametrize("field, value, thing, known", [
    ("storage", "s3", "storage preset", list_storage()),
    ("failures", "rsc-9", "failure catalog", list_failures()),
])  # fmt: skip
def test_unknown_names_are_one_line_scenario_errors(field, value, thing, known):
    s = scenarios.load("debug-cpu", [f"hardware.{field}={value}"])
    with pytest.raises(ScenarioError) as e:
        simulate(s, imbalance=False)
    assert str(e.value) == f"hardware.{field}: unknown {thing} '{value}'; known: {', '.join(known)}"


def test_every_number_has_a_source():
    for name in list_storage():
        p = get_storage(name)
        assert p.sources and all(p.sources.values()), name
    assert all(get_failures(n).source for n in list_failures())
    assert host_copy_Bps("h200") == pytest.approx(55.2e9) and host_copy_Bps("mi300x") == host_copy_Bps("default")


def test_plan_ranks_by_effective_samples_per_s():
    s = scenarios.load("gem-h200-2gpu", ["training.checkpoint.every=1", "hardware.storage=local-disk"])
    r = plan(s, gpus=2, top=4, imbalance_final=False, compare_given=False,
             space={"activation_checkpointing": ["full"], "micro_batch": [128, 256], "precision": ["bf16"]})
    eff = [effective_samples_per_s(e.result) for e in r.top]
    assert len(eff) >= 2 and eff == sorted(eff, reverse=True)
    assert all(e.result.goodput.interval_steps == 1 for e in r.top)


def test_replicated_sync_saves_every_replica():
    """Replicas of replicated_sync drift between syncs, so every replica's shards are saved (the
    executor keys them by shard and replica): the job writes more than fully_sharded's one copy."""
    from twin.simulate import simulate

    full = simulate(scenarios.load("gem-h100-4k")).goodput
    sync = simulate(scenarios.load("gem-h100-4k", ["parallelism.sparse_strategy=replicated_sync"])).goodput
    assert sync.checkpoint_bytes_total > 3 * full.checkpoint_bytes_total
    assert sync.save_blocking_s > full.save_blocking_s
