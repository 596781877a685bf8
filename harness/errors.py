"""The one error type the CLI turns into a single line and exit code 2, the check failure (exit 1), and Ctrl-C or SIGTERM as
an interruption (exit 130)."""

import functools
import signal
import sys
from typing import Callable

_signalled = False  # a Ctrl-C or SIGTERM arrived and is not yet reported: code that catches the KeyboardInterrupt it raises
# (torch's C extension, interrupted while it imports numpy) does not make the run finish as if none had


class HarnessError(Exception):
    """Bad input or an impossible request: `where` names the file/field at fault."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


class CheckFailed(Exception):
    """A correctness check failed (CLI exit code 1)."""


def out_of_memory(exc: BaseException) -> str | None:
    """'GPU' or 'host' when `exc` says that memory ran out (torch.cuda.OutOfMemoryError, MemoryError, the c10::Error of
    torch's host allocator): an impossible size for this machine, reported as bad input, never a strategy's red
    verdict; else None. By type name: no torch import."""
    if type(exc).__name__ == "OutOfMemoryError":
        return "GPU"
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)):
        return "host"
    return None


def _interrupt(signum, frame):
    global _signalled
    _signalled = True
    raise KeyboardInterrupt


def check_interrupted() -> None:
    """KeyboardInterrupt when a Ctrl-C or SIGTERM arrived, even one something caught: called before results are put
    on disk."""
    if _signalled:
        raise KeyboardInterrupt


def interruptible(main: Callable[..., int]) -> Callable[..., int]:
    """A command's `main` whose Ctrl-C or SIGTERM (a cancelled CI job) unwinds its work (temporary files go), says
    'interrupted' and returns 130: also when the KeyboardInterrupt was caught, or turned into another error, on the way."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        global _signalled
        previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _interrupt)}
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # an ignored Ctrl-C (a background job) stays so
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, _interrupt)
        interrupted = False
        try:
            code = main(*args, **kwargs)
        except BaseException as exc:
            if not (_signalled or isinstance(exc, KeyboardInterrupt)):
                raise
            interrupted = True
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if not (interrupted or _signalled):
            return code
        _signalled = False  # reported: an enclosing interruptible main returns this 130 without a second line
        print("interrupted", file=sys.stderr)
        return 130

    return wrapped
