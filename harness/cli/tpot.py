"""`harness tpot`: the model-shaped decode step (harness.tpot.cli), after the CLI's input checks."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from harness.cli.common import add_case_args, case_from, device_from, inputs_of

HELP = "time a model-shaped decode step (one TP rank) per strategy"


def command(args, console: Console) -> int:
    from harness.inputs.cases import refuse_clobbering
    from harness.tpot.cli import cmd_tpot as run_tpot

    device = device_from(args.device)
    case = case_from(args, device)
    table = [("the all-reduce table", Path(args.allreduce_table))] if args.allreduce_table not in (None, "none") else []
    workdir = [("--sglang-workdir", args.sglang_workdir)] if args.engine == "sglang" else []
    refuse_clobbering([("--json", args.json), *workdir], [*inputs_of(case), *table])
    return run_tpot(args, console, device, case)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_case_args(p)
    from harness.tpot.cli import add_tpot_args

    add_tpot_args(p)
