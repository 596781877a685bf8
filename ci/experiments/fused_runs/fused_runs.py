"""Issue 28's production runs of fused_fp8, and its "Done when" lines judged from them. GPU (--judge-only: none).

usage: python -m ci.experiments.fused_runs OUT_DIR [--runs 2] [--repeats 20] [--judge-only]

For run k = 1 .. --runs and each case a TARGET names: `python -m harness run --scale prod --preset P --scenario S
--strategy fused_fp8 --repeats R --json OUT_DIR/run{k}-{P}-{S}.json` (a run file already there is an error: none is
overwritten; judge it with --judge-only). Every run file is then read back (harness.results.schema.read_results) and
must be of its case at production scale, hold fused_fp8's attention, its byte floor and a verdict, and come from one
named commit and GPU, the same as the others'; else one error line names the file. Each run's fused_fp8 attention (median
attn_us and its upper quartile) is set against the attention's byte floor at that run's copy bandwidth (the
floor_ratio row), and each TARGET is judged on every run. Writes OUT_DIR/summary.json and summary.md (derived from
the run files beside them: rewritten at each judgement). Exit 0 when every target holds and every verdict passes,
1 when one does not, 2 on an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
from pathlib import Path

STRATEGY = "fused_fp8"


@dataclasses.dataclass(frozen=True)
class Limit:
    """Every run of `case`: `stat` ("q3_ratio": the attention's upper quartile over its floor, "attn_us") <= most."""

    label: str
    case: tuple[str, str]
    stat: str
    most: float

    @property
    def cases(self) -> tuple:
        return (self.case,)

    def value(self, runs: dict) -> float:
        return runs[self.case][self.stat]


@dataclasses.dataclass(frozen=True)
class Gap:
    """Every run: `case`'s median attention over its floor minus `base`'s (the same run number) <= most."""

    label: str
    case: tuple[str, str]
    base: tuple[str, str]
    most: float

    @property
    def cases(self) -> tuple:
        return (self.case, self.base)

    def value(self, runs: dict) -> float:
        return runs[self.case]["ratio"] - runs[self.base]["ratio"]


GLM5, DSV3 = "glm5-tp8", "deepseek-v3-tp8"
TARGETS = (
    Limit("GLM-5 b32-l4096 attention <= 1.2x its byte floor (upper quartile)", (GLM5, "b32-l4096"), "q3_ratio", 1.2),
    Limit("GLM-5 b128-l2048 attention <= 1.1x its byte floor (upper quartile)", (GLM5, "b128-l2048"), "q3_ratio", 1.1),
    Limit("GLM-5 b1-l4096 attention <= 8 us a layer", (GLM5, "b1-l4096"), "attn_us", 8.0),
    Gap("DeepSeek-V3 b32-l4096 floor ratio within 0.1 of GLM-5's", (DSV3, "b32-l4096"), (GLM5, "b32-l4096"), 0.1),
    Gap("DeepSeek-V3 b128-l2048 floor ratio within 0.1 of GLM-5's", (DSV3, "b128-l2048"), (GLM5, "b128-l2048"), 0.1),
)
CASES = tuple(dict.fromkeys(c for t in TARGETS for c in t.cases))


class RunError(Exception):
    """A run file that cannot be judged: its message names the file."""


def run_path(out: Path, k: int, case: tuple[str, str]) -> Path:
    return out / f"run{k}-{case[0]}-{case[1]}.json"


def read_run(path: Path, case: tuple[str, str]) -> dict:
    """One run file's fused_fp8 attention against its floor, and where it ran."""
    from harness.gate.compare import is_number
    from harness.results.schema import read_results

    if not path.is_file():
        raise RunError(f"{path}: missing (run it, or judge fewer --runs)")
    try:
        doc = read_results(path)
    except Exception as exc:  # the reader's errors name the file and field
        raise RunError(f"{path}: {exc}") from None
    got = (doc.case.preset, doc.case.scenario, doc.case.scale)
    if got != (*case, "prod"):
        raise RunError(f"{path}: case is {' '.join(got)}, expected {case[0]} {case[1]} prod")
    rows = {(r.strategy, r.metric): r for r in doc.rows}
    wanted = ((STRATEGY, "attn_us"), (STRATEGY, "floor_ratio"), (STRATEGY, "verdict"), ("control", "control_copy_gbps"))
    for strategy, metric in wanted:
        if rows.get((strategy, metric)) is None or rows[strategy, metric].value is None:
            raise RunError(f"{path}: no {strategy} {metric} value")
    attn, floor, verdict, copy = (rows[key] for key in wanted)
    floor_us = (floor.detail or {}).get("attn_floor_us")
    if not is_number(floor_us) or floor_us <= 0:
        raise RunError(f"{path}: {STRATEGY} floor_ratio has no detail.attn_floor_us")
    q3 = statistics.quantiles(attn.samples, n=4)[2] if len(attn.samples) >= 4 else attn.value
    env = doc.environment
    return {"file": path.name, "attn_us": attn.value, "q3_us": q3, "floor_us": floor_us, "ratio": attn.value / floor_us,
            "q3_ratio": q3 / floor_us, "copy_gbps": copy.value, "verdict": verdict.value,
            "commit": env.git_commit if env else None, "gpu": env.gpu if env else None}


def judge(out: Path, runs: int) -> dict:
    """Every run file read back and every TARGET judged on each run (RunError on a file that cannot be)."""
    table = {k: {case: read_run(run_path(out, k, case), case) for case in CASES} for k in range(1, runs + 1)}
    first = table[1][CASES[0]]
    if not first["commit"]:
        raise RunError(f"{out / first['file']}: no environment.git_commit (a checkout without .git: set "
                       "MLA_HARNESS_GIT_COMMIT for the runs), so the runs cannot say which code they measured")
    for k, per_case in table.items():
        for r in per_case.values():
            for field in ("commit", "gpu"):
                if r[field] != first[field]:
                    raise RunError(f"{out / r['file']}: {field} {r[field]!r}, but {first['file']}'s is {first[field]!r}")
    targets = [{"target": t.label, "most": t.most, "values": [t.value(table[k]) for k in table],
                "holds": all(t.value(table[k]) <= t.most for k in table)} for t in TARGETS]
    verdicts = all(r["verdict"] == "pass" for per_case in table.values() for r in per_case.values())
    return {"commit": first["commit"], "gpu": first["gpu"], "runs": [r for per_case in table.values() for r in per_case.values()],
            "targets": targets, "verdicts_pass": verdicts, "all_hold": verdicts and all(t["holds"] for t in targets)}


def markdown(doc: dict) -> str:
    lines = [f"# fused_fp8 production runs at {doc['commit']} ({doc['gpu']})", "",
             "| run file | attention µs | upper quartile | floor µs | x floor | upper quartile x floor | copy GB/s | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['file']} | {r['attn_us']:.2f} | {r['q3_us']:.2f} | {r['floor_us']:.2f} | {r['ratio']:.3f} | "
              f"{r['q3_ratio']:.3f} | {r['copy_gbps']:.0f} | {r['verdict']} |" for r in doc["runs"]]
    lines += ["", "| target | each run | holds |", "|---|---|---|"]
    lines += [f"| {t['target']} | {', '.join(format(v, '.3f') for v in t['values'])} | {'yes' if t['holds'] else 'NO'} |"
              for t in doc["targets"]]
    lines += ["", f"Every verdict passes: {'yes' if doc['verdicts_pass'] else 'NO'}. Command: `{doc['command']}`."]
    return "\n".join(lines) + "\n"


def run_cases(out: Path, runs: int, repeats: int) -> None:
    """The harness's production runs, none over a file already there."""
    paths = [(k, case, run_path(out, k, case)) for k in range(1, runs + 1) for case in CASES]
    there = [str(p) for _, _, p in paths if p.exists()]
    if there:
        raise RunError(f"{there[0]}: already there (judge it with --judge-only, or choose another OUT_DIR)")
    for k, (preset, scenario), path in paths:
        proc = subprocess.run([sys.executable, "-m", "harness", "run", "--scale", "prod", "--preset", preset, "--scenario",
                               scenario, "--strategy", STRATEGY, "--repeats", str(repeats), "--json", str(path)])
        print(f"run {k} {preset} {scenario}: exit {proc.returncode}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.experiments.fused_runs", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--judge-only", action="store_true", help="judge the run files already in OUT_DIR")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: at least 1")
    try:
        if not args.judge_only:
            args.out.mkdir(parents=True, exist_ok=True)
            run_cases(args.out, args.runs, args.repeats)
        doc = judge(args.out, args.runs)
        doc["command"] = " ".join(["python -m ci.experiments.fused_runs", *(argv if argv is not None else sys.argv[1:])])
        (args.out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
        (args.out / "summary.md").write_text(markdown(doc))
    except (RunError, OSError) as exc:
        print(f"fused_runs: error: {exc}", file=sys.stderr)
        return 2
    print(markdown(doc))
    return 0 if doc["all_hold"] else 1
