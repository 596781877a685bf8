"""The one error type the CLI turns into a single line and exit code 2, the check failure (exit 1), and Ctrl-C or SIGTERM as
an interruption (exit 130)."""

import functools
import signal
import sys
from typing import Callable


class HarnessError(Exception):
    """Bad input or an impossible request: `where` names the file/field at fault."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


class CheckFailed(Exception):
    """A correctness check failed (CLI exit code 1)."""


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def interruptible(main: Callable[..., int]) -> Callable[..., int]:
    """A command's `main` whose Ctrl-C or SIGTERM (a cancelled CI job) unwinds its work (temporary files go), says
    'interrupted' and returns 130."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)

    return wrapped
