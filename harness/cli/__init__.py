"""`python -m harness`: run, golden refresh/verify, export-inputs, tpot, report, compare.

One module per command (its HELP, add_arguments and command: arguments -> api -> render); common.py what they share.

Exit codes: 0 pass, 1 a check failed, 2 bad input (one line naming the file/field), 130 interrupted (Ctrl-C or SIGTERM).
torch is imported only by the commands that compute (`--help` and argument errors stay fast).
"""

from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console

from harness import envvars
from harness.cli import compare, export, golden, report, run, tpot
from harness.cli.common import Formatter
from harness.errors import CheckFailed, HarnessError, interruptible, out_of_memory

# a host allocation the memory plan (free memory, /proc/meminfo) allowed failed: a limit on the process is lower
HOST_LIMIT = "a memory limit (ulimit -v, a container's) is below the free memory the plan saw; lower --slots or --layers"
COMMANDS = {"run": run, "golden": golden, "export-inputs": export, "tpot": tpot, "report": report, "compare": compare}


OUTPUT_OPTIONS = ("json", "out")  # the argparse dests of the file outputs a command can stream (--json /dev/stdout)


def writes_stdout(args) -> bool:
    """An output option names this process's standard output (`--json /dev/stdout`, a link to it): what it writes
    is for a machine, so the console (tables, progress, 'results written') must not go there too."""
    try:
        out = os.fstat(sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # no real stdout (closed, or a test's capture)
        return False
    for dest in OUTPUT_OPTIONS:
        path = getattr(args, dest, None)
        try:
            st = os.stat(path) if path is not None else None
        except OSError:  # not there yet: a file
            continue
        if st is not None and (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
            return True
    return False


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: the repro records the command line as typed, and finds its path options by their full names
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0], allow_abbrev=False,
                                     epilog="environment: MLA_HARNESS_GOLDEN_DIR sets the golden folder (else the checkout's golden/; --golden-dir wins)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=module.HELP, formatter_class=Formatter, allow_abbrev=False))
    return parser


def _check_unicode(argv: list[str]) -> None:
    """Every word that goes into a results file's repro (the arguments, PYTHONPATH, the interpreter) is Unicode text: a
    name of other bytes (surrogate-escaped by Python) would make every reader refuse the file as not text."""
    for word in argv:
        try:
            word.encode("utf-8")
        except UnicodeEncodeError:
            raise HarnessError(ascii(word), "not UTF-8 text: a results file records its command line as text; "
                                            "rename the file or folder") from None


@interruptible
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # for the results' repro command
    to_stderr = writes_stdout(args)
    console = Console(stderr=to_stderr, width=200 if not (sys.stderr if to_stderr else sys.stdout).isatty() else None)
    try:
        envvars.check_all(kinds=("path", "text", "flag", "int"))  # a bad variable fails before any work ("names" import their lists)
        if args.command in ("run", "tpot"):  # the commands whose results record a repro
            _check_unicode([*args.argv, os.environ.get("PYTHONPATH", ""), sys.executable])
        if getattr(args, "golden_dir", None) is not None:
            from harness.inputs.cases import golden_dir, use_golden_dir

            use_golden_dir(args.golden_dir)
            golden_dir()  # a folder that is not there fails here, before any work
        return COMMANDS[args.command].command(args, console)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CheckFailed as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc.filename or 'output'}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if (which := out_of_memory(exc)) is None:
            raise
        said = (str(exc).splitlines() or [""])[0]
        if which == "host":  # the limit that refused it, after torch's own words where it has any
            said = f"{said} ({HOST_LIMIT})" if said else HOST_LIMIT
        print(f"error: out of {which} memory: {said}", file=sys.stderr)
        return 2
