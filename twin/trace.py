"""Chrome / Perfetto trace-event JSON for a simulated timeline.

One process (the rank), one thread per stream (``tid`` in order of first appearance, with
``thread_name`` metadata), one complete event (``ph: "X"``) per op. ``ts`` and ``dur`` are in
microseconds, as the trace-event format requires. Open the file in https://ui.perfetto.dev or
chrome://tracing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from scenarios.files import write_text_atomic
from twin.engine import Span, Timeline

US_PER_S = 1e6
HOST_TRACK = "host"


def trace_events(
    timeline: Timeline, *, pid: int = 0, pid_name: str = "rank 0"
) -> list[dict[str, Any]]:
    """Metadata events (process and thread names) followed by one X event per span; where the
    timeline has a host time (no CUDA graphs: the host's time to issue the step, a floor under
    it), a ``host`` track with one event that long from the step's start."""
    streams = dict.fromkeys(span.stream for span in timeline.spans)
    tids = {stream: tid for tid, stream in enumerate(streams)}
    events = [_metadata(pid, 0, "process_name", pid_name)]
    for stream, tid in tids.items():
        events.append(_metadata(pid, tid, "thread_name", stream))
        events.append(_metadata(pid, tid, "thread_sort_index", tid, key="sort_index"))
    events.extend(_complete_event(span, pid, tids[span.stream]) for span in timeline.spans)
    if timeline.host_s > 0:
        tid = len(tids)
        events += [_metadata(pid, tid, "thread_name", HOST_TRACK),
                   _metadata(pid, tid, "thread_sort_index", tid, key="sort_index"),
                   {"ph": "X", "name": "host: issue the step (no CUDA graphs)", "cat": "host", "pid": pid,
                    "tid": tid, "ts": 0.0, "dur": timeline.host_s * US_PER_S, "args": {}}]  # fmt: skip
    return events


def write_chrome_trace(
    timeline: Timeline, path: str | os.PathLike[str], *, pid_name: str = "rank 0"
) -> Path:
    """Write the timeline as trace-event JSON to ``path`` atomically (temp file, then rename)."""
    return write_chrome_trace_ranks({pid_name: timeline}, path)


def _metadata(pid: int, tid: int, name: str, value: object, *, key: str = "name") -> dict[str, Any]:
    return {"ph": "M", "pid": pid, "tid": tid, "name": name, "args": {key: value}}


def _complete_event(span: Span, pid: int, tid: int) -> dict[str, Any]:
    return {
        "ph": "X",
        "name": span.name,
        "cat": span.phase,
        "pid": pid,
        "tid": tid,
        "ts": span.start_s * US_PER_S,
        "dur": span.duration_s * US_PER_S,
        "args": {
            "op_class": span.op_class,
            "phase": span.phase,
            "layer": span.layer,
            "flops": span.flops,
            "bytes": span.bytes,
            "axis": span.axis,
            "isolated_dur_us": span.isolated_duration_s * US_PER_S,
        },
    }


def write_chrome_trace_ranks(timelines: Mapping[str, Timeline], path: str | os.PathLike[str]) -> Path:
    """One Perfetto process per represented rank (class), one track per stream in each."""
    events: list[dict[str, Any]] = []
    for pid, (name, timeline) in enumerate(timelines.items()):
        events += trace_events(timeline, pid=pid, pid_name=name)
    return write_text_atomic(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"},
                                              separators=(",", ":")))
