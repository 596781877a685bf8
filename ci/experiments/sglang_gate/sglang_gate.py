"""The SGLang gate on the fixture repository's commits (ci/make_sglang_fixture_repo.sh), issue 26. GPU.

usage: python -m ci.experiments.sglang_gate OUT_DIR --fixture REPO [--scenario b32-l4096]
           [--strategy sglang_flashinfer] [--scale prod] [--repeats 20] [--stages LIST] [--deadline SECONDS] [--machine h200]

Both gates, on the pairs and with the outcomes the fixture plants:
  b vs a  (b casts only the rows the plan reads)  improved, verdict pass: exit 0
  c vs b  (that cast done twice)                  slower beyond the tolerance: exit 1
  d vs b  (rows read one index off)               verdict pass -> fail: exit 1
1. `harness compare`: `python -m ci.sglang_gate --json` per commit (glm5-tp8, prod, the scenario, the
   strategy; `stock` runs too, the bitwise anchor), then `python -m harness compare` per pair.
2. the asv gate: `python -m ci.sglang_gate --sglang-repo REPO BASE HEAD` per pair.
--stages orders them (default: runs and compares a, b, d, c, then asv d/b, c/b, b/a).
Writes OUT_DIR/summary.json and summary.md after every stage (a cut run keeps what it did), every
command's output to OUT_DIR/run.log and the results JSON files to OUT_DIR/results/; exits 0 when every
finished pair met its expectation and nothing was left out, 1 otherwise. Environment: CUDA, the FlashInfer
and SGLang bundles and asv importable (ci/gpu_env.sh, asv wheels on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

PAIRS = (("a", "b", 0), ("b", "c", 1), ("b", "d", 1))  # base, head, expected exit of both gates
STAGES = "run:a,run:b,compare:b,run:d,compare:d,run:c,compare:c,asv:d,asv:c,asv:b"  # a cut run keeps the first
MEANING = {"b": "gather-cast of the plan's rows", "c": "planted slowdown (cast twice)", "d": "planted bug (index off)"}


def run(cmd: list[str], log: Path) -> tuple[int, str, float]:
    """Run `cmd` from the checkout, its output appended to `log`: (exit, output, seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    seconds = time.perf_counter() - t0
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}[exit {proc.returncode} in {seconds:.1f} s]\n")
    return proc.returncode, proc.stdout + proc.stderr, seconds


def gate_lines(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if line.startswith("asv-gate:")]


def table(output: str) -> list[str]:
    """The compare output's lines, blank ones dropped."""
    return [line.rstrip() for line in output.splitlines() if line.strip()]


def write(out: Path, doc: dict) -> None:
    (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# SGLang gate on the fixture commits ({doc['scenario']}, {doc['strategy']}, glm5-tp8 {doc['scale']})", "",
             f"Commits: {', '.join(f'{k} {v[:8]}' for k, v in doc['commits'].items())}. {doc['device']}.", "",
             "| pair | meaning | expected | harness compare | asv gate |", "|---|---|---|---|---|"]
    for pair in doc["pairs"]:
        cmp, asv = pair.get("compare", {}), pair.get("asv", {})
        lines.append(f"| {pair['head']} vs {pair['base']} | {MEANING[pair['head']]} | exit {pair['expected']} | "
                     f"exit {cmp.get('exit', '-')} | exit {asv.get('exit', '-')} |")
    lines += ["", "## harness run", ""] + [f"- {k}: exit {v['exit']} in {v['seconds']} s" for k, v in doc["runs"].items()]
    for pair in doc["pairs"]:
        lines += ["", f"## {pair['head']} vs {pair['base']}", ""]
        if "compare" in pair:
            lines += ["`python -m harness compare` (exit %d):" % pair["compare"]["exit"], "", "```", *pair["compare"]["table"], "```"]
        if "asv" in pair:
            lines += ["", f"asv gate (exit {pair['asv']['exit']}, {pair['asv']['seconds']} s):", "", "```", *pair["asv"]["gate"], "```"]
    lines += ["", f"Met: {doc['met']}. Left out: {', '.join(doc['left_out']) or 'nothing'}."]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.experiments.sglang_gate", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--fixture", type=Path, required=True, help="the repo ci/make_sglang_fixture_repo.sh made")
    parser.add_argument("--scenario", default="b32-l4096")
    parser.add_argument("--strategy", default="sglang_flashinfer")
    parser.add_argument("--scale", default="prod", help="pool scale of the harness runs (prod; ci for a CPU smoke run)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--deadline", type=float, default=540.0, help="start no stage that would end after this many seconds")
    parser.add_argument("--machine", default="h200")
    parser.add_argument("--stages", default=STAGES, help=f"what to run, in order (default {STAGES}): run:COMMIT, "
                        "compare:HEAD, asv:HEAD (a pair is named by its head: b, c, d)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results").mkdir(exist_ok=True)
    log, t0 = args.out / "run.log", time.perf_counter()
    import torch

    commits = {c: subprocess.run(["git", "-C", str(args.fixture), "rev-parse", c], capture_output=True, text=True,
                                 check=True).stdout.strip() for c in "abcd"}
    doc = {"scenario": args.scenario, "strategy": args.strategy, "scale": args.scale, "commits": commits, "repeats": args.repeats,
           "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device",
           "runs": {}, "pairs": [dict(base=b, head=h, expected=e) for b, h, e in PAIRS], "left_out": [], "met": False}
    gate = [sys.executable, "-m", "ci.sglang_gate", "--sglang-repo", str(args.fixture)]
    harness_args = ["--preset", "glm5-tp8", "--scale", args.scale, "--scenario", args.scenario, "--strategy", args.strategy,
                    "--repeats", str(args.repeats)]
    by_head = {p["head"]: p for p in doc["pairs"]}  # a pair is named by its head commit
    stages = [(kind, item if kind == "run" else by_head[item]) for kind, item in (s.split(":") for s in args.stages.split(","))]
    longest = 0.0
    for kind, item in stages:
        name = item if kind == "run" else f"{kind} {item['head']} vs {item['base']}"
        if time.perf_counter() - t0 + (longest if kind != "compare" else 0) > args.deadline:
            doc["left_out"].append(name)
            continue
        if kind == "run":
            code, output, s = run([*gate, "--json", str(args.out / "results" / f"{item}.json"), item, "--", *harness_args], log)
            doc["runs"][item] = {"exit": code, "seconds": round(s, 1)}
        elif kind == "compare":
            paths = [args.out / "results" / f"{c}.json" for c in (item["base"], item["head"])]
            if not all(p.exists() for p in paths):
                doc["left_out"].append(name)
                continue
            code, output, s = run([sys.executable, "-m", "harness", "compare", *map(str, paths)], log)
            item["compare"] = {"exit": code, "table": table(output)}
        else:
            code, output, s = run([*gate, "--machine", args.machine, "--bench", r"benchmarks\.(CastUs|AttnUs|StepDeviceMs|Verdict)\.",
                                   item["base"], item["head"], "--", "--show-stderr"], log)
            item["asv"] = {"exit": code, "seconds": round(s, 1), "gate": gate_lines(output)}
        longest = max(longest, s if kind != "compare" else 0)
        print(f"{name}: exit {code} in {s:.1f} s", flush=True)
        finished = [p for p in doc["pairs"] if "compare" in p or "asv" in p]
        doc["met"] = bool(finished) and not doc["left_out"] and all(
            p[g]["exit"] == p["expected"] for p in doc["pairs"] for g in ("compare", "asv") if g in p)
        write(args.out, doc)
    doc["met"] = doc["met"] and all(g in p for p in doc["pairs"] for g in ("compare", "asv"))
    write(args.out, doc)
    return 0 if doc["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
