"""The Chrome/Perfetto trace: parses, one X event per op, times in microseconds."""

import json

import pytest

from twin.engine import simulate_graph
from twin.graph import Op, OpGraph
from twin.trace import write_chrome_trace


@pytest.fixture
def timeline():
    graph = OpGraph(
        [
            Op("fwd", "compute", 1.0, op_class="gemm", flops=4e12, bytes=1e9),
            Op("ag", "comm.dense_shard", 0.5, op_class="all_gather", bytes=2e8,
               axis="dense_shard", sm_fraction=0.5),
            Op("rs", "comm.dense_shard", 0.25, deps=("fwd",), op_class="reduce_scatter"),
        ]
    )
    return simulate_graph(graph)


def test_trace_has_one_x_event_per_op_with_matching_times(tmp_path, timeline):
    path = write_chrome_trace(timeline, tmp_path / "step.json", pid_name="rank 7")
    events = json.loads(path.read_text())["traceEvents"]
    complete = {e["name"]: e for e in events if e["ph"] == "X"}
    assert len(complete) == len(timeline.spans) == 3
    for span in timeline.spans:
        event = complete[span.name]
        assert event["ts"] == pytest.approx(span.start_s * 1e6)
        assert event["dur"] == pytest.approx(span.duration_s * 1e6)
    assert (complete["fwd"]["ts"], complete["fwd"]["dur"]) == (0.0, 1.25e6)
    assert complete["ag"]["args"] == {
        "op_class": "all_gather",
        "phase": "fwd",
        "layer": "",
        "flops": 0.0,
        "bytes": 2e8,
        "axis": "dense_shard",
        "isolated_dur_us": 0.5e6,
    }


def test_trace_names_the_process_and_one_thread_per_stream(tmp_path, timeline):
    path = write_chrome_trace(timeline, tmp_path / "t.json")
    events = json.loads(path.read_text())["traceEvents"]
    names = {(e["name"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert names[("process_name", 0)] == {"name": "rank 0"}
    assert names[("thread_name", 0)] == {"name": "compute"}
    assert names[("thread_name", 1)] == {"name": "comm.dense_shard"}
    x_tids = {e["name"]: e["tid"] for e in events if e["ph"] == "X"}
    assert x_tids == {"fwd": 0, "ag": 1, "rs": 1}


def test_trace_write_replaces_atomically_and_leaves_no_temp_file(tmp_path, timeline):
    path = tmp_path / "step.json"
    path.write_text("old")
    write_chrome_trace(timeline, path)
    json.loads(path.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["step.json"]


def test_failed_write_keeps_the_old_file(tmp_path, timeline, monkeypatch):
    path = tmp_path / "step.json"
    path.write_text("old")

    def fail(*_args):
        raise OSError("disk full")

    monkeypatch.setattr("scenarios.files.os.replace", fail)
    with pytest.raises(OSError):
        write_chrome_trace(timeline, path)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["step.json"]
