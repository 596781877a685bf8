"""Issue 26's H200 evidence: the installed SGLang's decode path (sglang_flashinfer) beside stock.

    python -m ci.experiments.sglang_h200 OUT [--repeats N] [--runs PRESET:SCENARIO ...]

(after `. ci/gpu_env.sh ... SGLANG_BUNDLE`). Runs, in ONE process (SGLang is imported once,
about 24 s), for each preset and scenario: `python -m harness run --scale prod --preset P
--scenario S --strategy stock --strategy sglang_flashinfer --strategy sglang_fa3 --json
OUT/run-P-S.json` (the CLI's own main, in-process), then judges sglang_flashinfer's
step_device_ms against stock's from the same run with the gate's decision rule
(harness.gate.decision.decide, 99% bootstrap interval, 5% tolerance). Writes OUT/summary.json and
OUT/summary.md (one row per run: exit code, verdicts, stock and sglang_flashinfer medians,
ratio and interval, the rule's status, sglang_fa3's reason)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

RUNS = [f"{p}:{s}" for p in ("glm5-tp8", "deepseek-v3-tp8") for s in ("b1-l500", "b1-l4096", "b32-l4096", "b128-l2048")]
STRATEGIES = ("stock", "sglang_flashinfer", "sglang_fa3")
TOLERANCE = 0.05  # harness compare's default --max-regression


def _samples(rows, strategy: str, metric: str) -> list[float]:
    return next((r["samples"] for r in rows if r["strategy"] == strategy and r["metric"] == metric), [])


def judge(path: Path) -> dict:
    """sglang_flashinfer's step_device_ms against stock's in one results file, and the verdicts."""
    from harness.gate.decision import decide

    data = json.loads(path.read_text())
    rows = data["rows"]
    verdicts = {r["strategy"]: r["value"] for r in rows if r["metric"] == "verdict"}
    reasons = {r["strategy"]: (r.get("detail") or {}).get("reason", "") for r in rows if r["metric"] == "verdict"}
    out = {"verdicts": verdicts, "reasons": reasons}
    stock, ours = _samples(rows, "stock", "step_device_ms"), _samples(rows, "sglang_flashinfer", "step_device_ms")
    if stock and ours:
        d = decide(stock, ours, "lower", TOLERANCE)
        med = lambda xs: sorted(xs)[len(xs) // 2] if len(xs) % 2 else sum(sorted(xs)[len(xs) // 2 - 1:len(xs) // 2 + 1]) / 2  # noqa: E731
        out.update(stock_ms=med(stock), sglang_ms=med(ours), ratio=d.ratio, low=d.low, high=d.high, status=d.status, n=(len(stock), len(ours)))
    return out


def main(argv=None) -> int:
    from harness.cli import main as harness_main

    ap = argparse.ArgumentParser(prog="python -m ci.experiments.sglang_h200")
    ap.add_argument("out", type=Path)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--runs", nargs="*", default=RUNS, help="PRESET:SCENARIO (default: both presets x four scenarios)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = []
    for run in args.runs:
        preset, scenario = run.split(":")
        path = args.out / f"run-{preset}-{scenario}.json"
        cmd = ["run", "--scale", "prod", "--preset", preset, "--scenario", scenario, "--repeats", str(args.repeats),
               *[a for s in STRATEGIES for a in ("--strategy", s)], "--json", str(path)]
        t0 = time.monotonic()
        try:
            rc = harness_main(cmd)
        except SystemExit as exc:
            rc = exc.code
        except Exception as exc:  # one run's crash must not lose the others
            print(f"{run}: {type(exc).__name__}: {exc}", flush=True)
            rc = "crash"
        entry = {"run": run, "command": "python -m harness " + " ".join(cmd), "rc": rc, "wall_s": round(time.monotonic() - t0, 1)}
        if path.exists():
            entry.update(judge(path))
        summary.append(entry)
        print(json.dumps(entry), flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "summary.md").write_text(table(summary))
    print(table(summary))
    return 0 if all(e["rc"] == 0 for e in summary) else 1


def table(summary) -> str:
    lines = ["| run | exit | stock | sglang_flashinfer | stock step_device_ms | sglang_flashinfer step_device_ms | ratio [99% CI] | rule | sglang_fa3 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in summary:
        v = e.get("verdicts", {})
        ci = f"{e['ratio']:.4f} [{e['low']:.4f}, {e['high']:.4f}]" if e.get("low") is not None else "-"
        lines.append(f"| {e['run']} | {e['rc']} | {v.get('stock', '-')} | {v.get('sglang_flashinfer', '-')} | "
                     f"{e.get('stock_ms', float('nan')):.3f} | {e.get('sglang_ms', float('nan')):.3f} | {ci} | {e.get('status', '-')} | "
                     f"{v.get('sglang_fa3', '-')}: {e.get('reasons', {}).get('sglang_fa3', '')} |")
    return "\n".join(lines) + "\n"
