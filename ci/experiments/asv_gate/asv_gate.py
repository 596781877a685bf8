"""A/A and planted-slowdown experiment for the asv gate (`python -m ci.asv_gate`, issue: gate trust). GPU.

usage: python -m ci.experiments.asv_gate OUT_DIR --role aa|planted --source REPO [--pairs 5]
           [--fraction 0.10] [--deadline SECONDS] [--machine h200]

The harness gate's own experiment (ci/experiments/gate) interleaves A and B blocks in one
process; this one judges what the perf-gate workflow runs: `asv continuous BASE HEAD` through
ci/asv_gate.py, every commit benchmarked in its own processes and environment. In a clone of
REPO, each pair k is two commits on top of its HEAD: base k (a docs-only change) and head k:
- role aa: another docs-only change (same code): the gate must exit 0 in every pair;
- role planted: the real slowdown below, committed to harness/execute/decode.py: every bucket graph's
  replay is followed by a device-to-device copy calibrated (on first replay, CUDA events) to last
  FRACTION of that graph's replay, i.e. real GPU work inside step_device_ms's timed region. The
  gate must exit 1 in every pair, naming step_device_ms of every scenario.
The benchmarks run are the gating metrics' (cast_us, attn_us, step_device_ms) for gather_cast on the
four headline scenarios at production scale (MLA_ASV_* variables, see suites/asv/benchmarks.py).
Writes OUT_DIR/asv-gate-<role>.json and .md after every pair (a cut run keeps what it did) and
exits 0 when every finished pair met its criterion, 1 otherwise. Environment: the FlashInfer bundle
and asv importable (ci/gpu_env.sh, asv wheels on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HEADLINE = "b1-l500,b1-l4096,b32-l4096,b128-l2048"
GATING_BENCHMARKS = r"benchmarks\.(CastUs|AttnUs|StepDeviceMs)\."
REPLAY = "        self.graph.replay()\n        return {(self.batch.step"
PLANT = '''

def _planted_copy(bucket_graph) -> None:
    """PLANTED SLOWDOWN (ci/experiments/asv_gate): after each replay, a device copy lasting
    FRACTION of this graph's replay time (the replay timed with CUDA events on the first replay,
    the copy calibrated by harness.measure.control.copy_bytes_per_ms)."""
    plant = getattr(bucket_graph, "_plant", None)
    if plant is None:
        from harness.measure.control import copy_bytes_per_ms
        from harness.measure.timing import event_time_ms

        times = event_time_ms(bucket_graph.graph.replay, 7, warmup=0)
        step_ms = sorted(times)[len(times) // 2]
        src = torch.empty(max(1, int(FRACTION * step_ms * copy_bytes_per_ms(torch.device("cuda")))),
                          dtype=torch.uint8, device="cuda")
        plant = bucket_graph._plant = (src, torch.empty_like(src))
    plant[1].copy_(plant[0])
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def plant(repo: Path, fraction: float) -> None:
    """Commit-ready planted slowdown in the clone's harness/execute/decode.py."""
    path = repo / "harness" / "execute" / "decode.py"
    text = path.read_text()
    if REPLAY not in text:
        raise SystemExit(f"asv-gate-experiment: {path}: BucketGraph.replay changed; cannot plant the slowdown")
    text = text.replace(REPLAY, REPLAY.replace("self.graph.replay()\n", "self.graph.replay()\n        _planted_copy(self)\n"))
    path.write_text(text + PLANT.replace("FRACTION * ", f"{fraction!r} * "))


def make_pairs(repo: Path, role: str, pairs: int, fraction: float) -> list[tuple[str, str]]:
    """Branches base<k> / head<k> on top of the clone's HEAD."""
    main = git(repo, "rev-parse", "HEAD")
    note = repo / "docs" / "asv-experiment.txt"
    out = []
    for k in range(pairs):
        git(repo, "checkout", "-q", "-B", f"base{k}", main)
        note.write_text(f"pair {k}: base\n")
        git(repo, "add", str(note))
        git(repo, "commit", "-qm", f"pair {k} base: docs only")
        git(repo, "checkout", "-q", "-B", f"head{k}")
        note.write_text(f"pair {k}: head\n")
        if role == "planted":
            plant(repo, fraction)
        git(repo, "commit", "-qam", f"pair {k} head: " + ("docs only" if role == "aa" else f"planted {fraction:.0%} step slowdown"))
        out.append((f"base{k}", f"head{k}"))
    git(repo, "checkout", "-q", main)
    return out


def gate_env() -> dict[str, str]:
    """The runner's environment minus the source checkout on PYTHONPATH: each commit must import its
    own installed harness (ci/asv_runner_env.py adds PYTHONPATH entries to every commit's env)."""
    env = dict(os.environ)
    cwd = os.path.realpath(os.getcwd())
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and os.path.realpath(p) != cwd)
    env.setdefault("MLA_ASV_SCENARIOS", HEADLINE)
    env.setdefault("MLA_ASV_STRATEGIES", "gather_cast")
    env.setdefault("MLA_ASV_REPEATS", "12")
    return env


def run_pair(repo: Path, base: str, head: str, machine: str, log: Path) -> dict:
    cmd = [sys.executable, "-m", "ci.asv_gate", base, head, "--machine", machine, "--bench", GATING_BENCHMARKS,
           "--show-stderr"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=repo, env=gate_env(), capture_output=True, text=True, errors="replace")
    log.write_text(proc.stdout + proc.stderr)
    lines = [line.strip() for line in proc.stdout.splitlines() if line.startswith("asv-gate:")]
    return {"base": base, "head": head, "exit": proc.returncode, "seconds": round(time.perf_counter() - t0, 1),
            "slower": [line.split("slower: ", 1)[1] for line in lines if "  slower: " in line], "gate_lines": lines}


def rejudge(args) -> bool:
    """Judge each stored pair log (asv's own output, as ci/asv_gate streamed it) with the current gate."""
    from ci.asv_gate import classify

    old = json.loads((args.out / f"asv-gate-{args.role}.json").read_text())
    pairs = []
    for k, pair in enumerate(old["pairs"]):
        output = (args.out / f"asv-gate-{args.role}-{k}.log").read_text()
        asv_part = output.split("\nasv-gate: ", 1)[0]
        asv_exit = re.search(r"\(asv exit (\d+), factor", output)  # the gate's verdict line keeps asv's status
        outcome = classify(int(asv_exit[1]) if asv_exit else 1, asv_part)
        pairs.append({**pair, "exit": outcome.code, "slower": outcome.regressions, "rejudged": True,
                      "not_gating": outcome.informational})
    return write(args.out, args.role, args, pairs, old["scenarios"])


def met(role: str, pair: dict, scenarios: list[str]) -> bool:
    if role == "aa":
        return pair["exit"] == 0
    caught = {s for s in scenarios for item in pair["slower"]
              if item.replace("'", "").startswith(f"benchmarks.StepDeviceMs.time_step_device({s},")}
    return pair["exit"] == 1 and caught == set(scenarios)


def write(out: Path, role: str, args, pairs: list[dict], scenarios: list[str]) -> bool:
    ok = all(met(role, p, scenarios) for p in pairs) and len(pairs) == args.pairs
    (out / f"asv-gate-{role}.json").write_text(json.dumps({"role": role, "fraction": args.fraction if role == "planted" else 0,
                                                           "scenarios": scenarios, "pairs": pairs, "ok": ok}, indent=1))
    what = "A/A: same code" if role == "aa" else f"planted {args.fraction:.0%} step slowdown"
    env = gate_env()
    lines = [f"# asv gate ({what}), `python -m ci.asv_gate BASE HEAD --bench '{GATING_BENCHMARKS}'`", "",
             f"Scenarios {', '.join(scenarios)} · strategy {env['MLA_ASV_STRATEGIES']} · "
             f"{env['MLA_ASV_REPEATS']} samples per benchmark · factor 1.05 (default)", "",
             "| pair | exit | slower (gating) | criterion | seconds |", "|---|---|---|---|---|"]
    for i, p in enumerate(pairs):
        lines.append(f"| {i} | {p['exit']} | {'<br>'.join(p['slower']) or '-'} | {'met' if met(role, p, scenarios) else 'MISSED'} | {p['seconds']} |")
    lines += ["", f"Verdict: {'every pair met its criterion' if ok else f'{len(pairs)} of {args.pairs} pairs run; see MISSED rows'}", ""]
    (out / f"asv-gate-{role}.md").write_text("\n".join(lines))
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--role", choices=("aa", "planted"), required=True)
    parser.add_argument("--source", required=True, help="the repository (path or bundle) to clone")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--fraction", type=float, default=0.10)
    parser.add_argument("--deadline", type=float, default=1e9, help="start no pair after this many seconds")
    parser.add_argument("--machine", default="h200")
    parser.add_argument("--rejudge", action="store_true",
                        help="no GPU: re-read OUT_DIR's stored asv output with this checkout's gate and rewrite the tables")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.rejudge:
        return 0 if rejudge(args) else 1
    repo = args.out / "repo"
    subprocess.run(["git", "clone", "-q", args.source, str(repo)], check=True)
    git(repo, "config", "user.email", "gate@localhost")
    git(repo, "config", "user.name", "asv gate experiment")
    pairs_refs = make_pairs(repo, args.role, args.pairs, args.fraction)
    subprocess.run([sys.executable, "-m", "asv", "machine", "--yes", "--machine", args.machine], cwd=repo,
                   env=gate_env(), check=True, capture_output=True)
    scenarios = gate_env()["MLA_ASV_SCENARIOS"].split(",")
    t0, done, ok = time.perf_counter(), [], False
    for k, (base, head) in enumerate(pairs_refs):
        elapsed = time.perf_counter() - t0
        if done and elapsed + elapsed / len(done) > args.deadline:
            print(f"pair {k}: not started (deadline {args.deadline:.0f} s)", flush=True)
            break
        done.append(run_pair(repo, base, head, args.machine, args.out / f"asv-gate-{args.role}-{k}.log"))
        print(f"pair {k}: exit {done[-1]['exit']} in {done[-1]['seconds']} s; slower: {done[-1]['slower']}", flush=True)
        ok = write(args.out, args.role, args, done, scenarios)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
