"""Where a GPU test process's start-up goes: each phase of a fresh worker's life, timed in order.

usage: python -m ci.experiments.startup_profile OUT.json [--case glm5-tp8.prod.b1-l500]

A fresh child process (as an xdist worker is) times, one after another: interpreter start-up
(from the kernel's process start time), importing pytest + xdist, torch, the harness modules the
tests use, CUDA context creation, importing flashinfer, the first small run of every strategy
(Triton kernel and FlashInfer module loads), then the GPU suite's heaviest first test (every
strategy on CASE: pool build, golden check) twice: the difference is the per-process warm-up a
worker pays before its tests run at steady speed. Also times `pytest --collect-only` of
`suites/ -m gpu` against `suites/gpu`, and keeps `python -X importtime`'s 25 slowest imports.
GPU phases are skipped (with the reason) on a machine without CUDA.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

PHASES_MARK = "PHASES "


def _child(case: str) -> None:
    """Run in a fresh process: print one JSON line of (phase, seconds) in order."""
    from suites.plugins.binding_proof import process_start_time

    phases: list[tuple[str, float]] = []
    start = process_start_time()
    t = time.time()
    if start is not None:
        phases.append(("interpreter start-up", t - start))

    def lap(name: str) -> None:
        nonlocal t
        now = time.time()
        phases.append((name, now - t))
        t = now

    import pytest  # noqa: F401
    import xdist  # noqa: F401

    lap("import pytest + xdist")
    import torch

    lap("import torch")
    import harness.api  # noqa: F401
    import harness.inputs.cases  # noqa: F401
    import suites.helpers  # noqa: F401

    lap("import harness (runner, cases) + suites.helpers")
    skipped = None
    if not torch.cuda.is_available():
        skipped = "no CUDA device: GPU phases skipped"
    else:
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
        lap("CUDA context (first allocation)")
        try:
            import flashinfer  # noqa: F401

            lap("import flashinfer")
        except ImportError as exc:
            skipped = f"flashinfer not importable ({exc}): GPU phases skipped"
    if skipped is None:
        from harness.strategies import ORDER
        from suites.helpers import run_strategies

        device = torch.device("cuda", 0)
        run_strategies("glm5-tp8.ci.b1-l500", ORDER, device=device, backend="flashinfer")
        torch.cuda.synchronize()
        lap("first small run, every strategy (Triton + FlashInfer module loads)")
        for label in ("first", "second"):
            run_strategies(case, ORDER, device=device, backend="flashinfer")
            torch.cuda.synchronize()
            lap(f"{case}, every strategy: {label} run")
    print(PHASES_MARK + json.dumps({"phases": phases, "skipped": skipped}), flush=True)


def _timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - t0, proc


def importtime(modules: str, top: int = 25) -> list[tuple[str, float]]:
    """(module, cumulative seconds) of the `top` slowest top-level imports of `python -c 'import ...'`."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {modules}"], capture_output=True,
                          text=True, timeout=300)
    rows = []
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            name = parts[2].rstrip()
            if not name.startswith("  "):  # top-level imports only (nested ones are inside their parents)
                rows.append((name.strip(), int(parts[1]) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:top]


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--child"]:
        _child(args[1])
        return 0
    if not args or args[0].startswith("-"):  # -h / --help: the usage, not an output file named "--help"
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2 if not args or args[0] not in ("-h", "--help") else 0
    out = Path(args[0])
    case = args[args.index("--case") + 1] if "--case" in args else "glm5-tp8.prod.b1-l500"
    report: dict = {}
    wall, proc = _timed([sys.executable, "-m", "ci.experiments.startup_profile", "--child", case])
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(PHASES_MARK)), None)
    report["worker"] = json.loads(line[len(PHASES_MARK):]) if line else {"error": proc.stderr[-2000:]}
    report["worker"]["wall_s"] = wall
    pytest_cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    report["collect_s"] = {
        "suites/ -m gpu": _timed(pytest_cmd + ["suites/", "-m", "gpu"])[0],
        "suites/gpu -m gpu": _timed(pytest_cmd + ["suites/gpu", "-m", "gpu"])[0],
    }
    report["importtime"] = importtime("torch, harness.api, suites.helpers, xdist")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    for name, seconds in report["worker"].get("phases", []):
        print(f"{seconds:8.2f} s  {name}")
    if report["worker"].get("skipped"):
        print(f"          ({report['worker']['skipped']})")
    for name, seconds in report["collect_s"].items():
        print(f"{seconds:8.2f} s  pytest --collect-only {name} (whole process)")
    print("slowest imports: " + ", ".join(f"{m} {s:.2f} s" for m, s in report["importtime"][:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
