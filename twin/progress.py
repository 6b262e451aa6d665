"""A progress bar for long simulations (rich.progress), or nothing when disabled.

    with progress(total_steps=len(ranks), enabled=not brief) as bar:
        for rank in ranks:
            ...
            bar.advance()

The bar draws on stderr and disappears when done (``transient``), so stdout stays clean for
tables and ``--brief`` lines.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StepProgress:
    """Handle of one bar: ``advance(steps)``; a no-op when the bar is disabled."""

    __slots__ = ("_bar", "_task")

    def __init__(self, bar: Progress | None = None, task: object = None) -> None:
        self._bar, self._task = bar, task

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, steps)


@contextmanager
def progress(
    total_steps: int,
    *,
    enabled: bool = True,
    description: str = "simulating",
    console: Console | None = None,
) -> Iterator[StepProgress]:
    """A bar of ``total_steps`` steps while the block runs; ``enabled=False`` draws nothing."""
    if total_steps < 0:
        raise ValueError(f"progress: total_steps ({total_steps}) must be >= 0")
    if not enabled:
        yield StepProgress()
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console or Console(stderr=True),
        transient=True,
    )
    with bar:
        yield StepProgress(bar, bar.add_task(description, total=total_steps))
