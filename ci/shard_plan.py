"""How many xdist workers the GPU suite should use: shard only when the measured model says it pays.

usage: python -m ci.shard_plan choose --model ci/shard_model.json --gpus N [PYTEST ARGS...]
           prints N workers (0: run without xdist); the reasoning goes to stderr
       python -m ci.shard_plan fit --out MODEL.json [--force] RUN...
           RUN = WORKERS:WALL_S:JUNIT.xml (WORKERS 0 = no xdist), one per timed run of the same suite;
           prints a markdown table of the runs (wall, summed test time, speed-up vs no xdist)

The model is measured, never guessed: for every timed run, overhead(n) = wall - work / max(n, 1),
where work is the summed test time of the run without xdist (which carries one process's warm-up,
as every worker's share does). A suite of `work` seconds then takes overhead(n) + work / n with n
workers (n above the largest measured uses the largest measured xdist overhead), and the plan picks
the fastest n only if it beats no xdist by MIN_SPEEDUP. `choose` estimates a suite's work from the
model's per-test durations (tests it has not seen count as the median test). The committed
ci/shard_model.json holds the latest 2x H200 measurement (python -m ci.experiments.shard_refit refits it);
sharded runs use --dist loadgroup (suites/plugins/pool_groups.py), whose node ids end in '@group'.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from harness import datafiles, envvars
from harness.errors import HarnessError, interruptible
from harness.fsio import check_writable, write_text
from harness.inputs.cases import refuse_clobbering

MAX_GPUS = envvars.BY_NAME["MLA_HARNESS_NUM_GPUS"].maximum  # choose tries every count up to --gpus
MIN_SPEEDUP = 1.2


def strip_group(name: str) -> str:
    """A junit test name without the '@group' that --dist loadgroup appends (after any parameters)."""
    at = name.rfind("@")
    return name[:at] if at > name.rfind("]") else name


def junit_durations(path: Path) -> dict[str, float]:
    """nodeid-like 'module/path.py::name' -> seconds, from a pytest junit XML; a time that is no finite number of
    seconds >= 0 is a ValueError naming the file and test."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        if case.find("skipped") is None and module:
            name = f"{module}.py::{strip_group(case.get('name', ''))}"
            try:
                seconds = float(case.get("time", 0))
            except ValueError:
                seconds = math.nan
            if not 0 <= seconds < math.inf:
                raise ValueError(f"{path}: {name}: time {case.get('time')!r} is no number of seconds >= 0")
            out[name] = seconds
    return out


def fit(runs: list[tuple[int, float, dict[str, float]]]) -> dict:
    """Model from timed runs (workers, wall seconds, per-test durations); needs the no-xdist run."""
    serial = [r for r in runs if r[0] == 0]
    if not serial:
        raise ValueError("fit needs the run without xdist (WORKERS 0)")
    _, _, durations = serial[0]
    if not durations:
        raise ValueError("no test ran in the run without xdist (all skipped?): nothing to fit")
    if len({n for n, _, _ in runs}) < len(runs):
        raise ValueError("two runs with the same WORKERS: give one timed run per worker count")
    work = sum(durations.values())
    overhead = {str(n): round(wall - work / max(n, 1), 3) for n, wall, _ in runs}
    return {"work_s": round(work, 3), "tests": len(durations), "overhead_s": overhead, "durations": durations,
            "wall_s": {str(n): wall for n, wall, _ in runs}, "min_speedup": MIN_SPEEDUP}


def table(runs: list[tuple[int, float, dict[str, float]]]) -> str:
    """Markdown: per run its wall seconds, summed test seconds, and speed-up against no xdist."""
    serial = next(wall for n, wall, _ in runs if n == 0)
    rows = ["| run | wall s | summed test s | speed-up vs no xdist |", "|---|---|---|---|"]
    for n, wall, durations in sorted(runs, key=lambda r: r[0]):
        rows.append(f"| {f'-n {n}' if n else 'no xdist'} | {wall:.1f} | {sum(durations.values()):.1f} | {serial / wall:.2f}x |")
    return "\n".join(rows)


def predict(model: dict, work: float, workers: int) -> float:
    """Predicted wall seconds of a suite of `work` test-seconds with `workers` (0: no xdist)."""
    measured = {int(n): s for n, s in model["overhead_s"].items()}
    xdist = {n: s for n, s in measured.items() if n > 0}
    if workers in measured:
        overhead = measured[workers]
    elif workers > 0 and xdist:
        overhead = max(xdist.values())
    else:
        raise ValueError(f"no measured overhead for {workers} workers")
    return overhead + work / max(workers, 1)


def choose(model: dict, work: float, gpus: int) -> tuple[int, str]:
    """(workers, why): the fastest predicted n in 1..gpus if it beats no xdist by min_speedup, else 0."""
    serial = predict(model, work, 0)
    best = min(range(1, gpus + 1), key=lambda n: predict(model, work, n), default=0)
    if best and serial / predict(model, work, best) >= model.get("min_speedup", MIN_SPEEDUP):
        return best, f"{work:.1f} s of tests: -n {best} predicted {predict(model, work, best):.1f} s vs {serial:.1f} s without xdist"
    sharded = f"-n {best} predicted {predict(model, work, best):.1f} s" if best else "no GPU"
    return 0, f"{work:.1f} s of tests: {sharded} vs {serial:.1f} s without xdist: not sharding"


def suite_work(model: dict, test_ids: list[str]) -> float:
    """Estimated test-seconds of `test_ids` from the model's per-test durations; unseen tests count as
    the median test (as the mean, work_s / tests, when the model has only totals)."""
    known = model["durations"]
    typical = statistics.median(known.values()) if known else model["work_s"] / model["tests"]
    return sum(known.get(t, typical) for t in test_ids)


def collected(pytest_args: list[str]) -> list[str]:
    """The test ids pytest collects; a collection that fails (an import error: exit 2, a usage error: 4) is bad input,
    not a plan sized on the tests that did collect. Exit 5 (nothing collected) is an empty list."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *pytest_args],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode not in (0, 5):
        last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        raise ValueError(f"pytest --collect-only {' '.join(pytest_args)} exited {proc.returncode}: {last[0]}")
    return [line.strip() for line in proc.stdout.splitlines() if "::" in line]


def parse_run(spec: str) -> tuple[int, float, dict[str, float]]:
    """'WORKERS:WALL_S:JUNIT.xml' -> (workers, wall seconds, per-test durations)."""
    parts = spec.split(":", 2)
    try:
        workers, wall = int(parts[0]), float(parts[1])
    except (ValueError, IndexError):
        raise ValueError(f"run {spec!r}: want WORKERS:WALL_S:JUNIT.xml (e.g. 2:41.3:junit-n2.xml)") from None
    if len(parts) < 3 or workers < 0 or not 0 < wall < float("inf"):
        raise ValueError(f"run {spec!r}: want WORKERS >= 0, WALL_S > 0 and a junit XML path")
    try:
        return workers, wall, junit_durations(Path(parts[2]))
    except OSError as exc:
        raise ValueError(f"run {spec!r}: {parts[2]}: cannot read: {exc.strerror or exc}") from None
    except ET.ParseError as exc:
        raise ValueError(f"run {spec!r}: {parts[2]}: not junit XML: {exc}") from None


def _number(where: str, value, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not minimum <= value < float("inf"):
        raise ValueError(f"{where}: want a finite number >= {minimum:g}, got {value!r}")
    return value


def load_model(path: Path) -> dict:
    """A model `fit` wrote: durations {test: s}, work_s, tests, overhead_s {"0": s, ...}; each field checked."""
    where = f"--model {path}"
    try:
        model = datafiles.read_json(path)  # bounded: --model /dev/zero is one line, not a full memory
    except HarnessError as exc:
        raise ValueError(f"--model {exc}") from None
    if not isinstance(model, dict):
        raise ValueError(f"{where}: want a JSON object, got {type(model).__name__}")
    for field, kind in (("durations", dict), ("overhead_s", dict), ("work_s", float), ("tests", int)):
        if field not in model:
            raise ValueError(f"{where}: {field}: missing (write the model with `fit`)")
        if kind is dict and not isinstance(model[field], dict):
            raise ValueError(f"{where}: {field}: want an object, got {model[field]!r:.40}")
    for test, seconds in model["durations"].items():
        _number(f"{where}: durations[{test!r}]", seconds)
    for n, seconds in model["overhead_s"].items():
        if not n.isdigit():
            raise ValueError(f"{where}: overhead_s: key {n!r} is not a worker count")
        _number(f"{where}: overhead_s[{n!r}]", seconds, float("-inf"))
    if "0" not in model["overhead_s"]:
        raise ValueError(f"{where}: overhead_s: no \"0\" (the run without xdist)")
    _number(f"{where}: work_s", model["work_s"])
    if isinstance(model["tests"], bool) or not isinstance(model["tests"], int) or model["tests"] < 1:
        raise ValueError(f"{where}: tests: want an integer >= 1, got {model['tests']!r}")
    _number(f"{where}: min_speedup", model.get("min_speedup", MIN_SPEEDUP), 1.0)
    return model


def _gpus(text: str) -> int:
    try:
        gpus = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a whole number of GPUs, got {text!r}") from None
    if not 0 <= gpus <= MAX_GPUS:
        raise argparse.ArgumentTypeError(f"want 0..{MAX_GPUS} GPUs, got {gpus}")
    return gpus


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the usage first)
        self.exit(2, f"error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m ci.shard_plan", description=__doc__.split("\n\n")[0],
                     epilog=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("choose", help="print the xdist worker count for a suite (0: no xdist); the reasoning goes to stderr",
                       usage="%(prog)s --model MODEL --gpus N [PYTEST ARGS...]", allow_abbrev=False)
    p.add_argument("--model", type=Path, required=True, help="the model `fit` wrote (ci/shard_model.json)")
    p.add_argument("--gpus", type=_gpus, required=True, help="GPUs this runner has")
    p = sub.add_parser("fit", help="fit the model from timed runs; prints a markdown table of them", allow_abbrev=False)
    p.add_argument("--out", type=Path, required=True, help="where to write the model JSON (a new file, unless --force)")
    p.add_argument("--force", action="store_true", help="--out: replace an existing file")
    p.add_argument("runs", nargs="+", metavar="RUN", help="WORKERS:WALL_S:JUNIT.xml (WORKERS 0 = no xdist)")
    return parser


@interruptible
def main(argv=None) -> int:
    """Bad input (arguments, model, runs, --out) is one line on stderr and exit 2; Ctrl-C or SIGTERM 'interrupted', 130."""
    try:
        args, pytest_args = _parser().parse_known_args(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as exc:  # --help (0) or an argument error (2, its line already printed)
        return int(exc.code or 0)
    try:
        if args.command == "fit":
            if pytest_args:
                raise ValueError(f"fit: unknown argument {pytest_args[0]!r}")
            try:  # before reading the runs: an existing file (unless --force) or a run's own junit XML is kept
                check_writable(args.out, "--out", args.force)
                refuse_clobbering([("--out", args.out)], [("the junit XML of run", s.split(":", 2)[-1]) for s in args.runs])
            except HarnessError as exc:
                raise ValueError(str(exc)) from None
            runs = [parse_run(spec) for spec in args.runs]
            model = fit(runs)
            text = json.dumps(model, indent=1, sort_keys=True)
            try:
                write_text(args.out, text, "--out")
            except HarnessError as exc:
                raise ValueError(str(exc)) from None
            print(table(runs))
            return 0
        model = load_model(args.model)
        workers, why = choose(model, suite_work(model, collected(pytest_args)), args.gpus)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(why, file=sys.stderr)
    print(workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
