"""`python -m harness tpot`: arguments and the command (kept here so harness/cli.py only registers it)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.backends import BACKENDS, backend_family
from harness.errors import CheckFailed, HarnessError
from harness.fsio import check_writable, refuse_idle_force
from harness.progress import progress_bar


def add_tpot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strategy", action="append",
                   help="strategy to time (repeatable; default: every registered strategy but those with register(benchmark=False))")
    p.add_argument("--backend", default="auto", help=f"attention backend: {', '.join(BACKENDS)}")
    p.add_argument("--shrink", action="store_true", help="CPU/CI size: the [shrink] fields of harness/tpot/models.toml")
    p.add_argument("--weight-sets", type=int, default=4, help="distinct weight sets rotated over the layers (default 4)")
    p.add_argument("--allreduce-table", help="TOML of measured all-reduce latency per message size, or 'none' (default on CUDA: "
                   "harness/tpot/allreduce_h200_tp2.toml, the TP2 NCCL table measured on 2x H200; CPU: none)")
    p.add_argument("--check-rotation", action="store_true", help="also time the first strategy that runs here with every layer's weights distinct")
    p.add_argument("--repeats", type=int, default=None, help="timing samples (default 30 on CUDA, 3 on CPU)")
    p.add_argument("--profile", action="store_true", help="CUDA: also profile one eager step (kernel time by name) into the JSON")
    p.add_argument("--no-breakdown", action="store_true",
                   help="skip where-the-time-goes (each step component timed as its own CUDA graph, beside its byte floor)")
    p.add_argument("--json", type=Path, help="write results JSON here")
    p.add_argument("--force", action="store_true", help="replace --json when it already exists (else exit 2)")
    p.add_argument("--engine", choices=("harness", "sglang"), default="harness",
                   help="harness: the model-shaped step here; sglang: SGLang's one-batch benchmark (needs SGLang on a GPU)")
    p.add_argument("--sglang-python", default=sys.executable, help="--engine sglang: the Python that has sglang")
    p.add_argument("--sglang-output-len", type=int, default=32,
                   help="--engine sglang: tokens generated per run; its output_len - 1 decode steps are the samples (default 32)")
    p.add_argument("--sglang-workdir", type=Path, default=Path("sglang-tpot"), help="--engine sglang: model folder and logs")
    p.add_argument("--sglang-full-tp", action="store_true", help="--engine sglang: run all tp ranks instead of one shrunk rank")


# The options only one engine reads (argparse dests); given to the other, they would be ignored in silence.
ENGINE_OPTIONS = {
    "harness": ("backend", "weight_sets", "allreduce_table", "check_rotation", "repeats", "profile", "no_breakdown"),
    "sglang": ("sglang_python", "sglang_output_len", "sglang_workdir", "sglang_full_tp"),
}


def refuse_other_engines_options(args) -> None:
    """One line naming the first option given (not at its default) that the other engine reads and this one ignores."""
    defaults = argparse.ArgumentParser()
    add_tpot_args(defaults)
    for engine, dests in ENGINE_OPTIONS.items():
        for dest in dests:
            if engine != args.engine and getattr(args, dest) != defaults.get_default(dest):
                raise HarnessError(f"--{dest.replace('_', '-')}", f"only --engine {engine} reads it; this run is --engine {args.engine}")


def cmd_tpot(args, console: Console, device, case) -> int:
    from harness.measure.environment import environment
    from harness.results.document import case_record, pin_case, repro_command, write_results
    from harness.spec.scenario import check_repeats
    from harness.strategies import BENCHMARKED, select
    from harness.tpot.allreduce import AllReduce, LatencyAllReduce, load_table
    from harness.tpot.config import load_shape
    from harness.tpot.tpot import build_context, refuse_one_workload_rotation, rotation_check, time_strategy, to_rows

    refuse_other_engines_options(args)
    refuse_idle_force(args.force, ("--json", args.json))
    names = select(args.strategy, BENCHMARKED)
    repeats = args.repeats if args.repeats is not None else (30 if device.type == "cuda" else 3)
    check_repeats("--repeats", repeats, 1)
    if args.json:
        check_writable(args.json, "--json", args.force)  # before the timing run: a folder or unwritable path is bad input
    if args.engine == "sglang":
        check_repeats("--sglang-output-len", args.sglang_output_len, 2)  # SGLang times output_len - 1 decode steps
        software = _require_sglang(args.sglang_python)
        from harness.tpot.sglang_driver import check_workdir

        check_workdir(args.sglang_workdir)
    from harness.tpot.allreduce import DEFAULT_TABLE

    allreduce = AllReduce()
    table_arg = args.allreduce_table
    if table_arg not in (None, "none"):
        table = load_table(Path(table_arg))
        if device.type != "cuda":
            raise HarnessError("--allreduce-table", "the latency stand-in is a GPU spin kernel; CPU runs have no all-reduce")
        allreduce = LatencyAllReduce(table, device)
    elif table_arg is None and device.type == "cuda" and args.engine == "harness":
        allreduce = LatencyAllReduce(load_table(DEFAULT_TABLE), device, default=True)
    shape = load_shape(case.preset.name, shrink=args.shrink).for_pool(case.num_layers, _layers_option(args),
                                                                      "the --shrink model" if args.shrink else "the model")
    if args.engine == "sglang":  # SGLang runs the case's layers, as the harness's step does
        return _sglang(args, console, device, case, shape, names, software)
    if args.check_rotation:
        refuse_one_workload_rotation(shape.num_layers, args.weight_sets)
    ctx = build_context(case, shape, device, args.backend, args.weight_sets, allreduce, strategies=names,
                        check_rotation=args.check_rotation)
    console.print(f"tpot {case.name} on {device}: {ctx.shape.num_layers} layers of {shape.name}"
                  f"{' (shrunk)' if args.shrink else ''}, {ctx.weight_sets} weight set(s), all-reduce {allreduce.describe()}", markup=False)
    reasons = ctx.unsupported
    timed = [name for name in names if not reasons[name]]
    if args.check_rotation and not timed:
        raise HarnessError("--check-rotation", f"no strategy named runs here, so none can be timed twice: {'; '.join(reasons.values())}")
    results = []
    with progress_bar(console, f"timing {len(names)} strategies, {repeats} samples each", len(names)) as advance:
        for name in names:
            reason = reasons[name]
            if reason:
                from harness.tpot.tpot import TpotResult

                results.append(TpotResult(name, [], [], None, 0, {}, unsupported=reason))
            else:
                results.append(time_strategy(name, ctx, repeats, profile=args.profile, breakdown=not args.no_breakdown))
            advance()
    rotation = rotation_check(ctx, timed[0], repeats) if args.check_rotation else None
    from harness.measure.control import control_row

    # the control copy, as `run` records it: compare tells a throttled GPU or loaded runner from a slower commit
    control = control_row(dict(preset=case.preset.name, scale=case.scale.name, scenario=case.scenario.name,
                               backend=ctx.backend.name), device)
    copy_gbps = control.value if device.type == "cuda" else None
    rows = to_rows(ctx, results, ctx.backend.name, copy_gbps, rotation)
    console.print(_table(rows))
    for table in _breakdown_tables(rows):
        console.print(table)
    for r in rows:
        if r.metric == "tpot_ms" and r.detail and r.detail.get("memory_plan"):
            console.print(f"memory plan: {r.detail['memory_plan']}", markup=False)
    if args.json:
        env = environment(device)
        env["copy_gbps"] = copy_gbps
        workload = {"engine": "harness", "model": shape, "weight_sets": ctx.weight_sets, "allreduce": allreduce.describe(),
                    "allreduce_table": getattr(allreduce, "table", None)}
        # the machine-dependent defaults as they ran here; the default all-reduce table follows the pinned --device
        # (naming its path would record another workload: "--allreduce-table" given)
        pinned = pin_case(args.argv, device, case, {"--backend": backend_family(ctx.backend.name), "--repeats": str(repeats),
                                                    **({"--allreduce-table": "none"} if allreduce.mode == "none" else {})})
        write_results(args.json, rows + [control], env, repro_command(pinned),
                      case_record(case, ctx.backend.name, "auto", "tpot", workload))
        console.print(f"results written to {args.json}", markup=False)
    return timed_or_fail(rows)


def _layers_option(args) -> str:
    """The option the user gave that set the pool's layer count: --layers, else --scale NAME, else --shrink (the
    default scale's layers against its smaller model)."""
    if args.layers is not None:
        return "--layers"
    return f"--scale {args.scale}" if args.scale is not None else "--shrink"


def timed_or_fail(rows) -> int:
    """0 when a requested strategy was timed; else (each unsupported here) a check failure, exit 1, as `run`'s
    'nothing requested was checked': a results file of null rows is not a measurement."""
    if any(r.metric == "tpot_ms" and r.value is not None for r in rows):
        return 0
    why = "; ".join(r.detail["unsupported"] for r in rows if r.metric == "tpot_ms")  # each names its strategy
    raise CheckFailed(f"nothing requested was timed: {why}")


def _require_sglang(python: str) -> dict:
    """--engine sglang: the environment fields of `python`'s software (environment.software_of); fails before anything
    is written when it cannot import sglang."""
    from harness.measure.environment import SOFTWARE_PROBE, software_of

    try:
        proc = subprocess.run([python, "-c", SOFTWARE_PROBE], capture_output=True, text=True, timeout=600)
    except OSError as exc:
        raise HarnessError("--sglang-python", f"{python}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        raise HarnessError("--engine sglang", f"{python} cannot import sglang (--sglang-python names the Python that has it)")
    try:
        return software_of(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError, KeyError, TypeError):
        raise HarnessError("--sglang-python", f"{python} did not say which software it has (printed {proc.stdout[-200:]!r})") from None


def _sglang(args, console: Console, device, case, shape, names, software: dict) -> int:
    """TPOT from SGLang's one-batch benchmark per strategy: every decode step a sample, their median the value; each
    run under the clock guard of the GPU it runs on, and the control copy timed there, as native tpot does (the driver
    has not run on a GPU here)."""
    from harness.measure import collect
    from harness.measure.control import control_row
    from harness.measure.environment import environment
    from harness.measure.timing import Samples
    from harness.results.document import Row, case_record, pin_case, repro_command, write_results
    from harness.tpot import sglang_driver
    from harness.tpot.sglang_plugin import SUPPORTED

    kv_lens = case.scenario.kv_lens
    # SGLang's pool is the case's slots (--max-total-tokens); one it cannot build so is refused before any run
    sglang_driver.check_slots(case.scale.slots, case.preset.page_size, len(kv_lens), max(kv_lens), args.sglang_output_len)
    ident = dict(preset=case.preset.name, scale=case.scale.name, scenario=case.scenario.name, backend="sglang-flashinfer")
    gpu = torch_device()
    rows = []
    for name in names:
        if name not in SUPPORTED:
            rows.append(Row(strategy=name, metric="tpot_ms", value=None, detail={"unsupported": f"{name}: the SGLang driver runs {', '.join(SUPPORTED)}"}, **ident))
            continue
        with progress_bar(console, f"{name}: sglang.benchmark.one_batch", 1) as advance:
            out, guard = collect.guarded(lambda: sglang_driver.run(shape, name, len(kv_lens), max(kv_lens), args.sglang_output_len,
                                                                   args.sglang_workdir, case.scale.slots, python=args.sglang_python,
                                                                   one_rank=not args.sglang_full_tp), gpu)
            advance()
        steps = Samples("ms", tuple(out["step_ms"]))
        console.print(f"{name}: SGLang median decode latency {out['tpot_ms']:.3f} ms over {len(steps.values)} steps", markup=False)
        rows.append(Row(strategy=name, metric="tpot_ms", value=out["tpot_ms"], unit="ms", better="lower", iqr=steps.iqr, samples=list(steps.values),
                        detail={"engine": "sglang.benchmark.one_batch", "sglang_median_ms": out["sglang_median_ms"],
                                "sglang_pool": out["pool"], "command": out["command"], "guard": guard}, **ident))
    if args.json:
        control = control_row(ident, gpu)  # as native tpot records it: compare's environment check
        workload = {"engine": "sglang", "model": shape, "output_len": args.sglang_output_len, "full_tp": args.sglang_full_tp}
        env = environment(gpu) | software  # the software SGLang ran with is --sglang-python's
        write_results(args.json, rows + [control], env, repro_command(pin_case(args.argv, device, case)),
                      case_record(case, ident["backend"], "auto", "tpot", workload))
        console.print(f"results written to {args.json}", markup=False)
    return timed_or_fail(rows)


def torch_device():
    """The GPU SGLang's one_batch runs on (rank 0: the first visible GPU, whatever --device says), else the CPU."""
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _breakdown_tables(rows) -> list[Table]:
    """Where the time goes, per strategy: each component's ms beside its floor; its share of TPOT and the unattributed
    rest only where the parts add up to TPOT (CUDA graphs), else the table says how they were timed."""
    out = []
    for r in rows:
        bd = (r.detail or {}).get("breakdown") if r.metric == "tpot_ms" else None
        if not bd:
            continue
        add_up = bd["parts_add_up"]
        t = Table(title=f"where the time goes: {r.strategy} (tpot {bd['tpot_ms']:.3f} ms)"
                        + ("" if add_up else f"\n{bd['how']}"))
        for col in ("component", "ms", *(("share",) if add_up else ()), "floor GB", "floor ms", "ms / floor"):
            t.add_column(col, justify="right")
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        for name, p in bd["parts"].items():
            share = (fmt(p["ms"] / bd["tpot_ms"], ".1%"),) if add_up else ()
            t.add_row(name, fmt(p["ms"], ".3f"), *share, fmt(p["floor_bytes"] / 1e9, ".3f"), fmt(p["floor_ms"], ".3f"),
                      fmt(p["over_floor"], ".1f"))
        if add_up:
            t.add_row("sum / unattributed", fmt(bd["sum_ms"], ".3f"), fmt(bd["sum_ms"] / bd["tpot_ms"], ".1%"), "", "",
                      f"{bd['unattributed_ms']:+.3f} ms")
        out.append(t)
    return out


def _table(rows) -> Table:
    by = {}
    for r in rows:
        by.setdefault(r.strategy, {})[r.metric] = r.value
    t = Table(title="TPOT per strategy (one TP rank)")
    for col in ("strategy", "tpot ms", "attn path ms", "attn share", "roofline ms", "tpot/roofline", "GB moved"):
        t.add_column(col, justify="right")
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for name, m in by.items():
        if "tpot_ms" not in m:
            continue
        gb = [m.get(k) for k in ("step_weight_bytes", "step_kv_bytes", "step_cast_bytes")]
        moved = None if None in gb else sum(gb) / 1e9  # a null or missing row is no 0 B
        t.add_row(name, fmt(m.get("tpot_ms"), ".3f"), fmt(m.get("attn_path_ms"), ".3f"), fmt(m.get("attn_share"), ".1%"),
                  fmt(m.get("roofline_ms"), ".3f"), fmt(m.get("tpot_over_roofline"), ".2f"), fmt(moved, ".3f"))
    if "rotation_check" in {r.metric for r in rows}:
        rc = next(r for r in rows if r.metric == "rotation_check").detail
        t.caption = f"rotation check ({rc['strategy']}, {rc['layers']} layers): rotated {rc['rotated_ms']:.3f} ms vs distinct {rc['distinct_ms']:.3f} ms (x{rc['ratio']:.3f})"
    return t
