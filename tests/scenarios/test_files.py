"""Atomic writes (``scenarios.files``): what RunRecords, calibrations, plans and traces are written with."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal

from scenarios.files import write_text_atomic


def _killed_while_writing(path: str) -> None:
    """Write a new record, and die by SIGKILL once its bytes are in the temp file, before the rename."""
    os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
    write_text_atomic(path, json.dumps({"run": "new", "steps": list(range(100_000))}))


def test_a_writer_killed_mid_write_leaves_the_previous_file(tmp_path):
    path = tmp_path / "run.json"
    write_text_atomic(path, json.dumps({"run": "old"}))
    child = multiprocessing.get_context("fork").Process(target=_killed_while_writing, args=(str(path),))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert json.loads(path.read_text()) == {"run": "old"}  # whole, and the old one
    leftovers = [p.name for p in tmp_path.iterdir() if p != path]
    assert all(n.startswith(".run.json.") and n.endswith(".tmp") for n in leftovers)  # only a temp file


def test_a_first_write_killed_leaves_no_file(tmp_path):
    path = tmp_path / "cal.yaml"
    child = multiprocessing.get_context("fork").Process(target=_killed_while_writing, args=(str(path),))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL and not path.exists()
