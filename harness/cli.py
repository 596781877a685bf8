"""`python -m harness`: run, golden refresh/verify, export-inputs, tpot, report, compare.

Exit codes: 0 pass, 1 a check failed, 2 bad input (one line naming the file/field).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from rich.console import Console

from harness.errors import CheckFailed, HarnessError


def _device(text: str) -> torch.device:
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise HarnessError("--device", f"not a device: {text!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HarnessError("--device", "CUDA requested but no CUDA GPU is visible")
    if device.type not in ("cpu", "cuda"):
        raise HarnessError("--device", f"unsupported device type {device.type!r}")
    if device.type == "cuda":
        if (device.index or 0) >= torch.cuda.device_count():
            raise HarnessError("--device", f"{device} does not exist: {torch.cuda.device_count()} CUDA device(s) visible")
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)  # kernels launched without an explicit device go here too
    return device


def _writable_dir(flag: str, folder: Path) -> None:
    """Fail before any work when an output folder cannot be created."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HarnessError(flag, f"cannot create {folder} ({exc.strerror})") from None


def _add_case_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="glm5-tp8", help="model preset (glm5-tp8, deepseek-v3-tp8)")
    p.add_argument("--scale", default=None, help="pool scale: prod (495,552 slots) or ci; default prod on CUDA, ci on CPU")
    p.add_argument("--slots", type=int, default=None, help="override the scale's slot count")
    p.add_argument("--layers", type=int, default=None, help="override the number of layers materialized")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--scenario", default=None, help="built-in scenario name (default b1-l4096)")
    g.add_argument("--scenario-file", type=Path, default=None, help="a scenario TOML file")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")


def _case(args, device: torch.device):
    from harness.cases import Case
    from harness.presets import get_preset, get_scale
    from harness.scenario import load_scenario, load_scenario_file

    scale_name = args.scale or ("prod" if device.type == "cuda" else "ci")
    scenario = load_scenario_file(args.scenario_file) if args.scenario_file else load_scenario(args.scenario or "b1-l4096")
    return Case(get_preset(args.preset), get_scale(scale_name, args.slots, args.layers), scenario)


def cmd_run(args, console: Console) -> int:
    from harness.faults import parse_faults
    from harness.results import environment, repro_command, write_results
    from harness.runner import RunConfig, run, to_rows
    from harness.strategies import ORDER, REGISTRY
    from harness.table import results_table

    device = _device(args.device)
    case = _case(args, device)
    strategies = tuple(dict.fromkeys(args.strategy)) if args.strategy else ORDER
    for name in strategies:
        if name not in REGISTRY:
            raise HarnessError("--strategy", f"unknown strategy {name!r}; choose from {', '.join(ORDER)}")
    repeats = args.repeats if args.repeats is not None else (40 if device.type == "cuda" else 5)
    if repeats < 0:
        raise HarnessError("--repeats", f"must be >= 0, got {repeats}")
    if args.json:
        _writable_dir("--json", args.json.parent)
    if args.dump_outputs:
        _writable_dir("--dump-outputs", args.dump_outputs)
    cfg = RunConfig(
        case=case, device=device, backend=args.backend, strategies=strategies, faults=parse_faults(args.plant_fault),
        repeats=repeats, reference=args.reference, dump_outputs=args.dump_outputs,
    )
    console.print(f"case {case.name} on {device} ({case.scale.slots:,} slots, {case.num_layers} layers)")
    outcome = run(cfg, console)
    console.print(results_table(f"{case.name} · backend {outcome.backend}", outcome.results))
    if args.json:
        env = environment(device)
        if device.type == "cuda":
            from harness.timing import copy_bandwidth_gbps

            env["copy_gbps"] = copy_bandwidth_gbps(device)
        write_results(args.json, to_rows(case, outcome), env, repro_command())
        console.print(f"results written to {args.json}")
    failed = [r.strategy for r in outcome.results if r.verdict.status.value in ("fail", "error")]
    if failed:
        raise CheckFailed(f"check failed: {', '.join(failed)}")
    return 0


def cmd_golden(args, console: Console) -> int:
    from harness import golden
    from harness.cases import golden_case_names, load_case
    from harness.progress import progress_bar

    names = [args.case] if args.case else golden_case_names()
    cases = [load_case(n) for n in names]
    failures = []
    for case in cases:
        t0 = time.perf_counter()
        n = len(case.checked_layers()) * case.scenario.steps
        if args.action == "verify":
            stored = golden.load(case.name)
            with progress_bar(console, f"verify {case.name}", n) as advance:
                fresh = golden.compute(case, progress=advance)
            changes = golden.differences(stored, fresh)
            status = "[green]ok[/]" if not changes else "[bold red]MISMATCH[/]"
        else:
            with progress_bar(console, f"refresh {case.name}", n) as advance:
                fresh = golden.compute(case, progress=advance)
            if not (golden.case_dir(case.name) / golden.MANIFEST).exists():
                stored = None
            else:
                try:
                    stored = golden.load(case.name)
                except HarnessError as exc:
                    if not args.force:
                        raise HarnessError(exc.where, f"{exc.message}; not overwritten (refresh --force replaces it)") from None
                    stored = golden.GoldenData({}, {})
            changes = golden.differences(stored, fresh) if stored is not None else []
            if stored is None:
                golden.write(fresh, case.name)
                status = "[green]written[/] (new case)"
            elif not changes:
                status = "[green]unchanged[/]"
            elif args.force:
                golden.write(fresh, case.name)
                status = "[yellow]overwritten (--force)[/]"
                changes = []
            else:
                status = "[bold red]CHANGED, not written (use --force)[/]"
        console.print(f"{case.name}: {status} in {time.perf_counter() - t0:.1f}s")
        for change in changes:
            console.print(f"  {change}")
        if changes:
            failures.append(case.name)
    if failures:
        raise CheckFailed(f"golden {args.action}: {len(failures)} case(s) differ: {', '.join(failures)}")
    return 0


def cmd_export_inputs(args, console: Console) -> int:
    from harness.export import export_inputs

    case = _case(args, _device(args.device))  # the same default scale as `run` on this machine
    _writable_dir("--out", args.out.parent)
    path = export_inputs(case, args.step, args.layer, args.out)
    console.print(f"wrote {path}")
    return 0


def cmd_tpot(args, console: Console) -> int:
    from harness.model.cli import cmd_tpot as run_tpot

    device = _device(args.device)
    return run_tpot(args, console, device, _case(args, device))


def cmd_report(args, console: Console) -> int:
    from harness.report import render_report

    render_report(args.results, args.out, console)
    return 0


def cmd_compare(args, console: Console) -> int:
    from harness.compare import main_compare

    return main_compare(args.base, args.head, args.max_regression)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run every strategy on one case, check against golden, time")
    _add_case_args(p)
    p.add_argument("--backend", default="auto", help="auto (flashinfer on CUDA, torch on CPU), torch, flashinfer")
    p.add_argument("--strategy", action="append", help="run only this strategy (repeatable)")
    p.add_argument("--repeats", type=int, default=None, help="timing samples per metric (default 40 on CUDA, 5 on CPU; 0: no timing)")
    p.add_argument("--reference", choices=("auto", "golden", "live"), default="auto")
    p.add_argument("--plant-fault", action="append", help="plant a fault (negative control); repeatable")
    p.add_argument("--json", type=Path, help="write results JSON here")
    p.add_argument("--dump-outputs", type=Path, help="write each strategy's outputs as safetensors into this folder")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("golden", help="golden files: refresh or verify")
    p.add_argument("action", choices=("refresh", "verify"))
    p.add_argument("--case", help="one case '<preset>.<scale>.<scenario>' (default: all in golden/cases.toml)")
    p.add_argument("--force", action="store_true", help="refresh: overwrite goldens that changed")
    p.set_defaults(func=cmd_golden)

    p = sub.add_parser("export-inputs", help="write the rows, indices and queries one step reads (repro bundle)")
    _add_case_args(p)
    p.add_argument("--step", type=int, default=0)
    p.add_argument("--layer", type=int, action="append", help="layer(s) to export (default: 0)")
    p.add_argument("--out", type=Path, required=True, help="output .safetensors file")
    p.set_defaults(func=cmd_export_inputs)

    p = sub.add_parser("tpot", help="time a model-shaped decode step (one TP rank) per strategy")
    _add_case_args(p)
    from harness.model.cli import add_tpot_args

    add_tpot_args(p)
    p.set_defaults(func=cmd_tpot)

    p = sub.add_parser("report", help="render tables and plots from results JSON files")
    p.add_argument("results", type=Path, nargs="+")
    p.add_argument("--out", type=Path, help="folder for report.md and plots")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("compare", help="compare two results JSON files; exit 1 on regression")
    p.add_argument("base", type=Path)
    p.add_argument("head", type=Path)
    p.add_argument("--max-regression", default="10%")
    p.set_defaults(func=cmd_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(stderr=False, width=200 if not sys.stdout.isatty() else None)
    try:
        return args.func(args, console)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CheckFailed as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    except torch.cuda.OutOfMemoryError as exc:
        print(f"error: out of GPU memory: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc.filename or 'output'}: {exc.strerror or exc}", file=sys.stderr)
        return 2
