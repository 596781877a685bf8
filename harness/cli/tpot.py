"""`harness tpot`: the model-shaped decode step (harness.tpot.cli), after the CLI's input checks."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from rich.console import Console

from harness.cli.common import add_case_args, case_from, device_from, inputs_of

HELP = "time a model-shaped decode step (one TP rank) per strategy"


def command(args, console: Console) -> int:
    from harness.fsio import refuse_overwriting_inputs
    from harness.inputs.cases import refuse_clobbering
    from harness.tpot.allreduce import DEFAULT_TABLE
    from harness.tpot.cli import cmd_tpot as run_tpot
    from harness.tpot.config import MODELS_FILE

    device = device_from(args.device)
    case = case_from(args, device, console)  # a CPU pool grown to fit the scenario is said, as run and export-inputs say it
    table = [("the all-reduce table", Path(args.allreduce_table))] if args.allreduce_table not in (None, "none") else []
    own = [("the model table", MODELS_FILE), ("the default all-reduce table", DEFAULT_TABLE)]
    workdir, python = [], []
    if args.engine == "sglang":
        workdir = [("--sglang-workdir", args.sglang_workdir)]
        python = [("--sglang-python", Path(shutil.which(args.sglang_python) or args.sglang_python))]
        if args.json:  # the driver's folder: its files are replaced there
            refuse_overwriting_inputs([("--json", args.json)], [], [("--sglang-workdir", args.sglang_workdir)])
    refuse_clobbering([("--json", args.json), *workdir], [*inputs_of(case), *table, *own, *python])
    return run_tpot(args, console, device, case)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_case_args(p)
    from harness.tpot.cli import add_tpot_args

    add_tpot_args(p)
