"""`harness compare`: gate two results files (harness.gate.compare)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

HELP = "compare two results JSON files; exit 1 on regression"


def command(args, console: Console) -> int:
    from harness.gate.compare import main_compare

    return main_compare(args.base, args.head, args.max_regression, args.inconclusive)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", type=Path)
    p.add_argument("head", type=Path)
    p.add_argument("--max-regression", default="5%", help="tolerance: a gating metric regresses when its whole 99%% CI lies beyond it (default 5%%)")
    p.add_argument("--inconclusive", choices=("pass", "fail"), default="pass",
                   help="what an inconclusive gating metric does: pass (loud line, exit 0; the default) or fail (exit 1); "
                        "a clock-disturbed or undersampled one is exit 2 either way")
