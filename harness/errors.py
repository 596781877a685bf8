"""The one error type the CLI turns into a single line and exit code 2, the check failure (exit 1), and SIGTERM as an
interruption (exit 130)."""

import contextlib
import signal


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


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Inside, SIGTERM (a cancelled CI job) unwinds like Ctrl-C (KeyboardInterrupt): temporary files go, and the command
    that catches it says 'interrupted' and exits 130."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
