"""How many xdist workers the GPU suite should use: shard only when the measured model says it pays.

usage: python -m ci.shard_plan choose --model ci/shard_model.json --gpus N [PYTEST ARGS...]
           prints N workers (0: run without xdist); the reasoning goes to stderr
       python -m ci.shard_plan fit --out MODEL.json RUN...
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

import json
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

MIN_SPEEDUP = 1.2


def strip_group(name: str) -> str:
    """A junit test name without the '@group' that --dist loadgroup appends (after any parameters)."""
    at = name.rfind("@")
    return name[:at] if at > name.rfind("]") else name


def junit_durations(path: Path) -> dict[str, float]:
    """nodeid-like 'module/path.py::name' -> seconds, from a pytest junit XML."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        if case.find("skipped") is None and module:
            out[f"{module}.py::{strip_group(case.get('name', ''))}"] = float(case.get("time", 0))
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
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *pytest_args],
                          capture_output=True, text=True, timeout=600)
    return [line.strip() for line in proc.stdout.splitlines() if "::" in line]


def parse_run(spec: str) -> tuple[int, float, dict[str, float]]:
    """'WORKERS:WALL_S:JUNIT.xml' -> (workers, wall seconds, per-test durations)."""
    parts = spec.split(":", 2)
    try:
        workers, wall = int(parts[0]), float(parts[1])
    except (ValueError, IndexError):
        raise ValueError(f"run {spec!r}: want WORKERS:WALL_S:JUNIT.xml (e.g. 2:41.3:junit-n2.xml)") from None
    if len(parts) < 3 or workers < 0 or wall <= 0:
        raise ValueError(f"run {spec!r}: want WORKERS >= 0, WALL_S > 0 and a junit XML path")
    return workers, wall, junit_durations(Path(parts[2]))


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["fit"] and "--out" in args[:-1]:
        i = args.index("--out")
        out, specs = Path(args[i + 1]), args[1:i] + args[i + 2:]
        try:
            runs = [parse_run(spec) for spec in specs]
            model = fit(runs)
        except (ValueError, OSError, ET.ParseError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        out.write_text(json.dumps(model, indent=1, sort_keys=True))
        print(table(runs))
        return 0
    if args[:1] == ["choose"] and "--model" in args and "--gpus" in args:
        rest = args[1:]
        model = json.loads(Path(rest.pop(rest.index("--model") + 1)).read_text())
        rest.remove("--model")
        gpus = int(rest.pop(rest.index("--gpus") + 1))
        rest.remove("--gpus")
        workers, why = choose(model, suite_work(model, collected(rest)), gpus)
        print(why, file=sys.stderr)
        print(workers)
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
