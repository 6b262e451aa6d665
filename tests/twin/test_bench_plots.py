"""The plot benchmark: its rows have the promised shape (no timing asserted)."""

from __future__ import annotations

import pytest

from twin.bench_plots import format_rows, main, run_bench, synthetic_timeline


def test_rows_have_the_promised_shape(capsys):
    rows = run_bench((10, 1), repeats=1)
    assert [(r["layers"], r["spans"]) for r in rows] == [(1, 8), (10, 62)]  # smallest first
    assert all(r["best_s"] > 0 for r in rows) and rows[0]["time_ratio"] == 1.0
    assert rows[1]["span_ratio"] == pytest.approx(62 / 8)
    assert "span ratio" in format_rows(rows)
    assert main(["--layers", "1", "--repeats", "1"]) == 0 and "8" in capsys.readouterr().out


def test_synthetic_timeline_spans_three_streams():
    timeline = synthetic_timeline(4)
    assert len(timeline.spans) == 26
    assert {s.stream for s in timeline.spans} == {"compute", "comm.dense_shard", "comm.dense_replicate"}


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match=r"^--layers \(\(0,\)\) must be >= 1"):
        run_bench((0,))
