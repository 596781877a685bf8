"""Progress bars for long phases (rich), quiet when output is not a terminal."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextmanager
def progress_bar(console: Console, description: str, total: int):
    """Yields `advance()`; shows a bar on a terminal, one line when done otherwise."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)
