"""Refuse a scenario that does not fit the device, in one line, before allocating it.

``check_fits`` holds the twin's memory model (``twin.memory.memory_per_rank``, what
``gemtwin simulate`` prints) for the scenario as ``executor.train`` runs it — one process that
holds the whole model, every parallelism degree 1 — against what the device has free:

- CUDA: the free bytes ``torch.cuda.mem_get_info`` reports, all of them (the model already
  counts a 1 GiB workspace for the CUDA context and the libraries' workspaces);
- CPU: the host's available RAM (``MemAvailable`` in /proc/meminfo, else the free pages) less
  ``CPU_MARGIN`` (10%) for the OS and what the model leaves out (allocator fragmentation,
  temporaries). The model's categories are a GPU's; on the CPU the same bytes sit in host RAM,
  and its 1 GiB workspace stands for the process's own libraries (torch, Python).

What does not fit raises ``DoesNotFit`` (a ``ValueError``: the CLI prints it as one line and
exits 2): needed against usable, the largest categories, and a fix — the largest
``training.micro_batch`` that fits, else the ``debug-cpu`` scenario or a smaller model. The model
is an estimate, so an allocation can still fail: ``memory_errors_in_one_line`` turns that
(``torch.OutOfMemoryError``, the CPU allocator's ``RuntimeError``, ``MemoryError``) into the
same kind of one-line ``DoesNotFit``.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import torch

from scenarios.schema import Scenario
from twin.memory import MemoryReport, memory_per_rank

CPU_MARGIN = 0.10  # of the host's available RAM, kept free on CPU
SMALLEST = "debug-cpu"  # the bundled scenario a refusal points to
_ONE_PROCESS = dict(dense_replicate=1, dense_shard=1, expert=1, sparse_shard=1, sparse_replica=1)
_OOM_TEXT = ("can't allocate memory", "out of memory")


class DoesNotFit(ValueError):
    """The scenario needs more memory than the device has: one line with the numbers and a fix."""


def check_fits(scenario: Scenario, device: torch.device, *, free_bytes: float | None = None) -> MemoryReport:
    """The memory report of ``scenario`` in one process on ``device``; ``DoesNotFit`` if it exceeds
    what is usable there. ``free_bytes``: what the device reports free (default: ask it)."""
    if free_bytes is None:
        free_bytes = device_free_bytes(device)
    report = memory_per_rank(one_process(scenario))
    usable = usable_bytes(device, free_bytes)
    if report.total_bytes > usable:
        raise DoesNotFit(_refusal(scenario, device, report, free_bytes, usable))
    return report


def one_process(scenario: Scenario) -> Scenario:
    """``scenario`` as the single-process executor runs it: one GPU, every parallelism degree 1."""
    return scenario.model_copy(update={
        "hardware": scenario.hardware.model_copy(update={"num_gpus": 1}),
        "parallelism": scenario.parallelism.model_copy(update=_ONE_PROCESS),
    })  # fmt: skip


def usable_bytes(device: torch.device, free_bytes: float) -> float:
    return free_bytes * (1 - CPU_MARGIN) if device.type == "cpu" else free_bytes


def device_free_bytes(device: torch.device) -> float:
    """Free bytes on ``device``: the CUDA driver's count, or the host's available RAM."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    return host_available_bytes()


def host_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> float:
    """``MemAvailable`` (free + reclaimable page cache), else the free pages (no cache counted)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _refusal(s: Scenario, device: torch.device, report: MemoryReport, free: float, usable: float) -> str:
    where, source = (("in this host's RAM", f"MemAvailable {_gb(free)} less a {CPU_MARGIN:.0%} margin")
                     if device.type == "cpu" else (f"on {device}", "free on the device"))  # fmt: skip
    top = ", ".join(f"{k} {_gb(v)}" for k, v in report.largest(3))
    return (f"{s.name} does not fit {where}: the twin's memory model needs {_gb(report.total_bytes)} "
            f"({top}), {_gb(usable)} usable ({source}); {_fix(s, usable)}")  # fmt: skip


def _fix(s: Scenario, usable: float) -> str:
    """The largest smaller ``training.micro_batch`` that fits, else the debug-cpu scenario."""
    for micro in smaller_micro_batches(s.training.micro_batch):
        need = memory_per_rank(one_process(_with_micro_batch(s, micro))).total_bytes
        if need <= usable:
            return f"try --set training.micro_batch={micro} ({_gb(need)}), or the {SMALLEST} scenario"
    least = memory_per_rank(one_process(_with_micro_batch(s, 1)))
    largest = least.largest(1)[0][0]
    shrink = "smaller model.embeddings tables" if largest.startswith("embedding") else "a smaller model"
    return f"even training.micro_batch=1 needs {_gb(least.total_bytes)} (largest: {largest}): {_instead(s, shrink)}"


def _instead(s: Scenario, shrink: str) -> str:
    if s.name == SMALLEST:
        return f"free memory on this machine ({SMALLEST} is the smallest bundled scenario)"
    return f"use the {SMALLEST} scenario here, or {shrink}"


def smaller_micro_batches(micro_batch: int) -> list[int]:
    """Halvings of ``micro_batch`` while it is even, then 1: each still divides training.global_batch."""
    out = []
    while micro_batch % 2 == 0:
        micro_batch //= 2
        out.append(micro_batch)
    return out + [1] if micro_batch > 1 else out


def _with_micro_batch(s: Scenario, micro_batch: int) -> Scenario:
    return s.model_copy(update={"training": s.training.model_copy(update={"micro_batch": micro_batch})})


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 10e9 else f"{n / 1e9:.2f} GB"


# ---- allocations that fail anyway -----------------------------------------------------------
def memory_errors_in_one_line(fn):
    """Decorate ``fn(scenario, ...)``: an allocation failing inside it raises a one-line
    ``DoesNotFit`` (the original error as its ``__cause__``); other errors pass unchanged."""

    @functools.wraps(fn)
    def wrapper(scenario: Scenario, *args, **kwargs):
        try:
            return fn(scenario, *args, **kwargs)
        except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
            if not is_out_of_memory(e):
                raise
            raise DoesNotFit(out_of_memory_message(scenario, e)) from e

    return wrapper


def is_out_of_memory(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or any(t in text for t in _OOM_TEXT)


def out_of_memory_message(s: Scenario, e: BaseException) -> str:
    """One line: the allocator's first two sentences, the model's estimate, then a fix."""
    text = re.sub(r"^\[enforce fail at [^\]]*\]\s*(err == 0\.\s*)?", "", " ".join(str(e).split()))
    said = " ".join(re.split(r"(?<=\.)\s+", text)[:2])
    said = said if len(said) <= 200 else said[:197] + "..."
    expected = _gb(memory_per_rank(one_process(s)).total_bytes)
    micro = s.training.micro_batch
    fix = _instead(s, "a smaller model")
    if micro > 1:
        fix = f"try a smaller --set training.micro_batch={micro // 2}, or {fix.removeprefix('use ')}"
    return (f"{s.name} ran out of memory ({said or type(e).__name__}) although the twin's memory model "
            f"puts it at {expected}; {fix}")
