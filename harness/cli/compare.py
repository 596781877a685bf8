"""`harness compare`: gate two results files (harness.gate.compare)."""

from __future__ import annotations

from rich.console import Console


def cmd_compare(args, console: Console) -> int:
    from harness.gate.compare import main_compare

    return main_compare(args.base, args.head, args.max_regression, args.inconclusive)
