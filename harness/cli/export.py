"""`harness export-inputs`: the rows, indices and queries one step reads, as safetensors."""

from __future__ import annotations

from rich.console import Console

from harness.cli.common import case_from, device_from, inputs_of, refuse_clobbering
from harness.errors import HarnessError
from harness.fsio import check_writable


def cmd_export_inputs(args, console: Console) -> int:
    from harness.inputs.export import export_inputs

    if args.out.suffix != ".safetensors":
        raise HarnessError("--out", f"must end in .safetensors, got {args.out.name!r}")
    case = case_from(args, device_from(args.device), console)  # the same default scale as `run` on this machine
    refuse_clobbering([("--out", args.out)], inputs_of(case))
    check_writable(args.out, "--out")
    path = export_inputs(case, args.step, args.layer, args.out)
    console.print(f"wrote {path}")
    return 0
