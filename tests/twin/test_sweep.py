"""Sweeps: every combination becomes a row, invalid ones carry their error, files are written."""

from __future__ import annotations

import csv

import pytest
import typer
from typer.testing import CliRunner

from twin.cli import friendly
from twin.cli_extra import sweep_command
from twin.sweep import (METRICS, BackendError, GridError, _chunks, _ray_run, combinations,
                         parse_grid, sweep)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_2x2_sweep_writes_4_rows_csv_and_a_plot_per_key(tmp_path):
    grid = {"training.micro_batch": ["128", "256"],
            "parallelism.activation_checkpointing": ["none", "full"]}  # fmt: skip
    seen = []
    r = sweep("gem-h200-2gpu", grid, processes=2, on_result=seen.append)
    assert len(r.rows) == 4 and len(seen) == 4 and not r.errors
    assert [(x["training.micro_batch"], x["parallelism.activation_checkpointing"]) for x in r.rows] \
        == [("128", "none"), ("128", "full"), ("256", "none"), ("256", "full")]
    for row in r.rows:
        assert row["step_time_s"] > 0 and 0 < row["mfu"] < 1 and row["memory_fits"] is True
        assert 0 <= row["exposed_comm_share"] < 1 and row["straggler_s"] == 0.0
    # full checkpointing recomputes: slower at each micro-batch
    by = {(x["training.micro_batch"], x["parallelism.activation_checkpointing"]): x for x in r.rows}
    assert by["128", "full"]["step_time_s"] > by["128", "none"]["step_time_s"]
    files = r.write(tmp_path / "out")
    names = sorted(p.name for p in files)
    assert "sweep.csv" in names
    assert "plot-training.micro_batch.png" in names
    assert "plot-parallelism.activation_checkpointing.png" in names
    for p in files:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == PNG_MAGIC
    with open(tmp_path / "out" / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    assert list(rows[0]) == [*grid, *METRICS, "error"]
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "out").iterdir())


def test_invalid_combination_is_a_row_with_its_error_and_the_sweep_finishes():
    r = sweep("gem-h200-2gpu", {"hardware.num_gpus": ["2", "3"]}, processes=1)
    assert len(r.rows) == 2
    ok, bad = r.rows
    assert ok["error"] == "" and ok["step_time_s"] > 0
    assert bad["hardware.num_gpus"] == "3" and bad["step_time_s"] is None
    assert bad["error"] and "\n" not in bad["error"]
    assert r.errors == [bad]
    assert r.best() == [ok]
    assert "3," in r.csv_text().splitlines()[2]  # the invalid row is in the CSV


def test_imbalance_reports_a_straggler():
    r = sweep("gem-h200-2gpu", {"training.seed": ["0"]}, processes=1, imbalance=True)
    assert r.rows[0]["straggler_s"] > 0


@pytest.mark.parametrize(
    "specs, value",
    [
        (["training.micro_batch=64,128"], {"training.micro_batch": ["64", "128"]}),
        (["a.b=1, 2 ,3", "c=x"], {"a.b": ["1", "2", "3"], "c": ["x"]}),
        (["t={a: 1, b: 2},{a: 3}"], {"t": ["{a: 1, b: 2}", "{a: 3}"]}),
        (["l=[1, 2],[3]"], {"l": ["[1, 2]", "[3]"]}),
        (["t={a: row, b: table};auto"], {"t": ["{a: row, b: table}", "auto"]}),
        (["s='x,y',z"], {"s": ["'x,y'", "z"]}),
    ],
)
def test_grid_parsing(specs, value):
    assert parse_grid(specs) == value


@pytest.mark.parametrize(
    "specs, message",
    [
        (["training.micro_batch"], "--grid 'training.micro_batch' needs key=v1,v2,..."),
        (["=1,2"], "the key before '=' must be a dotted field path"),
        (["a=1,,2"], "has an empty value"),
        (["a="], "has an empty value"),
        (["a=1", "a=2"], "--grid 'a' is given twice"),
        (["a=1,1"], "lists '1' twice"),
        (["a={x: 1,2"], "unbalanced brackets or quotes; separate values with ';'"),
    ],
)
def test_grid_errors_are_one_line(specs, message):
    with pytest.raises(GridError) as e:
        parse_grid(specs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_combinations_last_key_fastest():
    assert combinations({"a": ["1", "2"], "b": ["x", "y"]}) == [
        ["a=1", "b=x"], ["a=1", "b=y"], ["a=2", "b=x"], ["a=2", "b=y"]]  # fmt: skip


def _app() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)
    app.command("sweep")(friendly(sweep_command))
    app.command("noop")(lambda: None)  # two commands: "sweep" stays a subcommand
    return app


def test_command_writes_files_and_prints_best(tmp_path):
    res = CliRunner().invoke(_app(), ["sweep", "gem-h200-2gpu", "--grid", "hardware.num_gpus=2,3",
                                      "-o", str(tmp_path), "--processes", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "2 points" in res.output and "1 invalid" in res.output
    assert (tmp_path / "sweep.csv").is_file() and (tmp_path / "plot-hardware.num_gpus.png").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--grid", "training.micro_batch"], "--grid 'training.micro_batch' needs key=v1,v2,..."),
        (["--grid", "a=1", "--processes", "0"], "--processes (0) must be at least 1"),
        (["--grid", "a=1", "--set", "nonsense"], "must look like path.to.field=value"),
    ],
)
def test_command_errors_exit_2_with_one_line(tmp_path, args, message):
    res = CliRunner().invoke(_app(), ["sweep", "gem-h200-2gpu", "-o", str(tmp_path / "o"), *args])
    assert res.exit_code == 2
    assert message in " ".join(res.output.split())


def test_unknown_scenario_is_a_one_line_error():
    res = CliRunner().invoke(_app(), ["sweep", "no-such-scenario", "--grid", "a=1"])
    assert res.exit_code == 2 and "not found" in res.output


# ---- the Ray backend (runs where Ray is installed: pip install 'gemtwin[ray]') ----------------
RAY_GRID = {"hardware.num_gpus": ["2", "3"], "training.micro_batch": ["128", "256"]}


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray instance (2 CPUs) for the module's Ray tests."""
    ray = pytest.importorskip("ray")
    import logging

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)  # fmt: skip
    yield ray
    ray.shutdown()


def test_ray_backend_gives_the_rows_of_the_process_backend(ray_local):
    seen = []
    r = sweep("gem-h200-2gpu", RAY_GRID, ray_address="local", on_result=seen.append)
    ref = sweep("gem-h200-2gpu", RAY_GRID, processes=2)
    assert r.backend == "ray" and r.processes == 2 and ref.backend == "processes"
    assert r.rows == ref.rows and len(seen) == 4
    assert [x["hardware.num_gpus"] for x in r.errors] == ["3", "3"]  # invalid points are rows
    assert ray_local.is_initialized()  # a session the caller opened is left open


def test_ray_worker_death_makes_error_rows_not_a_crash(ray_local):
    from scenarios.loader import read_raw
    from twin.progress import StepProgress

    def kills_its_worker(base, points, imbalance):  # nested: Ray pickles it by value
        import os

        from twin.sweep import _run_chunk

        if any("training.micro_batch=256" in o for _, ov in points for o in ov):
            os._exit(1)  # a worker that dies (as if killed or out of memory)
        return _run_chunk(base, points, imbalance)

    points = combinations(RAY_GRID)  # (2, 128) (2, 256) (3, 128) (3, 256); one per chunk
    rows = {}
    _ray_run(ray_local, read_raw("gem-h200-2gpu"), _chunks(points, 4), False, rows.__setitem__,
             StepProgress(), fn=kills_its_worker)  # fmt: skip
    assert sorted(rows) == [0, 1, 2, 3]
    assert rows[0]["error"] == "" and rows[0]["step_time_s"] > 0
    assert rows[2]["error"] and "ray task failed" not in rows[2]["error"]  # invalid: 3 GPUs
    for i in (1, 3):
        assert rows[i]["error"].startswith("ray task failed: ") and rows[i]["step_time_s"] is None
        assert "\n" not in rows[i]["error"]


def test_ray_missing_is_a_one_line_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(BackendError) as e:
        sweep("gem-h200-2gpu", {"training.seed": ["0"]}, ray_address="local")
    # the exact install line for this checkout's venv (gemtwin is not on a package index)
    from twin.console import install_hint

    assert str(e.value) == (f"--ray needs Ray, which is not installed; install it with: "
                            f"{install_hint('ray')} (or drop --ray to use local processes)")  # fmt: skip
    assert install_hint("ray").startswith("uv pip install -p ") and "[ray]'" in install_hint("ray")
