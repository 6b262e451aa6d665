"""twin.api: the public Python surface a notebook scripts, and the CLI as a thin layer over it."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from twin import api
from twin.cli import app

ROOT = Path(__file__).resolve().parents[2]
CAL = ROOT / "hwmodels/data/calibrations/h200-fused-executor.yaml"  # fitted on s23 (gem-h200-1gpu)
RUN = ROOT / "hwmodels/data/runs/h200-2026-12-01-executor/s27.json"  # held out from it

PUBLIC = {
    "Scenario", "ScenarioError", "load",
    "Calibration", "SimResult", "load_calibration", "simulate",
    "SweepResult", "sweep", "PlanResult", "plan", "write_best_yaml", "ForecastResult", "forecast",
    "RunRecord", "RunRow", "load_run", "validate",
    "from_dict", "to_dict", "to_frame", "to_json",
    "breakdown_figure", "forecast_figure", "sweep_figure", "timeline_figure", "validation_figure",
}  # fmt: skip


@pytest.fixture(scope="module")
def result():
    return api.simulate("gem-h200-1gpu")


@pytest.fixture(scope="module")
def swept():
    return api.sweep("gem-h200-1gpu", {"training.micro_batch": [128, 256, 512]}, processes=1)


@pytest.fixture(scope="module")
def planned():
    return api.plan("gem-h200-1gpu", gpus=2, budget=20, top=3)


@pytest.fixture(scope="module")
def forecast():
    return api.forecast("gem-h200-1gpu", years=1, workers=1)


# ---- the surface ------------------------------------------------------------------------------
def test_public_names_are_exactly_the_listed_ones_and_each_resolves():
    assert set(api.__all__) == PUBLIC and len(api.__all__) == len(PUBLIC)
    for name in api.__all__:
        obj = getattr(api, name)
        if not isinstance(obj, type):  # each public function documents itself
            assert obj.__doc__ and obj.__annotations__.get("return"), name
    assert api.SimResult.__module__ == "twin.simulate" and api.ScenarioError.__name__ == "ScenarioError"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        api.nope  # noqa: B018


def test_importing_the_api_imports_neither_torch_nor_the_engine():
    code = ("import sys, twin.api; bad = [m for m in ('torch', 'twin.engine', 'twin.planner', 'pandas') "
            "if m in sys.modules]; print(bad)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_budget_defaults_are_the_clis():
    import inspect

    from twin.forecast import DEFAULT_PLAN_BUDGET
    from twin.planner import DEFAULT_BUDGET

    assert inspect.signature(api.plan).parameters["budget"].default == DEFAULT_BUDGET
    assert inspect.signature(api.forecast).parameters["plan_budget"].default == DEFAULT_PLAN_BUDGET


# ---- load -------------------------------------------------------------------------------------
def test_load_takes_overrides_as_a_dict_or_as_set_strings_alike():
    a = api.load("gem-h200-1gpu", {"training.micro_batch": 128, "parallelism.activation_checkpointing": "full"})
    b = api.load("gem-h200-1gpu", ["training.micro_batch=128", "parallelism.activation_checkpointing=full"])
    assert a == b and a.training.micro_batch == 128
    # a string value is YAML text, as after --set key=
    c = api.load("gem-h200-1gpu", {"training.micro_batch": "128"})
    assert c == a.model_copy(update={"parallelism": api.load("gem-h200-1gpu").parallelism})


def test_load_takes_a_path_a_mapping_with_extends_and_a_scenario(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("extends: gem-h200-1gpu\nname: mine\ntraining: {micro_batch: 128}\n")
    from_file = api.load(path)
    from_mapping = api.load({"extends": "gem-h200-1gpu", "name": "mine", "training": {"micro_batch": 128}})
    assert from_file == from_mapping and from_file.name == "mine"
    again = api.load(from_file, {"training.seed": 7})
    assert again.training.seed == 7 and again.training.micro_batch == 128 and from_file.training.seed != 7


@pytest.mark.parametrize("ref, overrides, message", [
    ("gem-h200-1gpu", {"training.micro_batch": "lots"},
     "training.micro_batch: input should be a valid integer"),
    ("gem-h200-1gpu", {"training.micro_batch.x": 1}, "override: training.micro_batch is not a section"),
    ("gem-h200-1gpu", {"trainig.micro_batch": 1}, "trainig: unknown field; known fields here:"),
    ("gem-h200-1gpu", "training.micro_batch=1", "overrides 'training.micro_batch=1' must be a mapping"),
    ("gem-h200-lgpu", {}, "scenario 'gem-h200-lgpu' not found"),
    ({"extends": "gem-h20-1gpu"}, {}, "the scenario mapping: extends: scenario 'gem-h20-1gpu' not found"),
    (42, {}, "scenario 42 must be a bundled name, a YAML path, a mapping or a Scenario"),
])  # fmt: skip
def test_load_errors_are_one_line_scenario_errors(ref, overrides, message):
    with pytest.raises(api.ScenarioError) as e:
        api.load(ref, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


# ---- simulate, calibration --------------------------------------------------------------------
def test_simulate_takes_a_name_or_a_scenario_and_a_calibration_path(result):
    assert result == api.simulate(api.load("gem-h200-1gpu"))
    calibrated = api.simulate("gem-h200-1gpu", calibration=CAL)
    assert calibrated == api.simulate("gem-h200-1gpu", calibration=api.load_calibration(CAL))
    assert calibrated.calibration.startswith("h200 ") and result.calibration == ""
    assert calibrated.step_time_s != result.step_time_s


def test_a_calibration_for_another_gpu_is_refused_in_one_line():
    with pytest.raises(ValueError) as e:
        api.simulate("gem-h100-4k", calibration=CAL)
    assert f"calibration {CAL}" in str(e.value) and "h100" in str(e.value) and "\n" not in str(e.value)


# ---- results as dicts, JSON and back ----------------------------------------------------------
def test_every_result_round_trips_through_json(result, swept, planned, forecast):
    for r in (result, swept, planned, forecast):
        text = api.to_json(r)
        assert api.from_dict(type(r), json.loads(text)) == r, type(r).__name__
        assert json.loads(text) == api.to_dict(r)


def test_json_has_no_infinity_and_an_unreached_forecast_row_comes_back_infinite(forecast):
    missed = dataclasses.replace(forecast.rows[0], gpus=None, step_time_s=math.inf, reason="out of reach")
    fc = dataclasses.replace(forecast, rows=[missed, *forecast.rows[1:]])
    data = json.loads(api.to_json(fc))  # allow_nan=False: raises on infinity
    assert data["rows"][0]["step_time_s"] is None
    assert api.from_dict(api.ForecastResult, data) == fc


def test_to_json_writes_a_file_when_given_a_path(tmp_path, result):
    text = api.to_json(result, tmp_path / "r.json")
    assert (tmp_path / "r.json").read_text() == text
    assert api.from_dict(api.SimResult, json.loads(text)) == result


def test_from_dict_refuses_what_does_not_fit_in_one_line(result):
    data = api.to_dict(result) | {"step_time_s": "fast"}
    with pytest.raises(ValueError, match=r"^SimResult from a dict: step_time_s: .*'fast'") as e:
        api.from_dict(api.SimResult, data)
    assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="to_dict takes a result"):
        api.to_dict({"a": 1})


# ---- sweep ------------------------------------------------------------------------------------
def test_sweep_keeps_invalid_points_with_their_error_and_the_values_as_given(swept):
    assert [r["training.micro_batch"] for r in swept.rows] == [128, 256, 512]
    ok, bad = swept.rows[:2], swept.rows[2]
    assert all(r["error"] == "" and r["step_time_s"] > 0 for r in ok)
    assert "training.global_batch (256) must be a multiple" in bad["error"] and bad["step_time_s"] is None


def test_a_python_grid_sweeps_what_the_cli_grid_sweeps(swept):
    text = api.sweep("gem-h200-1gpu", {"training.micro_batch": ["128", "256", "512"]}, processes=1)
    metrics = [{k: v for k, v in r.items() if k != "training.micro_batch"} for r in text.rows]
    assert metrics == [{k: v for k, v in r.items() if k != "training.micro_batch"} for r in swept.rows]


def test_sweep_overrides_apply_to_every_point():
    r = api.sweep("gem-h200-1gpu", {"training.seed": [0, 1]}, {"training.micro_batch": 128}, processes=1)
    assert {row["step_time_s"] for row in r.rows} == {api.simulate(api.load(
        "gem-h200-1gpu", {"training.micro_batch": 128}), imbalance=False).step_time_s}


@pytest.mark.parametrize("grid, message", [
    ({}, "a sweep needs at least one"),
    ({"training.micro_batch": "64,128"}, "grid training.micro_batch: '64,128' must be a list of values"),
    ({"training.micro_batch": []}, "has no values"),
])  # fmt: skip
def test_bad_grids_are_refused_in_one_line(grid, message):
    with pytest.raises(ValueError, match=message):
        api.sweep("gem-h200-1gpu", grid, processes=1)


# ---- DataFrames -------------------------------------------------------------------------------
def test_a_sweep_becomes_a_frame_of_one_row_per_point(swept):
    pytest.importorskip("pandas")
    df = api.to_frame(swept)
    assert list(df.columns) == swept.columns and len(df) == 3
    assert df["training.micro_batch"].tolist() == [128, 256, 512]
    assert df.loc[0, "step_time_s"] == swept.rows[0]["step_time_s"] and df.loc[2, "error"] != ""


def test_plan_forecast_simulate_and_validate_become_frames(result, planned, forecast):
    pytest.importorskip("pandas")
    df = api.to_frame(planned)
    assert len(df) == len(planned.top) and df.loc[0, "label"] == planned.best.candidate.label()
    assert df.loc[0, "samples_per_s"] == planned.best.result.samples_per_s
    df = api.to_frame(forecast)
    assert df[["year", "gpu", "gpus"]].values.tolist() == [[r.year, r.gpu, r.gpus] for r in forecast.rows]
    df = api.to_frame([result, api.simulate("gem-h200-2gpu")])
    assert df["scenario"].tolist() == ["gem-h200-1gpu", "gem-h200-2gpu"]
    assert df.loc[0, "breakdown_s.compute"] == result.breakdown_s["compute"]
    rows = api.validate(RUN, calibration=CAL)
    df = api.to_frame(rows)
    assert df.loc[0, "source"] == str(RUN) and df.loc[0, "held_out"] and df.loc[0, "error"] == rows[0].error
    with pytest.raises(TypeError, match="to_frame takes"):
        api.to_frame([1, 2])


# ---- runs -------------------------------------------------------------------------------------
def test_validate_reads_records_or_paths_and_marks_the_fitted_run():
    s23 = RUN.parents[1] / "h200-2026-11-30-executor/s23.json"
    rows = api.validate([api.load_run(s23), RUN], calibration=CAL)
    assert [r.held_out for r in rows] == [False, True]
    assert rows[0].source == api.load_run(s23).run_id and rows[1].source == str(RUN)
    assert abs(rows[1].error) < 0.05  # the README's +0.3%
    with pytest.raises(ValueError, match="run record .* not found"):
        api.validate("nope.json")


# ---- figures ----------------------------------------------------------------------------------
def test_figures_are_matplotlib_figures(result, swept, forecast):
    figs = [api.breakdown_figure(result), api.timeline_figure(result), api.sweep_figure(swept),
            api.forecast_figure(forecast, "mfu"), api.validation_figure(api.validate(RUN))]  # fmt: skip
    assert all(isinstance(f, Figure) and f.axes for f in figs)
    assert "gem-h200-1gpu" in figs[1].axes[0].get_title()
    with pytest.raises(ValueError, match="key 'training.seed' was not swept"):
        api.sweep_figure(swept, "training.seed")
    with pytest.raises(ValueError, match="forecast figure 'watts' is unknown"):
        api.forecast_figure(forecast, "watts")


# ---- the CLI is a thin layer over the API -----------------------------------------------------
def test_cli_simulate_writes_what_the_api_returns(tmp_path):
    r = CliRunner().invoke(app, ["simulate", "gem-h200-1gpu", "--set", "training.micro_batch=128", "--brief",
                                 "--calibration", str(CAL), "--out", str(tmp_path / "r.json")])  # fmt: skip
    assert r.exit_code == 0, r.output
    expected = api.simulate(api.load("gem-h200-1gpu", {"training.micro_batch": 128}), calibration=CAL)
    assert json.loads((tmp_path / "r.json").read_text()) == api.to_dict(expected)


def test_cli_forecast_json_is_the_apis_dict(tmp_path, forecast):
    r = CliRunner().invoke(app, ["forecast", "gem-h200-1gpu", "--years", "1", "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    written = json.loads((tmp_path / "forecast.json").read_text())
    assert written | {"wall_s": 0} == api.to_dict(forecast) | {"wall_s": 0}


def test_cli_sweep_csv_holds_the_apis_rows(tmp_path, swept):
    r = CliRunner().invoke(app, ["sweep", "gem-h200-1gpu", "--grid", "training.micro_batch=128,256,512",
                                 "--processes", "1", "-o", str(tmp_path)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert (tmp_path / "sweep.csv").read_text() == swept.csv_text()


def test_write_best_yaml_writes_the_plans_best_as_a_scenario(planned, tmp_path):
    """What ``gemtwin plan -o`` writes: with ``extends``, only the changed fields, which load back
    to the best layout; without, the full scenario."""
    base = api.load("gem-h200-1gpu")
    path = api.write_best_yaml(planned, tmp_path / "best.yaml", base=base, extends="gem-h200-1gpu")
    back = api.load(str(path))
    assert back.parallelism == planned.best.scenario.parallelism
    assert back.training.micro_batch == planned.best.scenario.training.micro_batch
    full = api.write_best_yaml(planned, tmp_path / "full.yaml", base=base)
    assert api.load(str(full)).parallelism == planned.best.scenario.parallelism

