"""Progress for long phases: a rich bar on a terminal, one line when done otherwise (CI logs)."""

from __future__ import annotations

import time
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextmanager
def progress_bar(console: Console, description: str, total: int):
    """Yields `advance()`; shows a bar on a terminal, else prints one line when the phase ends."""
    if not console.is_terminal:
        done = [0]
        t0 = time.perf_counter()
        yield lambda: done.__setitem__(0, done[0] + 1)
        console.print(f"{description}: {done[0]}/{total} in {time.perf_counter() - t0:.1f} s", markup=False, highlight=False)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)
