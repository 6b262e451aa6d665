"""PNG plots: valid files, atomic writes, readable at thousands of spans."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure
from matplotlib.image import imread

import scenarios
import twin.plots as plots
from twin.engine import Span, Timeline
from twin.plots import plot_breakdown, plot_timeline
from twin.simulate import simulate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _timeline(n_layers: int = 3) -> Timeline:
    """fwd / bwd / opt on compute, an all-gather and a reduce-scatter per layer on two axes."""
    spans, t = [], 0.0
    for phase in ("fwd", "bwd"):
        for i in range(n_layers):
            spans.append(Span(f"l{i}.gemm.{phase}", "compute", t, t + 2e-3, "gemm", phase))
            spans.append(Span(f"l{i}.norm.{phase}", "compute", t + 2e-3, t + 2.5e-3, "norm", phase))
            kind, axis = ("all_gather", "dense_shard") if phase == "fwd" else ("reduce_scatter", "dense_shard")
            spans.append(Span(f"l{i}.{kind}", f"comm.{axis}", t, t + 1e-3, kind, phase, axis=axis))
            t += 2.5e-3
    spans.append(Span("grads.all_reduce", "comm.dense_replicate", t, t + 4e-3, "all_reduce", "bwd",
                      axis="dense_replicate"))  # exposed: compute waits for it
    spans.append(Span("opt", "compute", t + 4e-3, t + 5e-3, "optimizer", "opt"))
    return Timeline.from_spans(spans)


@pytest.fixture(scope="module")
def result():
    return simulate(scenarios.load("gem-h200-2gpu"))


def _is_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    height, width, _ = imread(path).shape
    assert height > 100 and width > 100


def test_breakdown_is_a_png_and_no_temp_file_is_left(tmp_path, result):
    out = plot_breakdown(result, tmp_path / "breakdown.png")
    assert out == tmp_path / "breakdown.png"
    _is_png(out)
    assert [p.name for p in tmp_path.iterdir()] == ["breakdown.png"]


def test_breakdown_of_several_and_of_a_single_gpu(tmp_path, result):
    plot_breakdown(result, tmp_path / "a.png")
    one_gpu = simulate(scenarios.load("gem-h200-1gpu"))  # no comm row at all
    plot_breakdown(one_gpu, tmp_path / "sub" / "b.png")  # folders are created
    _is_png(tmp_path / "a.png")
    _is_png(tmp_path / "sub" / "b.png")


def test_timeline_is_a_png_and_no_temp_file_is_left(tmp_path):
    out = plot_timeline(_timeline(), tmp_path / "timeline.png", title="tiny")
    _is_png(out)
    assert [p.name for p in tmp_path.iterdir()] == ["timeline.png"]


def test_empty_timeline_still_draws(tmp_path):
    _is_png(plot_timeline(Timeline.from_spans([]), tmp_path / "empty.png"))


def test_thousands_of_spans_draw_as_a_few_collections(tmp_path, monkeypatch):
    """What keeps 6,000 spans quick to draw: one bar collection per (stream, colour), at most two
    with widened sub-pixel spans beneath, never one artist per span; every span is still drawn.
    (``python -m twin.bench_plots`` reports the time, side by side with a small timeline.)"""
    figures, render = [], Figure.savefig

    def keep(fig, *args, **kwargs):
        figures.append(fig)
        return render(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    big = _timeline(n_layers=1_000)
    plot_timeline(big, tmp_path / "big.png")
    assert len(big.spans) == 6_002
    (ax,) = [a for a in figures[0].axes if a.collections]
    bars = [c for c in ax.collections if len(c.get_paths()) > 0]
    kinds = {(s.stream, s.op_class) for s in big.spans}  # 6: gemm, norm, optimizer; 3 collectives
    assert len(kinds) <= len(bars) <= 2 * len(kinds)
    assert sum(len(c.get_paths()) for c in bars) == len(big.spans)
    assert len(ax.patches) < 20  # phase shading: one per run of a phase, not per span
    _is_png(tmp_path / "big.png")


def test_failed_rename_leaves_the_old_file_untouched(tmp_path, monkeypatch):
    target = tmp_path / "timeline.png"
    target.write_bytes(b"old")

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(plots.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        plot_timeline(_timeline(), target)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["timeline.png"]


def test_failed_render_leaves_the_old_file_untouched(tmp_path, monkeypatch, result):
    target = tmp_path / "breakdown.png"
    target.write_bytes(b"old")

    def fail(self, *args, **kwargs):
        raise RuntimeError("render failed")

    monkeypatch.setattr(Figure, "savefig", fail)
    with pytest.raises(RuntimeError, match="render failed"):
        plot_breakdown(result, target)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["breakdown.png"]


def test_folder_as_path_is_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="is a folder") as e:
        plot_timeline(_timeline(), tmp_path)
    assert "\n" not in str(e.value)
