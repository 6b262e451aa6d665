"""Specifications of the op graph and the engine: exact small timelines, pinned error messages."""

import subprocess
import sys

import pytest
import simpy

from twin.engine import Span, Timeline, simulate_graph
from twin.graph import Op, OpGraph


def compute(name, duration_s, *deps, **fields):
    return Op(name, "compute", duration_s, deps=deps, **fields)


def comm(name, duration_s, *deps, stream="comm.dense_shard", sm_fraction=0.0, **fields):
    return Op(name, stream, duration_s, deps=deps, sm_fraction=sm_fraction, **fields)


def times(timeline):
    return [(s.name, s.start_s, s.end_s) for s in timeline.spans]


def test_times_are_floats():
    span = simulate_graph(OpGraph([compute("a", 1)])).spans[0]
    assert (type(span.start_s), type(span.end_s)) == (float, float)


# -- streams, deps, program order ----------------------------------------------------------------


def test_independent_streams_overlap():
    timeline = simulate_graph(OpGraph([compute("mm", 1.0), comm("ag", 2.0)]))
    assert times(timeline) == [("mm", 0.0, 1.0), ("ag", 0.0, 2.0)]
    assert timeline.step_time_s == 2.0


def test_dep_serializes_across_streams():
    graph = OpGraph([compute("fwd", 1.0), comm("rs", 2.0, "fwd"), compute("opt", 0.5, "rs")])
    assert times(simulate_graph(graph)) == [("fwd", 0.0, 1.0), ("rs", 1.0, 3.0), ("opt", 3.0, 3.5)]


def test_stream_runs_its_ops_in_program_order():
    graph = OpGraph([compute("a", 1.0), compute("b", 2.0), comm("c", 0.5), comm("d", 0.25)])
    assert times(simulate_graph(graph)) == [
        ("a", 0.0, 1.0),
        ("b", 1.0, 3.0),
        ("c", 0.0, 0.5),
        ("d", 0.5, 0.75),
    ]


def test_op_waits_for_both_stream_predecessor_and_deps():
    graph = OpGraph([comm("ag", 2.0), compute("a", 1.0), compute("b", 1.0, "ag")])
    assert times(simulate_graph(graph)) == [("ag", 0.0, 2.0), ("a", 0.0, 1.0), ("b", 2.0, 3.0)]


def test_empty_graph_has_zero_step():
    timeline = simulate_graph(OpGraph([]))
    assert timeline.spans == () and timeline.step_time_s == 0.0


# -- SM contention ---------------------------------------------------------------------------------


def test_sm_collective_over_part_of_compute_slows_only_that_part():
    # 0..0.5 s at rate 0.5 does 0.25 s of work; the remaining 0.75 s runs at full rate -> 1.25 s.
    graph = OpGraph([compute("mm", 1.0), comm("ag", 0.5, sm_fraction=0.5)])
    timeline = simulate_graph(graph)
    assert times(timeline) == [("mm", 0.0, 1.25), ("ag", 0.0, 0.5)]
    assert timeline.slowdown_s == 0.25


def test_sm_collective_over_whole_compute_doubles_it():
    graph = OpGraph([compute("mm", 1.0), comm("ag", 5.0, sm_fraction=0.5)])
    assert simulate_graph(graph).span("mm").end_s == 2.0


def test_collective_starting_mid_op_slows_the_rest():
    # mm runs alone 0..0.5 (0.5 s of work), then at rate 0.5 for its last 0.5 s of work -> 1.5 s.
    graph = OpGraph([compute("mm", 1.0), comm("wait", 0.5), comm("ag", 3.0, sm_fraction=0.5)])
    assert simulate_graph(graph).span("mm").end_s == 1.5


def test_sm_free_collective_does_not_slow_compute():
    timeline = simulate_graph(OpGraph([compute("mm", 1.0), comm("ag", 0.5)]))
    assert timeline.span("mm").end_s == 1.0
    assert timeline.slowdown_s == 0.0


def test_concurrent_collectives_add_their_sm_fractions_up_to_the_cap():
    graph = OpGraph(
        [
            compute("mm", 1.0),
            comm("ag", 10.0, stream="comm.dense_shard", sm_fraction=0.5),
            comm("a2a", 10.0, stream="comm.expert", sm_fraction=0.5),
        ]
    )
    assert simulate_graph(graph, max_comm_sm_fraction=0.75).span("mm").end_s == 4.0


def test_cap_must_leave_compute_some_sms():
    with pytest.raises(ValueError) as err:
        simulate_graph(OpGraph([]), max_comm_sm_fraction=1.0)
    assert str(err.value) == (
        "max_comm_sm_fraction (1.0) must be in [0, 1); compute must keep some SMs"
    )


# -- breakdown ---------------------------------------------------------------------------------


def test_breakdown_of_a_small_step():
    # compute busy [0, 2]; comm busy [0, 0.5] and [1, 3]; exposed is [2, 3].
    graph = OpGraph(
        [
            compute("fwd", 1.0, op_class="gemm", phase="fwd"),
            comm("ag", 0.5, axis="dense_shard"),
            compute("bwd", 1.0, "fwd", op_class="attention", phase="bwd"),
            comm("rs", 2.0, "fwd", stream="comm.sparse_shard", axis="sparse_shard"),
        ]
    )
    timeline = simulate_graph(graph)
    assert timeline.step_time_s == 3.0
    assert timeline.compute_s == 2.0
    assert timeline.comm_s == 2.5
    assert timeline.comm_s_by_stream == {"comm.dense_shard": 0.5, "comm.sparse_shard": 2.0}
    assert timeline.exposed_comm_s == 1.0
    assert timeline.overlapped_comm_s == 1.5
    assert timeline.idle_s == 0.0
    assert timeline.compute_s_by_op_class == {"gemm": 1.0, "attention": 1.0}
    assert timeline.compute_s_by_phase == {"fwd": 1.0, "bwd": 1.0}
    assert timeline.slowdown_s == 0.0


def test_isolated_compute_by_op_class_leaves_out_sm_contention():
    # a 0.5-SM collective over [0, 1] halves compute: gemm (1 s of work) ends at 1.5 s.
    graph = OpGraph([compute("g", 1.0, op_class="gemm"), compute("n", 1.0, "g", op_class="norm"),
                     comm("ar", 1.0, sm_fraction=0.5)])  # fmt: skip
    t = simulate_graph(graph)
    assert t.compute_s_by_op_class == {"gemm": 1.5, "norm": 1.0}
    assert t.isolated_compute_s_by_op_class == {"gemm": 1.0, "norm": 1.0}
    assert sum(t.isolated_compute_s_by_op_class.values()) == t.compute_s - t.slowdown_s


def test_exposed_comm_split_sums_to_the_exposed_total():
    # compute [0, 1] and [3, 4]; x exposed alone on [1, 2], x and y together on [2, 3].
    t = Timeline.from_spans([
        Span("c1", "compute", 0.0, 1.0), Span("c2", "compute", 3.0, 4.0),
        Span("a", "comm.x", 0.5, 3.0), Span("b", "comm.y", 2.0, 3.5),
        Span("hidden", "comm.z", 3.0, 4.0),
    ])  # fmt: skip
    assert t.exposed_comm_s_by_stream() == {"comm.x": 2.0, "comm.y": 1.0, "comm.z": 0.0}
    split = t.exposed_comm_s_split_by_stream()
    assert split == pytest.approx({"comm.x": 1.5, "comm.y": 0.5, "comm.z": 0.0})
    assert sum(split.values()) == pytest.approx(t.exposed_comm_s) and t.exposed_comm_s == 2.0


def test_idle_time_counts_gaps_where_no_stream_is_busy():
    spans = [Span("a", "compute", 0.0, 1.0), Span("b", "comm.x", 2.0, 3.0)]
    timeline = Timeline.from_spans(spans)
    assert (timeline.idle_s, timeline.exposed_comm_s, timeline.step_time_s) == (1.0, 1.0, 3.0)


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        (
            [compute("a", 1.0, "nope")],
            "op 'a': dep 'nope' is not an op of the graph; check the name",
        ),
        (
            [compute("a", 1.0), comm("a", 1.0)],
            "op 'a' (#1): duplicate name, first used by op #0; give each op a unique name",
        ),
        (
            [compute("a", 1.0, "b"), compute("b", 1.0)],
            "op 'a' (#0): dep 'b' (#1) is not earlier in program order; "
            "list every op after the ops it depends on",
        ),
        (
            [compute("a", 1.0, "a")],
            "op 'a' (#0): dep 'a' (#0) is not earlier in program order; "
            "list every op after the ops it depends on",
        ),
        ([compute("a", -1.0)], "op 'a': duration_s (-1.0) must be >= 0"),
        ([compute("a", float("nan"))], "op 'a': duration_s (nan) must be >= 0"),
        ([comm("ag", 1.0, sm_fraction=1.5)], "op 'ag': sm_fraction (1.5) must be in [0, 1]"),
        (
            [Op("a", "compute", 1.0, sm_fraction=0.2)],
            "op 'a': sm_fraction (0.2) must be 0 on the compute stream; "
            "only collectives take SMs away from compute",
        ),
        ([Op("", "compute", 1.0)], "op #0: name ('') must be a non-empty string"),
        ([Op("a", "", 1.0)], "op 'a': stream is empty; use 'compute' or a comm channel name"),
    ],
)
def test_invalid_graph_gives_one_line_message(ops, message):
    with pytest.raises(ValueError) as err:
        OpGraph(ops)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_graph_helpers():
    graph = OpGraph([compute("a", 1.0, flops=2.0), comm("b", 0.5), compute("c", 2.0, flops=3.0)])
    assert graph.streams() == ("compute", "comm.dense_shard")
    assert {s: [op.name for op in ops] for s, ops in graph.by_stream().items()} == {
        "compute": ["a", "c"],
        "comm.dense_shard": ["b"],
    }
    assert graph.total_duration() == 3.5
    assert graph.total_duration(stream="compute") == 3.0
    assert graph.total_flops() == 5.0
    assert graph["b"].duration_s == 0.5 and graph.position("c") == 2 and "c" in graph


# -- determinism and speed ---------------------------------------------------------------------


def layered_graph(num_layers):
    """FSDP-like step: per layer all-gather then fwd, then bwd with reduce-scatter; 4 ops/layer."""
    ops = []
    for i in range(num_layers):
        ops.append(comm(f"l{i}.ag", 0.002, sm_fraction=0.1, op_class="all_gather"))
        ops.append(compute(f"l{i}.fwd", 0.003, f"l{i}.ag", op_class="gemm", layer=f"l{i}"))
    for i in reversed(range(num_layers)):
        ops.append(compute(f"l{i}.bwd", 0.006, op_class="gemm", phase="bwd", layer=f"l{i}"))
        ops.append(
            comm(f"l{i}.rs", 0.004, f"l{i}.bwd", stream="comm.dense_replicate", sm_fraction=0.2)
        )
    return OpGraph(ops)


def test_same_graph_gives_the_same_timeline():
    graph = layered_graph(50)
    assert simulate_graph(graph) == simulate_graph(graph)


def test_engine_work_is_linear_in_ops(monkeypatch):
    """What keeps a 2,000-op graph quick: a bounded number of simpy events per op (a start, the
    end or a load change, the done event), the same at 200 and 2,000 ops, so a run is linear in
    ops. (``python -m twin.bench_scale`` reports the wall time.)"""
    scheduled = []

    class CountingEnvironment(simpy.Environment):
        def schedule(self, event, *args, **kwargs):
            scheduled.append(event)
            return super().schedule(event, *args, **kwargs)

    monkeypatch.setattr(simpy, "Environment", CountingEnvironment)
    per_op = {}
    for layers in (50, 500):
        graph = layered_graph(layers)
        scheduled.clear()
        timeline = simulate_graph(graph)
        assert len(timeline.spans) == len(graph) and timeline.slowdown_s > 0
        per_op[len(graph)] = len(scheduled) / len(graph)
    assert max(per_op.values()) <= 5, per_op
    assert per_op[2000] == pytest.approx(per_op[200], rel=0.01), per_op


def test_engine_never_imports_torch():
    code = "import sys, twin.engine, twin.trace; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
