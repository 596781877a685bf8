#!/usr/bin/env python3
"""Perf gate around `asv continuous BASE HEAD`: 0 clean, 1 regression, 2 failure.

usage: python -m ci.asv_gate BASE HEAD [--factor 1.10] [--bench REGEX] [--machine NAME] [ASV ARGS...]

The factor is asv's: 1.10 (the default) flags a benchmark that got more than 10%
slower (asv also requires the change to be statistically significant); "10%" is
accepted as a synonym. Unknown options go to asv unchanged. The full asv output
is streamed through, then one `asv-gate:` line gives the verdict.

How asv 0.6.6 signals the outcome (asv/commands/continuous.py, run.py, main.py):
- a benchmark failed in either commit: `asv run` returns 2, printing
  `[ NN%] ··· name   failed` (or `k/n failed` for parameterised ones), and
  continuous returns that 2 before comparing, so no table and no summary;
- otherwise it prints the comparison table (`| + | ...` rows got worse,
  `| ! |` rows newly failing, `| - |` improved) and one summary:
  "PERFORMANCE DECREASED." (exit status 1: continuous returns worsened=True),
  "PERFORMANCE INCREASED." or "BENCHMARKS NOT SIGNIFICANTLY CHANGED." (exit 0);
- a user error (unknown commit, build failure, no results) or a crash also
  exits 1, but without a summary line, so the gate reads that as a failure.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass, field

CLEAN, REGRESSION, FAILURE = 0, 1, 2
DECREASED = "PERFORMANCE DECREASED."
SUMMARIES = (DECREASED, "PERFORMANCE INCREASED.", "BENCHMARKS NOT SIGNIFICANTLY CHANGED.")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
FAILED_LINE = re.compile(r"^(?:\[\s*[\d.]+%\]\s+)?·+\s+(?P<name>.+?)\s+(?:\d+/\d+\s+)?failed$")


@dataclass
class Outcome:
    code: int
    reason: str
    regressions: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _table_rows(lines: list[str]) -> list[list[str]]:
    """Cells of asv's github-format comparison rows: change, before, after, ratio, benchmark."""
    rows = []
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 5 and cells[0] in ("+", "-", "!", "x", "*", ""):
            rows.append(cells)
    return rows


def classify(returncode: int, output: str) -> Outcome:
    """Read `asv continuous` output and exit status (asv 0.6.x) into the gate's verdict."""
    lines = [ANSI.sub("", line).rstrip() for line in output.splitlines()]
    rows = _table_rows(lines)
    failures = [m["name"] for m in map(FAILED_LINE.match, lines) if m]
    failures += [f"{r[4]} (newly failing)" for r in rows if r[0] == "!"]
    regressions = [f"{r[4]} ({r[1]} -> {r[2]}, ratio {r[3]})" for r in rows if r[0] == "+"]
    summary = next((line.strip() for line in reversed(lines) if line.strip() in SUMMARIES), None)
    if failures or returncode == 2:
        return Outcome(FAILURE, "benchmarks failed", regressions, failures)
    if summary is None:
        return Outcome(FAILURE, "asv printed no comparison (crashed or bad input)")
    if summary == DECREASED or regressions:
        return Outcome(REGRESSION, "performance decreased beyond the factor", regressions)
    if returncode != 0:
        return Outcome(FAILURE, f"asv exited non-zero although it reported {summary!r}")
    return Outcome(CLEAN, summary)


def run_streaming(cmd: list[str]) -> tuple[int, str]:
    """Run `cmd`, echoing its combined output line by line; return (exit status, output)."""
    lines = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    return proc.returncode, "".join(lines)


def _factor(text: str) -> float:
    value = 1.0 + float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    if not value > 1.0:
        raise argparse.ArgumentTypeError(f"factor must be above 1 (e.g. 1.10 or 10%), got {text!r}")
    return value


def asv_command(args: argparse.Namespace, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "asv", "continuous", args.base, args.head, "--factor", f"{args.factor:g}"]
    if args.bench:
        cmd += ["--bench", args.bench]
    if args.machine:
        cmd += ["--machine", args.machine]
    return cmd + extra


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The gate's own options, and the rest (passed to asv as is)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="commit or ref to compare against, e.g. origin/main")
    parser.add_argument("head", help="commit or ref under test, e.g. HEAD")
    parser.add_argument("--factor", type=_factor, default=1.10, help="asv factor (default 1.10, i.e. 10%%)")
    parser.add_argument("--bench", help="regex selecting benchmarks")
    parser.add_argument("--machine", help="asv machine name")
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    cmd = asv_command(args, extra)
    print("asv-gate: running " + " ".join(cmd), flush=True)
    try:
        returncode, output = run_streaming(cmd)
    except OSError as exc:
        print(f"asv-gate: FAILURE: cannot run asv: {exc}", flush=True)
        return FAILURE
    outcome = classify(returncode, output)
    label = {CLEAN: "OK", REGRESSION: "REGRESSION", FAILURE: "FAILURE"}[outcome.code]
    print(f"\nasv-gate: {label}: {outcome.reason} (asv exit {returncode}, factor {args.factor:g})")
    for item in outcome.regressions:
        print(f"asv-gate:   slower: {item}")
    for item in outcome.failures:
        print(f"asv-gate:   failed: {item}")
    return outcome.code


if __name__ == "__main__":
    sys.exit(main())
