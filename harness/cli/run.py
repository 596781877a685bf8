"""`harness run`: arguments -> harness.api.run -> the run table, the results file and the summary line."""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path

from rich.console import Console

from harness.backends import BACKENDS, KERNEL_CHOICES, backend_family
from harness.cli.common import LazyHelp, add_case_args, case_from, device_from, fault_help, inputs_of, strategy_help
from harness.errors import CheckFailed, HarnessError
from harness.fsio import check_new_dir, check_writable, refuse_idle_force

HELP = "run every strategy on one case, check against golden, time"


def command(args, console: Console) -> int:
    from harness.api import RunConfig, run, to_rows
    from harness.inputs.cases import refuse_clobbering
    from harness.measure.environment import environment
    from harness.render.table import results_table
    from harness.results.document import case_record, pin_case, repro_command, write_results
    from harness.spec.faults import parse_faults
    from harness.spec.scenario import check_repeats
    from harness.strategies import BASELINE, RUN_DEFAULT
    from harness.strategies import select as select_strategies
    from harness.verify.negative_controls import cannot_fire, did_not_fire

    device = device_from(args.device)
    strategies = select_strategies(args.strategy, RUN_DEFAULT)
    repeats = args.repeats if args.repeats is not None else (40 if device.type == "cuda" else 5)
    check_repeats("--repeats", repeats, 0)
    faults = parse_faults(args.plant_fault)
    refuse_idle_force(args.force, ("--json", args.json), ("--dump-outputs", args.dump_outputs))
    case = case_from(args, device, console)
    dumps = [args.dump_outputs / f"{case.name}.{name}.safetensors" for name in dict.fromkeys((BASELINE, *strategies))] if args.dump_outputs else []
    refuse_clobbering([("--json", args.json), ("--dump-outputs", args.dump_outputs), *(("--dump-outputs", d) for d in dumps)], inputs_of(case))
    if args.json and os.path.realpath(args.json) in {os.path.realpath(p) for p in (args.dump_outputs, *dumps) if p}:
        raise HarnessError("--json", f"{args.json} is the --dump-outputs folder or one of its dumps: the run's outputs must not overlap")
    if args.json:
        check_writable(args.json, "--json", args.force)
    if args.dump_outputs:
        check_new_dir(args.dump_outputs, "--dump-outputs")
        for path in dumps:
            check_writable(path, "--dump-outputs", args.force)
    cannot_fire(faults, strategies, case)
    cfg = RunConfig(
        case=case, device=device, backend=args.backend, kernel=args.kernel, strategies=strategies, faults=faults,
        repeats=repeats, reference=args.reference, dump_outputs=args.dump_outputs,
    )
    console.print(f"case {case.name} on {device} ({case.scale.slots:,} slots, {case.num_layers} layers)", markup=False)
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
        env["reference"] = outcome.reference
        rows = to_rows(case, outcome) + roofline.rows(case, outcome, env.get("copy_gbps")) + [control]
        pinned = pin_case(args.argv, device, case, {"--backend": backend_family(outcome.backend), "--repeats": str(repeats)})
        planted = {"faults": sorted(f.value for f in faults)} if faults else None  # another workload than a clean run's
        write_results(args.json, rows, env, repro_command(pinned), case_record(case, outcome.backend, args.kernel, extra=planted))
        console.print(f"results written to {args.json}", markup=False)
    failed = [r.strategy for r in outcome.results if r.verdict.status.value in ("fail", "error")]
    ran = [r.strategy for r in outcome.results if r.strategy in strategies and r.verdict.status.value == "pass"]
    console.print(_summary(outcome.results, 1 if failed or not ran else 0, args), markup=False, highlight=False)
    if failed:
        raise CheckFailed(f"check failed: {', '.join(failed)}")
    if not ran:
        why = "; ".join(r.verdict.reason for r in outcome.results if r.strategy in strategies)  # each names its strategy
        raise CheckFailed(f"nothing requested was checked on {device}: {why}")
    return 0


def _summary(results, code: int, args) -> str:
    """The run's last line: verdict counts, the exit code, where the results went."""
    counts = Counter(r.verdict.status.value for r in results)
    written = ", ".join(f"{flag} {path}" for flag, path in (("--json", args.json), ("--dump-outputs", args.dump_outputs)) if path)
    return (f"summary: {counts['pass']} pass, {counts['fail']} fail, {counts['unsupported']} unsupported, "
            f"{counts['error']} error; exit {code}; results: {written or 'not written (no --json)'}")


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--force", action="store_true", help="replace --json and --dump-outputs files that already exist (else exit 2)")
    p.add_argument("--golden-dir", type=Path, help="golden folder (default: $MLA_HARNESS_GOLDEN_DIR, else the checkout's golden/)")
