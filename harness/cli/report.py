"""`harness report`: tables and plots from results files."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from harness.fsio import refuse_idle_force

HELP = "render tables and plots from results JSON files"


def command(args, console: Console) -> int:
    from harness.inputs.cases import refuse_clobbering
    from harness.render.report import REPORT_FILES, check_out_dir, render_report

    refuse_idle_force(args.force, ("--out", args.out))
    if args.out is not None:
        refuse_clobbering([("--out", args.out), *(("--out", args.out / name) for name in REPORT_FILES)],
                           [("the results file", path) for path in args.results])
        check_out_dir(args.out, args.force)
    render_report(args.results, args.out, console)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", type=Path, nargs="+")
    p.add_argument("--out", type=Path, help="folder for report.md and plots (new or empty, unless --force)")
    p.add_argument("--force", action="store_true", help="--out: write into a folder that already holds files (replacing files of the names the report writes)")
