"""`python -m harness`: run, golden refresh/verify, export-inputs, tpot, report, compare (one module per command).

Exit codes: 0 pass, 1 a check failed, 2 bad input (one line naming the file/field), 130 interrupted.
torch is imported only by the commands that compute (`--help` and argument errors stay fast).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from harness.backends import BACKENDS, KERNEL_CHOICES
from harness.cli import compare, export, golden, report, run, tpot
from harness.cli.common import Formatter, LazyHelp, add_case_args, fault_help, strategy_help
from harness.errors import CheckFailed, HarnessError

COMMANDS = {"run": run.cmd_run, "golden": golden.cmd_golden, "export-inputs": export.cmd_export_inputs, "tpot": tpot.cmd_tpot,
            "report": report.cmd_report, "compare": compare.cmd_compare}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0],
                                     epilog="environment: MLA_HARNESS_GOLDEN_DIR sets the golden folder (else the checkout's golden/; --golden-dir wins)")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, **kwargs):
        return sub.add_parser(name, formatter_class=Formatter, **kwargs)

    p = add("run", help="run every strategy on one case, check against golden, time")
    add_case_args(p)
    p.add_argument("--backend", default="auto", help=f"{', '.join(BACKENDS)} (auto: flashinfer on CUDA, torch on CPU)")
    p.add_argument("--kernel", choices=KERNEL_CHOICES, default="auto",
                   help="FlashInfer kernel: auto (the arch policy: fa3 on SM90, fa2 on SM120), or force fa3/fa2 "
                        "(fa2 on an H200 runs the kernel SGLang picks on SM120)")
    p.add_argument("--strategy", action="append", help=LazyHelp(strategy_help))
    p.add_argument("--repeats", type=int, default=None, help="timing samples per metric (default 40 on CUDA, 5 on CPU; 0: no timing)")
    p.add_argument("--reference", choices=("auto", "golden", "live"), default="auto",
                   help="golden: the case's golden file; live: a float64 reference computed now; auto: golden when one matches")
    p.add_argument("--plant-fault", action="append", help=LazyHelp(fault_help))
    p.add_argument("--json", type=Path, help="write results JSON here")
    p.add_argument("--dump-outputs", type=Path, help="write each strategy's outputs as safetensors into this folder")
    p.add_argument("--golden-dir", type=Path, help="golden folder (default: $MLA_HARNESS_GOLDEN_DIR, else the checkout's golden/)")
    p.set_defaults(command_name='run')

    p = add("golden", help="golden files: refresh or verify")
    p.add_argument("action", choices=("refresh", "verify"))
    p.add_argument("--case", help="one case '<preset>.<scale>.<scenario>' (default: all in golden/cases.toml)")
    p.add_argument("--force", action="store_true", help="refresh: overwrite goldens that changed")
    p.add_argument("--golden-dir", type=Path, help="golden folder (default: $MLA_HARNESS_GOLDEN_DIR, else the checkout's golden/)")
    p.set_defaults(command_name='golden')

    p = add("export-inputs", help="write the rows, indices and queries one step reads (repro bundle)")
    add_case_args(p)
    p.add_argument("--step", type=int, default=0)
    p.add_argument("--layer", type=int, action="append", help="layer(s) to export (default: 0)")
    p.add_argument("--out", type=Path, required=True, help="output .safetensors file")
    p.set_defaults(command_name='export-inputs')

    p = add("tpot", help="time a model-shaped decode step (one TP rank) per strategy")
    add_case_args(p)
    from harness.tpot.cli import add_tpot_args

    add_tpot_args(p)
    p.set_defaults(command_name='tpot')

    p = add("report", help="render tables and plots from results JSON files")
    p.add_argument("results", type=Path, nargs="+")
    p.add_argument("--out", type=Path, help="folder for report.md and plots (new or empty, unless --force)")
    p.add_argument("--force", action="store_true", help="--out: write into a folder that already holds files")
    p.set_defaults(command_name='report')

    p = add("compare", help="compare two results JSON files; exit 1 on regression")
    p.add_argument("base", type=Path)
    p.add_argument("head", type=Path)
    p.add_argument("--max-regression", default="5%", help="tolerance: a gating metric regresses when its whole 99%% CI lies beyond it")
    p.add_argument("--inconclusive", choices=("pass", "fail"), default="pass",
                   help="what an inconclusive or clock-disturbed gating metric does: pass (loud line, exit 0) or fail (exit 1)")
    p.set_defaults(command_name='compare')
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # for the results' repro command
    console = Console(stderr=False, width=200 if not sys.stdout.isatty() else None)
    try:
        if getattr(args, "golden_dir", None) is not None:
            from harness.inputs.cases import use_golden_dir

            use_golden_dir(args.golden_dir)
        return COMMANDS[args.command_name](args, console)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
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
        if type(exc).__name__ != "OutOfMemoryError":  # torch.cuda.OutOfMemoryError, without importing torch
            raise
        print(f"error: out of GPU memory: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
