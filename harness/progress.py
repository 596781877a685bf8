"""Progress for long phases: a rich bar on a terminal; otherwise (CI logs) a line every
LINE_EVERY_S seconds while the phase runs (also while one long unit of it runs), and one when it ends."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

LINE_EVERY_S = 10.0


@contextmanager
def progress_bar(console: Console, description: str, total: int):
    """Yields `advance()`; shows a bar on a terminal, else prints progress lines (a long run is never silent)."""
    if not console.is_terminal:
        t0 = time.perf_counter()
        state = {"done": 0, "said": t0}
        ended = threading.Event()

        def say(now: float) -> None:
            state["said"] = now
            console.print(f"{description}: {state['done']}/{total} after {now - t0:.0f} s", markup=False, highlight=False)

        def advance() -> None:
            state["done"] += 1
            now = time.perf_counter()
            if now - state["said"] >= LINE_EVERY_S and state["done"] < total:
                say(now)

        def say_while_running() -> None:  # also between advances: a phase of one long unit is not silent either
            while not ended.wait(LINE_EVERY_S):
                if (now := time.perf_counter()) - state["said"] >= LINE_EVERY_S:
                    say(now)

        ticker = threading.Thread(target=say_while_running, daemon=True)
        ticker.start()
        try:
            yield advance
        finally:
            ended.set()
            ticker.join()
        console.print(f"{description}: {state['done']}/{total} in {time.perf_counter() - t0:.1f} s", markup=False, highlight=False)
        return
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)
