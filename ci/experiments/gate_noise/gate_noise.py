#!/usr/bin/env python3
"""False alarms and silent misses of the perf gates on synthetic timing noise (CPU, about 1-2 minutes).

usage: python -m ci.experiments.gate_noise OUT_DIR [--trials 300] [--factor 1.05]

Each configuration (noise family x samples per commit x spread x true shift) draws `--trials` seeded pairs
of sample sets and judges every pair three ways, all by the code that gates:
- asv: asv's own comparison (asv.commands.compare._is_result_better on asv_runner's compute_stats, the test
  `asv continuous` applies: Mann-Whitney U or 99% CI overlap, then the factor);
- rule: `harness compare`'s decision (harness/gate/decision.py decide, tolerance factor - 1);
- gate: ci/asv_gate.py's verdict from both (`judged`: asv's call with the rule beside it).
Noise families (medians 100, lognormal spread sigma): lognormal; outliers (3% of samples 1.5-4x);
bimodal (two clock states 6% apart, the slow state's share 0.2-0.8 per commit); drift (a 1% lognormal
offset per commit). A pair is "failed" when the judge would fail the gate, "loud" when the gate passes
it with an INCONCLUSIVE line, "silent" when it passes with nothing said. What must hold: no shift (A/A)
is never failed by the gate, and a true slowdown of twice the tolerance is never silent.

Writes OUT_DIR/gate-noise.md (the table and totals) and OUT_DIR/gate-noise.json (every count); exits 0
when both criteria hold, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from ci import asv_gate
from harness.gate import decision

FAMILIES = ("lognormal", "outliers", "bimodal", "drift")
SAMPLES, SPREADS = (12, 30), (0.01, 0.03, 0.05)
NAME = "benchmarks.StepDeviceMs.time_step_device('b32-l4096', 'gather_cast')"


def draw(rng: np.random.Generator, family: str, n: int, sigma: float, shift: float = 1.0) -> np.ndarray:
    x = rng.lognormal(0.0, sigma, n)
    if family == "outliers":
        hit = rng.random(n) < 0.03
        x[hit] *= rng.uniform(1.5, 4.0, hit.sum())
    elif family == "bimodal":
        x *= np.where(rng.random(n) < rng.uniform(0.2, 0.8), 1.06, 1.0)
    elif family == "drift":
        x *= rng.lognormal(0.0, 0.01)
    return 100.0 * x * shift


def asv_flags(base: np.ndarray, head: np.ndarray, factor: float) -> bool:
    """Whether `asv continuous` lists the head as worse (asv 0.6's compare on the recorded samples)."""
    from asv.commands.compare import _is_result_better
    from asv_runner.statistics import compute_stats

    (ra, sa), (rb, sb) = compute_stats(list(base), 1), compute_stats(list(head), 1)
    return _is_result_better(ra, rb, (sa, list(base)), (sb, list(head)), factor)


def judge(base: np.ndarray, head: np.ndarray, factor: float) -> dict[str, str]:
    """{judge: failed | loud | silent} for one pair."""
    flagged = asv_flags(base, head, factor)
    d = decision.decide(base, head, "lower", factor - 1.0)
    said = (asv_gate.Outcome(asv_gate.REGRESSION, "asv", [f"{NAME} (asv row)"]) if flagged
            else asv_gate.Outcome(asv_gate.CLEAN, "asv"))
    gate = asv_gate.judged(said, {NAME: d}, "pass")
    return {
        "asv": "failed" if flagged else "silent",
        "rule": "failed" if d.status == decision.REGRESSED else "loud" if d.status == decision.INCONCLUSIVE else "silent",
        "gate": "failed" if gate.code != asv_gate.CLEAN else "loud" if gate.inconclusive else "silent",
    }


def run(trials: int, factor: float) -> list[dict]:
    shifts = (1.0, factor, 1.0 + 2 * (factor - 1.0), 1.0 / (1.0 + 2 * (factor - 1.0)))
    rows = []
    for family in FAMILIES:
        for n in SAMPLES:
            for sigma in SPREADS:
                for shift in shifts:
                    counts = {j: Counter() for j in ("asv", "rule", "gate")}
                    for seed in range(trials):
                        rng = np.random.default_rng([seed, n, int(sigma * 1000), int(round(shift * 1000))])
                        for j, verdict in judge(draw(rng, family, n, sigma), draw(rng, family, n, sigma, shift), factor).items():
                            counts[j][verdict] += 1
                    rows.append({"family": family, "samples": n, "sigma": sigma, "shift": round(shift, 4),
                                 **{j: dict(c) for j, c in counts.items()}})
                print(f"gate_noise: {family} n={n} sigma={sigma} done", file=sys.stderr, flush=True)
    return rows


def totals(rows: list[dict], shift: float) -> dict[str, Counter]:
    out = {j: Counter() for j in ("asv", "rule", "gate")}
    for row in (r for r in rows if r["shift"] == round(shift, 4)):
        for j in out:
            out[j].update(row[j])
    return out


def render(rows: list[dict], trials: int, factor: float, command: str) -> str:
    cell = lambda c: f"{c.get('failed', 0)} / {c.get('loud', 0)} / {c.get('silent', 0)}"  # noqa: E731
    lines = [f"# Gate noise: asv's test, the harness rule and the asv gate ({trials} seeded pairs per row, factor {factor:g})",
             "", f"Command: `{command}`", "",
             "Each cell: failed / loud (passed with an INCONCLUSIVE line) / silent (passed, nothing said).", "",
             "| noise | samples | spread | true shift | asv | rule | gate |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['family']} | {r['samples']} | {r['sigma']:.0%} | {r['shift']:g} | {cell(r['asv'])} | {cell(r['rule'])} | "
              f"{cell(r['gate'])} |" for r in rows]
    lines += ["", "Totals over every row of a shift:", "", "| true shift | asv | rule | gate |", "|---|---|---|---|"]
    for shift in sorted({r["shift"] for r in rows}):
        t = totals(rows, shift)
        lines.append(f"| {shift:g} | {cell(t['asv'])} | {cell(t['rule'])} | {cell(t['gate'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.experiments.gate_noise", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--factor", type=asv_gate.factor_arg, default=1.05)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    targets = [args.out_dir / "gate-noise.md", args.out_dir / "gate-noise.json"]
    if existing := [str(p) for p in targets if p.exists()]:
        print(f"gate_noise: {', '.join(existing)} exist: nothing was run (choose another OUT_DIR)", file=sys.stderr)
        return 2
    command = "python -m ci.experiments.gate_noise OUT_DIR" + (f" --trials {args.trials}" if args.trials != 300 else "") + (
        f" --factor {args.factor:g}" if args.factor != 1.05 else "")
    rows = run(args.trials, args.factor)
    targets[0].write_text(render(rows, args.trials, args.factor, command))
    targets[1].write_text(json.dumps({"command": command, "trials": args.trials, "factor": args.factor, "rows": rows}, indent=1))
    aa, double = totals(rows, 1.0)["gate"], totals(rows, 1.0 + 2 * (args.factor - 1.0))["gate"]
    ok = aa.get("failed", 0) == 0 and double.get("silent", 0) == 0
    print(f"gate_noise: A/A failed by the gate {aa.get('failed', 0)}, true {2 * (args.factor - 1):.0%} slowdowns silent "
          f"{double.get('silent', 0)}: {'OK' if ok else 'CRITERIA NOT MET'} ({targets[0]})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
