"""`harness report`: tables and plots from results files."""

from __future__ import annotations

from rich.console import Console

from harness.cli.common import refuse_clobbering


def cmd_report(args, console: Console) -> int:
    from harness.render.report import REPORT_FILES, check_out_dir, render_report

    if args.out is not None:
        refuse_clobbering([("--out", args.out), *(("--out", args.out / name) for name in REPORT_FILES)],
                           [("the results file", path) for path in args.results])
        check_out_dir(args.out, args.force)
    render_report(args.results, args.out, console)
    return 0
