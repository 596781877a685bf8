"""`python -m harness`: run, golden refresh/verify, export-inputs, tpot, report, compare.

Exit codes: 0 pass, 1 a check failed, 2 bad input (one line naming the file/field), 130 interrupted.
torch is imported only by the commands that compute (`--help` and argument errors stay fast).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from rich.console import Console

from harness.backends import BACKENDS, KERNEL_CHOICES
from harness.errors import CheckFailed, HarnessError
from harness.fsio import check_writable, check_writable_dir

HOST_MEMORY_PER_SLOT = 64  # bytes of host memory the schedule's free list takes per pool slot


class LazyHelp(str):
    """A help text computed only when help is printed (listing names must not import torch)."""

    def __new__(cls, render):
        obj = super().__new__(cls, "(computed)")
        obj.render = render
        return obj


class _Formatter(argparse.HelpFormatter):
    def _get_help_string(self, action):
        return action.help.render() if isinstance(action.help, LazyHelp) else action.help


def strategy_names() -> list[str]:
    """The registered strategies in run order, read from the @register(...) calls of their modules
    (importing the registry imports torch, which `--help` must not)."""
    import ast

    found = []
    for path in (Path(__file__).parent / "strategies").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register" and node.args:
                order = next((k.value.value for k in node.keywords if k.arg == "order"), float("inf"))
                found.append((order, node.args[0].value))
    return [name for _, name in sorted(found)]


def _strategy_help() -> str:
    return f"run only this strategy (repeatable): {', '.join(strategy_names())}"


def _preset_help() -> str:
    from harness.spec.presets import PRESETS

    return f"model preset (default glm5-tp8): {', '.join(PRESETS)}"


def _scenario_help() -> str:
    from harness.spec.scenario import builtin_names

    return f"built-in scenario (default b1-l4096): {', '.join(builtin_names())}"


def _fault_help() -> str:
    from harness.spec.faults import Fault

    return f"plant a fault (negative control; repeatable): {', '.join(f.value for f in Fault)}"


def _device(text: str):
    import torch

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


def _add_case_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="glm5-tp8", help=LazyHelp(_preset_help))
    p.add_argument("--scale", default=None, help="pool scale: prod (495,552 slots) or ci; default prod on CUDA, ci on CPU")
    p.add_argument("--slots", type=int, default=None, help="override the scale's slot count")
    p.add_argument("--layers", type=int, default=None, help="override the number of layers materialized")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--scenario", default=None, help=LazyHelp(_scenario_help))
    g.add_argument("--scenario-file", type=Path, default=None, help="a scenario TOML file")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")


def _case(args, device, console: Console | None = None):
    """The case to run. On the default CPU scale a scenario larger than its pool gets a pool that
    fits (said on the console); the pool must fit host memory before its free list is built."""
    import torch

    from harness.inputs.cases import Case
    from harness.inputs.memory import MemoryPlan
    from harness.spec.presets import get_preset, get_scale
    from harness.spec.scenario import load_scenario, load_scenario_file
    from harness.spec.schedule import pages_needed, slots_needed

    scale_name = args.scale or ("prod" if device.type == "cuda" else "ci")
    scenario = load_scenario_file(args.scenario_file) if args.scenario_file else load_scenario(args.scenario or "b1-l4096")
    preset, scale = get_preset(args.preset), get_scale(scale_name, args.slots, args.layers)
    if scale.layers_for(preset) > preset.num_layers:
        raise HarnessError("--layers", f"must be <= {preset.num_layers} ({preset.name}'s layers), got {scale.layers_for(preset):,}")
    need = max(slots_needed(scenario), pages_needed(scenario, preset.page_size) * preset.page_size)  # whole pages
    if need > scale.slots and args.scale is None and args.slots is None and device.type == "cpu":
        scale = get_scale(scale_name, need, args.layers)
        if console is not None:
            console.print(f"[yellow]{scenario.name} needs {need:,} slots: the {scale_name} pool grows to {need:,} (--slots {need})[/]")
    case = Case(preset, scale, scenario)
    row_bytes = case.num_layers * preset.row_width
    host_per_slot = row_bytes * (device.type == "cpu") + HOST_MEMORY_PER_SLOT
    MemoryPlan((("pool and free list in host memory", host_per_slot * scale.slots),), host_per_slot, scale.slots).check(torch.device("cpu"))
    MemoryPlan((("fp8 pool", row_bytes * scale.slots),), row_bytes, scale.slots).check(device)
    return case


def _golden_folders() -> list[Path]:
    """The golden folders no output may go into: the configured one and the checkout's."""
    from harness.inputs.cases import CHECKOUT_GOLDEN_DIR, golden_dir

    folders = [CHECKOUT_GOLDEN_DIR]
    try:
        folders.append(golden_dir())
    except HarnessError:  # none configured: the commands that read goldens say so themselves
        pass
    return [f for f in dict.fromkeys(folders) if f.is_dir()]


def _inputs_of(case) -> list[tuple[str, Path]]:
    return [("the scenario file", Path(case.scenario.source))] if case.scenario.source else []


def _refuse_clobbering(outputs, inputs) -> None:
    """Before any work: no output (option, path) may be an input, a golden file, or inside a golden
    folder (only `golden refresh` writes there). Options not given (None) are skipped."""
    from harness.fsio import refuse_overwriting_inputs

    folders = _golden_folders()
    golden_files = [("the golden file", p) for g in folders for p in (*g.glob("*"), *g.glob("*/*")) if p.is_file()]
    refuse_overwriting_inputs([(flag, path) for flag, path in outputs if path is not None], [*inputs, *golden_files],
                              [("the golden folder", g) for g in folders])


def cmd_run(args, console: Console) -> int:
    from harness.api import RunConfig, run, to_rows
    from harness.measure.environment import environment
    from harness.render.table import results_table
    from harness.results.document import case_record, repro_command, write_results
    from harness.spec.faults import parse_faults
    from harness.spec.scenario import check_repeats
    from harness.strategies import BASELINE, RUN_DEFAULT
    from harness.strategies import select as select_strategies
    from harness.verify.negative_controls import cannot_fire, did_not_fire

    device = _device(args.device)
    strategies = select_strategies(args.strategy, RUN_DEFAULT)
    repeats = args.repeats if args.repeats is not None else (40 if device.type == "cuda" else 5)
    check_repeats("--repeats", repeats, 0)
    faults = parse_faults(args.plant_fault)
    case = _case(args, device, console)
    dumps = [args.dump_outputs / f"{case.name}.{name}.safetensors" for name in dict.fromkeys((BASELINE, *strategies))] if args.dump_outputs else []
    _refuse_clobbering([("--json", args.json), ("--dump-outputs", args.dump_outputs), *(("--dump-outputs", d) for d in dumps)], _inputs_of(case))
    if args.json:
        check_writable(args.json, "--json")
    if args.dump_outputs:
        check_writable_dir(args.dump_outputs, "--dump-outputs")
        for path in dumps:
            check_writable(path, "--dump-outputs")
    cannot_fire(faults, strategies, case)
    cfg = RunConfig(
        case=case, device=device, backend=args.backend, kernel=args.kernel, strategies=strategies, faults=faults,
        repeats=repeats, reference=args.reference, dump_outputs=args.dump_outputs,
    )
    console.print(f"case {case.name} on {device} ({case.scale.slots:,} slots, {case.num_layers} layers)")
    outcome = run(cfg, console)
    console.print(results_table(f"{case.name} · backend {outcome.backend}", outcome.results,
                                host_timed=device.type != "cuda", width=console.width))
    did_not_fire(faults, outcome.results)
    if args.json:
        from harness.measure.control import control_row
        from harness.results import roofline

        ident = dict(preset=case.preset.name, scale=case.scale.name, scenario=case.scenario.name, backend=outcome.backend)
        control = control_row(ident, device)
        env = environment(device)
        if device.type == "cuda":
            env["copy_gbps"] = control.value  # the device copy bandwidth the control just measured
        rows = to_rows(case, outcome) + roofline.rows(case, outcome, env.get("copy_gbps")) + [control]
        write_results(args.json, rows, env, repro_command(args.argv), case_record(case, outcome.backend, args.kernel))
        console.print(f"results written to {args.json}")
    failed = [r.strategy for r in outcome.results if r.verdict.status.value in ("fail", "error")]
    ran = [r.strategy for r in outcome.results if r.strategy in strategies and r.verdict.status.value == "pass"]
    console.print(_summary(outcome.results, 1 if failed or not ran else 0, args), markup=False, highlight=False)
    if failed:
        raise CheckFailed(f"check failed: {', '.join(failed)}")
    if not ran:
        raise CheckFailed(f"nothing requested was checked: {', '.join(strategies)} cannot run on {device}")
    return 0


def _summary(results, code: int, args) -> str:
    """The run's last line: verdict counts, the exit code, where the results went."""
    counts = Counter(r.verdict.status.value for r in results)
    written = ", ".join(f"{flag} {path}" for flag, path in (("--json", args.json), ("--dump-outputs", args.dump_outputs)) if path)
    return (f"summary: {counts['pass']} pass, {counts['fail']} fail, {counts['unsupported']} unsupported, "
            f"{counts['error']} error; exit {code}; results: {written or 'not written (no --json)'}")


def cmd_golden(args, console: Console) -> int:
    """Every case is checked: an unreadable one does not stop the others (the exit-2 line names the first)."""
    from harness.inputs.cases import golden_case_names, load_case
    from harness.progress import progress_bar
    from harness.verify import golden

    names = [args.case] if args.case else golden_case_names()
    cases = [load_case(n) for n in names]
    failures, unreadable = [], []
    for case in cases:
        for name in golden.clean_leftovers(case.name):
            console.print(f"{case.name}: removed {name}, left by a killed refresh", markup=False, highlight=False)
        t0 = time.perf_counter()
        n = len(case.checked_layers()) * case.scenario.steps
        if args.action == "verify":
            try:
                stored = golden.load(case.name)
            except HarnessError as exc:
                unreadable.append(_unreadable(console, case.name, exc))
                continue
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
                        kept = HarnessError(exc.where, f"{exc.message}; not overwritten (refresh --force replaces it)")
                        unreadable.append(_unreadable(console, case.name, kept))
                        continue
                    stored = golden.GoldenData({}, {})
            changes = golden.differences(stored, fresh) if stored is not None else []
            if stored is None:
                golden.write(fresh, case.name)
                status = "[green]written[/] (new case)"
            elif not changes:
                status = "[green]unchanged[/]"
            elif args.force:
                golden.write(fresh, case.name)
                status = "[yellow]overwritten (--force)[/]; what changed:"
                for change in changes:
                    status += f"\n  {change}"
                changes = []
            else:
                status = "[bold red]CHANGED, not written (use --force)[/]"
        console.print(f"{case.name}: {status} in {time.perf_counter() - t0:.1f}s")
        for change in changes:
            console.print(f"  {change}")
        if changes:
            failures.append(case.name)
            console.print(f"  {golden.write_obtained(case.name, Path(golden.OUTPUTS).stem, fresh.tensors)}", markup=False,
                          highlight=False, soft_wrap=True)
    if unreadable:
        first, more = unreadable[0], len(unreadable) - 1
        also = [f"{more} more unreadable"] * bool(more) + [f"{len(failures)} differ"] * bool(failures)
        raise HarnessError(first.where, first.message + (f" (also {' and '.join(also)}: listed above)" if also else ""))
    if failures:
        raise CheckFailed(f"golden {args.action}: {len(failures)} case(s) differ: {', '.join(failures)}")
    return 0


def _unreadable(console: Console, case_name: str, exc: HarnessError) -> HarnessError:
    console.print(f"{case_name}: UNREADABLE: {exc}", markup=False, highlight=False)
    return exc


def cmd_export_inputs(args, console: Console) -> int:
    from harness.inputs.export import export_inputs

    if args.out.suffix != ".safetensors":
        raise HarnessError("--out", f"must end in .safetensors, got {args.out.name!r}")
    case = _case(args, _device(args.device), console)  # the same default scale as `run` on this machine
    _refuse_clobbering([("--out", args.out)], _inputs_of(case))
    check_writable(args.out, "--out")
    path = export_inputs(case, args.step, args.layer, args.out)
    console.print(f"wrote {path}")
    return 0


def cmd_tpot(args, console: Console) -> int:
    from harness.tpot.cli import cmd_tpot as run_tpot

    device = _device(args.device)
    case = _case(args, device)
    table = [("the all-reduce table", Path(args.allreduce_table))] if args.allreduce_table not in (None, "none") else []
    workdir = [("--sglang-workdir", args.sglang_workdir)] if args.engine == "sglang" else []
    _refuse_clobbering([("--json", args.json), *workdir], [*_inputs_of(case), *table])
    return run_tpot(args, console, device, case)


def cmd_report(args, console: Console) -> int:
    from harness.render.report import REPORT_FILES, check_out_dir, render_report

    if args.out is not None:
        _refuse_clobbering([("--out", args.out), *(("--out", args.out / name) for name in REPORT_FILES)],
                           [("the results file", path) for path in args.results])
        check_out_dir(args.out, args.force)
    render_report(args.results, args.out, console)
    return 0


def cmd_compare(args, console: Console) -> int:
    from harness.gate.compare import main_compare

    return main_compare(args.base, args.head, args.max_regression, args.inconclusive)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0],
                                     epilog="environment: MLA_HARNESS_GOLDEN_DIR sets the golden folder (else the checkout's golden/; --golden-dir wins)")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, **kwargs):
        return sub.add_parser(name, formatter_class=_Formatter, **kwargs)

    p = add("run", help="run every strategy on one case, check against golden, time")
    _add_case_args(p)
    p.add_argument("--backend", default="auto", help=f"{', '.join(BACKENDS)} (auto: flashinfer on CUDA, torch on CPU)")
    p.add_argument("--kernel", choices=KERNEL_CHOICES, default="auto",
                   help="FlashInfer kernel: auto (the arch policy: fa3 on SM90, fa2 on SM120), or force fa3/fa2 "
                        "(fa2 on an H200 runs the kernel SGLang picks on SM120)")
    p.add_argument("--strategy", action="append", help=LazyHelp(_strategy_help))
    p.add_argument("--repeats", type=int, default=None, help="timing samples per metric (default 40 on CUDA, 5 on CPU; 0: no timing)")
    p.add_argument("--reference", choices=("auto", "golden", "live"), default="auto",
                   help="golden: the case's golden file; live: a float64 reference computed now; auto: golden when one matches")
    p.add_argument("--plant-fault", action="append", help=LazyHelp(_fault_help))
    p.add_argument("--json", type=Path, help="write results JSON here")
    p.add_argument("--dump-outputs", type=Path, help="write each strategy's outputs as safetensors into this folder")
    p.add_argument("--golden-dir", type=Path, help="golden folder (default: $MLA_HARNESS_GOLDEN_DIR, else the checkout's golden/)")
    p.set_defaults(func=cmd_run)

    p = add("golden", help="golden files: refresh or verify")
    p.add_argument("action", choices=("refresh", "verify"))
    p.add_argument("--case", help="one case '<preset>.<scale>.<scenario>' (default: all in golden/cases.toml)")
    p.add_argument("--force", action="store_true", help="refresh: overwrite goldens that changed")
    p.add_argument("--golden-dir", type=Path, help="golden folder (default: $MLA_HARNESS_GOLDEN_DIR, else the checkout's golden/)")
    p.set_defaults(func=cmd_golden)

    p = add("export-inputs", help="write the rows, indices and queries one step reads (repro bundle)")
    _add_case_args(p)
    p.add_argument("--step", type=int, default=0)
    p.add_argument("--layer", type=int, action="append", help="layer(s) to export (default: 0)")
    p.add_argument("--out", type=Path, required=True, help="output .safetensors file")
    p.set_defaults(func=cmd_export_inputs)

    p = add("tpot", help="time a model-shaped decode step (one TP rank) per strategy")
    _add_case_args(p)
    from harness.tpot.cli import add_tpot_args

    add_tpot_args(p)
    p.set_defaults(func=cmd_tpot)

    p = add("report", help="render tables and plots from results JSON files")
    p.add_argument("results", type=Path, nargs="+")
    p.add_argument("--out", type=Path, help="folder for report.md and plots (new or empty, unless --force)")
    p.add_argument("--force", action="store_true", help="--out: write into a folder that already holds files")
    p.set_defaults(func=cmd_report)

    p = add("compare", help="compare two results JSON files; exit 1 on regression")
    p.add_argument("base", type=Path)
    p.add_argument("head", type=Path)
    p.add_argument("--max-regression", default="5%", help="tolerance: a gating metric regresses when its whole 99%% CI lies beyond it")
    p.add_argument("--inconclusive", choices=("pass", "fail"), default="pass",
                   help="what an inconclusive or clock-disturbed gating metric does: pass (loud line, exit 0) or fail (exit 1)")
    p.set_defaults(func=cmd_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # for the results' repro command
    console = Console(stderr=False, width=200 if not sys.stdout.isatty() else None)
    try:
        if getattr(args, "golden_dir", None) is not None:
            from harness.inputs.cases import use_golden_dir

            use_golden_dir(args.golden_dir)
        return args.func(args, console)
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
