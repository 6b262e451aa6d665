"""Forecast (twin.forecast): realised FLOP growth, monotonic in growth, bad inputs."""

from __future__ import annotations

import pytest

import scenarios
from twin.forecast import forecast, grow, load_roadmap, step_flops_of


@pytest.fixture(scope="module")
def base():
    return scenarios.load("gem-h200-1gpu")


@pytest.fixture(scope="module")
def roadmap(tmp_path_factory):
    p = tmp_path_factory.mktemp("rm") / "roadmap.yaml"
    p.write_text("pue: 1.2\nyears:\n  0: [{gpu: h200, network: h200-ib, usd_per_gpu_hour: 2.5}]\n")
    return p


@pytest.mark.parametrize("factor", [2.0, 4.0, 16.0])
def test_layers_rule_realises_the_requested_flop_growth(base, factor):
    realised = step_flops_of(grow(base, factor, "layers")) / step_flops_of(base)
    assert realised == pytest.approx(factor, rel=0.10)


def test_every_rule_grows_flops(base):
    for rule in ("layers", "width", "seq_len", "batch"):
        assert step_flops_of(grow(base, 4.0, rule)) > 1.5 * step_flops_of(base)


def test_forecast_is_monotonic_in_growth(base, roadmap):
    runs = {g: forecast(base, growth=g, years=1, roadmap=roadmap, plan_budget=None)
            for g in (1.0, 2.0, 4.0)}  # fmt: skip
    need = {g: [r.gpus for r in f.rows] for g, f in runs.items()}
    assert all(n is not None for ns in need.values() for n in ns)
    assert need[1.0][1] <= need[2.0][1] <= need[4.0][1]
    assert need[4.0][1] > need[4.0][0]
    r = runs[4.0].rows[1]
    assert r.samples_per_s >= r.target_samples_per_s
    assert r.cost_usd_per_year == pytest.approx(r.gpus * 2.5 * 8760)
    assert r.energy_mwh_per_year == pytest.approx(r.gpus * 700 * 1.2 * 8760 / 1e6)


def test_default_roadmap_loads():
    rm = load_roadmap()
    assert {g.gpu for g in rm.at(0)} == {"h100", "h200"}
    assert rm.at(9) == rm.at(max(rm.years))


@pytest.mark.parametrize("kwargs, message", [
    ({"rule": "depth"}, "rule 'depth' is unknown; use one of: layers, width, seq_len, batch"),
    ({"growth": 0.5}, "growth (0.5) must be a number >= 1; pass e.g. --growth 4"),
    ({"years": -1}, "years (-1) must be an integer >= 0; pass e.g. --years 3"),
])  # fmt: skip
def test_bad_inputs_give_pinned_one_line_errors(base, kwargs, message):
    with pytest.raises(ValueError) as e:
        forecast(base, **kwargs)
    assert str(e.value) == message


def test_missing_roadmap_is_one_line(base, tmp_path):
    with pytest.raises(FileNotFoundError, match="roadmap .* not found; pass an existing YAML file"):
        forecast(base, roadmap=tmp_path / "nope.yaml")


def test_never_more_gpus_than_samples_in_the_global_batch(roadmap):
    """Past one sample per GPU, data parallelism cannot help: the target is out of reach."""
    small = scenarios.load("gem-h200-1gpu", ["training.global_batch=4", "training.micro_batch=4"])
    one_layout = {"activation_checkpointing": ["full"], "precision": ["bf16"], "expert": [1],
                  "sparse_shard": [1]}  # the cap is the point here, not the search: keep it cheap
    f = forecast(small, growth=16.0, years=1, roadmap=roadmap, plan_budget=None, space=one_layout,
                 max_global_batch=4)  # the global batch kept at the scenario's
    grown = f.rows[-1]
    assert grown.gpus is None  # 16x the FLOPs of a 4-sample step cannot be held on 4 GPUs
    assert grown.largest_gpus == 4 and grown.cost_usd_per_year is None
    assert "capped by the global batch cap of 4 samples" in grown.reason
    assert 0 < grown.samples_per_s < grown.target_samples_per_s  # what 4 GPUs do reach


def test_global_batch_grows_with_the_cluster_up_to_its_cap(roadmap):
    """With room to grow, each GPU keeps year 0's 4 samples: the same 16x model is held on more GPUs,
    its global batch 4 x GPUs, and the notes say so; a cap below the scenario's batch is an error."""
    small = scenarios.load("gem-h200-1gpu", ["training.global_batch=4", "training.micro_batch=4"])
    one_layout = {"activation_checkpointing": ["full"], "precision": ["bf16"], "expert": [1],
                  "sparse_shard": [1]}
    f = forecast(small, growth=16.0, years=1, roadmap=roadmap, plan_budget=None, space=one_layout,
                 max_global_batch=256)
    y0, y1 = f.rows
    assert y0.gpus is not None and y0.global_batch == 4 * y0.gpus
    assert y1.gpus is not None and y1.gpus > max(4, y0.gpus) and y1.global_batch == 4 * y1.gpus
    assert y1.samples_per_s >= y1.target_samples_per_s
    assert any("4 samples per GPU (year 0's) x the GPUs, capped at 256" in n and "grown in" in n
               for n in f.notes), f.notes
    assert f"global batch {y1.global_batch:,}" in f.lines()[1]
    with pytest.raises(ValueError, match=r"max_global_batch \(2\) must be an integer >= the scenario's global batch"):
        forecast(small, roadmap=roadmap, max_global_batch=2)


def test_dlrm_grows_by_batch_by_default(roadmap):
    f = forecast(scenarios.load("dlrm-dcnv2"), growth=2.0, years=0, roadmap=roadmap,
                 plan_budget=20, space={"activation_checkpointing": ["none"],
                                           "precision": ["bf16"]})  # fmt: skip
    assert f.rule == "batch" and any("rule batch: the default" in n for n in f.notes)
    assert f.rows[0].gpus is not None and f.rows[0].samples_per_s >= f.rows[0].target_samples_per_s


def test_command_prints_table_and_layouts_and_writes_plots_and_json(roadmap, tmp_path):
    import json

    import typer
    from typer.testing import CliRunner

    from twin.cli import friendly
    from twin.forecast import forecast_command

    app = typer.Typer(pretty_exceptions_enable=False)
    app.command("forecast")(friendly(forecast_command))
    app.command("noop")(lambda: None)
    res = CliRunner().invoke(app, ["forecast", "gem-h200-1gpu", "--years", "0", "--roadmap",
                                   str(roadmap), "-o", str(tmp_path), "--plan-budget", "20"])  # fmt: skip
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "forecast: gem-h200-1gpu, FLOPs x4/year by layers" in out
    assert "year 0 h200: 1 GPU, mb" in out and "rule layers: the default for a GEM model" in out
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["forecast.json"] + [f"gem-h200-1gpu-forecast-{k}.png"
                                         for k in ("cost", "energy", "gpus", "mfu")]  # fmt: skip
    data = json.loads((tmp_path / "forecast.json").read_text())
    assert data["rows"][0]["gpus"] == 1 and data["rows"][0]["cost_usd_per_year"] == 2.5 * 8760


def test_gpu_counts_are_refined_to_within_five_percent(base, roadmap):
    """Issue 26: a row's count is not just the grid's (powers of two, domain multiples: up to 2x
    coarse) but the fewest valid mesh that holds the target, to 5%: the valid count 5% below it
    misses the target."""
    from twin.forecast import DEFAULT_MAX_GLOBAL_BATCH, QUICK_SPACE, REFINE_TOL, batch_at
    from twin.planner import plan

    f = forecast(base, growth=4.0, years=1, roadmap=roadmap, plan_budget=None)
    row = f.rows[1]
    assert row.gpus is not None and row.samples_per_s >= row.target_samples_per_s
    dom = 8  # h200-ib's NVLink domain
    step = dom if row.gpus > dom else 1
    below = (int(row.gpus * (1 - REFINE_TOL)) // step) * step
    if 0 < below < row.gpus:
        sy = grow(base, 4.0, f.rule)
        sc = batch_at(sy, below, base.training.global_batch / base.hardware.num_gpus, DEFAULT_MAX_GLOBAL_BATCH)
        r = plan(sc, gpus=below, gpu="h200", network="h200-ib", top=1, imbalance_final=False, exhaustive_comm=0,
                 space=QUICK_SPACE, compare_given=False)
        assert r.best is None or r.best.result.samples_per_s < row.target_samples_per_s


def test_rows_planned_side_by_side_are_the_rows_planned_in_turn(base, tmp_path):
    """A year's generations are planned in parallel processes (``workers``), the next year's
    queued as soon as the row it starts from is known: the rows, their layouts and numbers are the
    same as one process gives (year 1's model, 18 layers per stack, is deep enough to fold:
    twin.fold)."""
    rm = tmp_path / "rm.yaml"
    rm.write_text("pue: 1.2\nyears:\n  0: [{gpu: h200, network: h200-ib, usd_per_gpu_hour: 2.5},"
                  " {gpu: b200, network: b200-ib, usd_per_gpu_hour: 3.75}]\n")  # fmt: skip
    one = forecast(base, growth=4.0, years=1, roadmap=rm, workers=1)
    two = forecast(base, growth=4.0, years=1, roadmap=rm, workers=2)
    key = [(r.year, r.gpu, r.gpus, r.config, r.global_batch) for r in one.rows]
    assert key == [(r.year, r.gpu, r.gpus, r.config, r.global_batch) for r in two.rows]
    assert [r.samples_per_s for r in one.rows] == pytest.approx([r.samples_per_s for r in two.rows], rel=1e-12)
    assert all(r.gpus for r in one.rows)


def test_a_count_the_scenario_itself_could_not_run_is_still_planned():
    """The bisection tries any count below the NVLink domain: 3 GPUs of ``gem-h200-2gpu`` (2 ×
    256 per GPU) is 768 samples, no multiple of its own 2 × 256; the planner lays it out anyway."""
    from twin.forecast import batch_at
    from twin.planner import plan

    s = scenarios.load("gem-h200-2gpu")
    three = batch_at(s, 3, 256, 524_288)
    assert three.training.global_batch == 768
    r = plan(three, gpus=3, gpu="h200", network="h200-ib", top=1, imbalance_final=False, compare_given=False)
    assert r.best is not None and r.best.result.num_gpus == 3 and r.global_batch == 768


def test_the_grid_ends_at_the_largest_cluster_a_row_can_name():
    """A row out of reach says it was capped by the preset's size: the grid must have tried it
    (24,576 H100s on h100-roce-3tier, not only 16,384), or the largest domain multiple under the
    forecast's limit (65,520 GB200s: 910 NVL72 racks)."""
    from twin.forecast import gpu_grid

    assert gpu_grid("h100-roce-3tier")[-2:] == [16_384, 24_576]
    assert gpu_grid("gb200-nvl72", limit=65_536)[-2:] == [36_864, 65_520]
    assert gpu_grid("h200-ib")[-1] == 32_768 and gpu_grid("h200-ib", limit=3) == [1, 2, 3]  # any count below a domain
