"""`harness export-inputs`: the rows, indices and queries one step reads, as safetensors."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from harness.cli.common import add_case_args, case_from, device_from, inputs_of
from harness.errors import HarnessError
from harness.fsio import check_writable

HELP = "write the rows, indices and queries one step reads (repro bundle)"


def command(args, console: Console) -> int:
    from harness.inputs.cases import refuse_clobbering
    from harness.inputs.export import export_inputs
    from harness.measure.environment import environment
    from harness.results.document import pin_case, repro_command

    if args.out.suffix != ".safetensors":
        raise HarnessError("--out", f"must end in .safetensors, got {args.out.name!r}")
    device = device_from(args.device)
    case = case_from(args, device, console, pool=False)  # the same default scale as `run` on this machine; no pool is built
    refuse_clobbering([("--out", args.out)], inputs_of(case))
    check_writable(args.out, "--out", args.force)
    path = export_inputs(case, args.step, args.layer, args.out, repro_command(pin_case(args.argv, device, case)), environment(device))
    console.print(f"wrote {path}", markup=False)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_case_args(p)
    p.add_argument("--step", type=int, default=0, help="decode step of the scenario's schedule (default 0)")
    p.add_argument("--layer", type=int, action="append", help="layer(s) to export (default: 0)")
    p.add_argument("--out", type=Path, required=True, help="output .safetensors file")
    p.add_argument("--force", action="store_true", help="replace --out when it already exists (else exit 2)")
