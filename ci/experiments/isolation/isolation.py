"""Timing isolation: do GPU A's headline timings move while GPU B runs a memory-bound load?

usage: python -m ci.experiments.isolation OUT_DIR [--gpus 0,1] [--rounds 3] [--repeats 20] [--scale prod|ci]
                                      [--scenarios b1-l4096,b32-l4096] [--pin auto|off|on]

Three processes. This one (no CUDA) orchestrates; a measuring process bound to GPU A
(CUDA_VISIBLE_DEVICES) builds each glm5-tp8 production case's pool once and, per block,
measures cast_us of stock and gather_cast and the decode step's device time with the harness's
own measurement code; a neighbour bound to GPU B casts a production-size FP8 layer to BF16 in a
loop (stock's `.to(bfloat16)`, memory-bound) during the loaded blocks only. Blocks alternate in
ABBA order (idle, loaded, loaded, idle, ...) so a slow drift cancels. Each metric's idle samples
(base) and loaded samples (head) are judged with the gate's decision rule (harness.gate.decision: a
bootstrap interval on the ratio of medians, tolerance --tolerance); per-round ratios give the
spread. With --pin auto, if any metric moved (status regressed or slower), the whole experiment
is repeated with every process pinned to its GPU's NUMA-local cores and one torch thread
(suites.plugins.cpu_affinity), to see whether host contention explains it.
Writes OUT_DIR/isolation.json (every sample) and OUT_DIR/isolation.md (the table).
Without CUDA the same processes run on the CPU (host-timed, --scale ci): a smoke test of the
protocol, not a GPU measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SCENARIOS = ("b1-l4096", "b32-l4096")
STRATEGIES = ("stock", "gather_cast")
MOVED = ("regressed", "slower")


def abba(rounds: int) -> list[str]:
    """Block order: idle, loaded, loaded, idle, idle, loaded, ... (2 * rounds blocks)."""
    return [label for r in range(rounds) for label in (("idle", "loaded") if r % 2 == 0 else ("loaded", "idle"))]


def judge(base, head, tolerance: float, better: str = "lower") -> dict:
    """Decision on loaded (head) vs idle (base) samples: {status, ratio, low, high, rule}."""
    from harness.gate.decision import decide

    d = decide(base, head, better, tolerance)
    return {"status": d.status, "ratio": d.ratio, "low": d.low, "high": d.high, "rule": "harness.gate.decision"}


def summarize(blocks: list[dict], tolerance: float) -> list[dict]:
    """Per (scenario, strategy, metric): pooled idle vs loaded decision and the per-round ratio spread."""
    keys = sorted({(b["scenario"], b["strategy"], b["metric"]) for b in blocks})
    out = []
    for key in keys:
        mine = [b for b in blocks if (b["scenario"], b["strategy"], b["metric"]) == key]
        base = [v for b in mine if b["load"] == "idle" for v in b["samples"]]
        head = [v for b in mine if b["load"] == "loaded" for v in b["samples"]]
        rounds = sorted({b["round"] for b in mine})
        per_round = []
        for r in rounds:
            med = {b["load"]: float(np.median(b["samples"])) for b in mine if b["round"] == r}
            if "idle" in med and "loaded" in med:
                per_round.append(med["loaded"] / med["idle"])
        row = dict(zip(("scenario", "strategy", "metric"), key))
        row.update(judge(base, head, tolerance), idle_median=float(np.median(base)), loaded_median=float(np.median(head)),
                   round_ratios=per_round, samples=(len(base), len(head)))
        out.append(row)
    return out


def table(rows: list[dict], title: str) -> str:
    lines = [f"### {title}", "", "| scenario | strategy | metric | idle median | loaded median | loaded/idle (99% CI) | per-round ratios | decision |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = f"{r['ratio']:.3f} ({r['low']:.3f}-{r['high']:.3f})" if r["low"] is not None else f"{r['ratio']:.3f}"
        spread = ", ".join(f"{x:.3f}" for x in r["round_ratios"])
        lines.append(f"| {r['scenario']} | {r['strategy']} | {r['metric']} | {r['idle_median']:.4g} | "
                     f"{r['loaded_median']:.4g} | {ci} | {spread} | {r['status']} |")
    return "\n".join(lines) + "\n"


# ---- child processes -------------------------------------------------------------------------


def _pin(pin: bool) -> list[int] | None:
    if not pin:
        return None
    from suites.plugins.cpu_affinity import pin_to_gpu

    return sorted(pin_to_gpu(os.environ["CUDA_VISIBLE_DEVICES"], threads=1))


def _sessions(case, device):
    """(open_session(strategy), measure(session, repeats)) over one built prepared case."""
    from harness.execute.prepared import PreparedCase
    from harness.measure.collect import measure

    prepared = PreparedCase(case, device, "auto").build()
    return prepared.session, measure


def measure_child(args) -> None:
    """Bound to GPU A: build every scenario's pool, then answer 'measure' lines with JSON rows."""
    pinned = _pin(args.pin_child)
    import torch

    from harness.inputs.cases import load_case

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cpu" and args.scale == "prod":
        raise SystemExit("error: --scale prod needs a CUDA device (22 GB pools); use --scale ci on the CPU")
    prepared = {sc: _sessions(load_case(f"glm5-tp8.{args.scale}.{sc}"), device) for sc in args.scenarios.split(",")}
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    print(json.dumps({"ready": True, "pinned": pinned, "gpu": name}), flush=True)
    for _ in sys.stdin:
        rows = []
        for scenario, (session_of, measure) in prepared.items():
            for strategy in STRATEGIES:
                with session_of(strategy) as session:
                    session.run_all(())
                    metrics = measure(session, args.repeats).metrics
                step = "step_device_ms" if "step_device_ms" in metrics else "step_ms"
                for metric in ("cast_us", step):
                    if metric in metrics:
                        rows.append({"scenario": scenario, "strategy": strategy, "metric": metric,
                                     "samples": list(metrics[metric].values)})
        print(json.dumps({"rows": rows}), flush=True)


def neighbour_child(args) -> None:
    """Bound to GPU B: on 'run', stock's whole-layer cast in a loop until the next command (then it
    reports its bandwidth); exits when stdin closes. Between runs it only holds its context and memory."""
    import queue
    import threading

    pinned = _pin(args.pin_child)
    import torch

    from harness.spec.presets import get_scale

    device = "cuda" if torch.cuda.is_available() else "cpu"
    src = torch.randint(0, 0x7E, (get_scale(args.scale).slots + 1, 1, 576), dtype=torch.uint8, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    src.view(torch.float8_e4m3fn).to(torch.bfloat16)
    sync()
    commands: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [*(commands.put(line.strip()) for line in sys.stdin), commands.put("exit")],
                     daemon=True).start()
    print(json.dumps({"ready": True, "pinned": pinned}), flush=True)
    while (command := commands.get()) != "exit":
        if command != "run":
            continue
        print(json.dumps({"running": True}), flush=True)
        casts, t0 = 0, time.perf_counter()
        while commands.empty():
            for _ in range(20):
                src.view(torch.float8_e4m3fn).to(torch.bfloat16)  # stock's cast (harness/strategies/stock.py)
            sync()
            casts += 20
        seconds = time.perf_counter() - t0
        print(json.dumps({"casts": casts, "seconds": seconds, "gbps": casts * src.numel() * 3 / seconds / 1e9}), flush=True)


# ---- orchestration ----------------------------------------------------------------------------


def _spawn(role: str, gpu: str, args, pin: bool) -> subprocess.Popen:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    cmd = [sys.executable, "-m", "ci.experiments.isolation", "--role", role, "--scenarios", args.scenarios, "--repeats", str(args.repeats),
           "--scale", args.scale]
    cmd += ["--pin-child"] if pin else []
    return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)


def _read(proc: subprocess.Popen, what: str) -> dict:
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{what} exited (code {proc.wait()}) without answering")
    return json.loads(line)


def experiment(args, pin: bool, log) -> dict:
    """Interleaved idle / loaded blocks on GPU A; returns {pinned, blocks, neighbour, rows}."""
    gpu_a, gpu_b = args.gpus.split(",")[:2]
    meter, neighbour = _spawn("measure", gpu_a, args, pin), _spawn("neighbour", gpu_b, args, pin)
    blocks, neighbour_runs = [], []
    try:
        ready = _read(meter, "measuring process")
        _read(neighbour, "neighbour")
        log(f"measuring on GPU {gpu_a} ({ready['gpu']}), neighbour on GPU {gpu_b}, pinned: {ready['pinned']}")
        for i, load in enumerate(abba(args.rounds)):
            if load == "loaded":
                neighbour.stdin.write("run\n")
                _read(neighbour, "neighbour")
            t0 = time.time()
            meter.stdin.write("measure\n")
            rows = _read(meter, "measuring process")["rows"]
            note = ""
            if load == "loaded":
                neighbour.stdin.write("pause\n")
                neighbour_runs.append(_read(neighbour, "neighbour"))
                note = f"  neighbour {neighbour_runs[-1]['gbps']:.0f} GB/s over {neighbour_runs[-1]['seconds']:.1f} s"
            blocks += [{**row, "round": i // 2, "block": i, "load": load} for row in rows]
            log(f"block {i} {load:6s} {time.time() - t0:5.1f} s{note}")
    finally:
        for proc in (meter, neighbour):
            proc.stdin.close()
            proc.wait(120)
    return {"pinned": pin, "blocks": blocks, "neighbour": neighbour_runs, "rows": summarize(blocks, args.tolerance)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--gpus", default="0,1", help="GPU A (measured), GPU B (neighbour): CUDA_VISIBLE_DEVICES entries")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--scale", choices=("prod", "ci"), default="prod", help="glm5-tp8 case scale (ci: CPU smoke test)")
    parser.add_argument("--tolerance", type=float, default=0.10, help="the gate's max regression (0.10 = 10%%)")
    parser.add_argument("--pin", choices=("auto", "off", "on"), default="auto")
    parser.add_argument("--role", choices=("measure", "neighbour"), help=argparse.SUPPRESS)
    parser.add_argument("--pin-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "measure":
        measure_child(args)
        return 0
    if args.role == "neighbour":
        neighbour_child(args)
        return 0
    if args.out is None or len(args.gpus.split(",")) < 2:
        parser.error("give OUT_DIR and two GPUs (--gpus A,B)")
    args.out.mkdir(parents=True, exist_ok=True)
    log = lambda text: print(text, flush=True)  # noqa: E731
    runs = [experiment(args, args.pin == "on", log)]
    moved = [r for r in runs[0]["rows"] if r["status"] in MOVED]
    if args.pin == "auto" and moved:
        log(f"{len(moved)} metric(s) moved under load: repeating with NUMA-local CPU affinity and 1 torch thread")
        runs.append(experiment(args, True, log))
    (args.out / "isolation.json").write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "out"} | {"out": str(args.out)},
                                                           "runs": runs}, indent=1))
    md = "".join(table(r["rows"], "pinned to NUMA-local cores, 1 torch thread" if r["pinned"] else "unpinned") + "\n" for r in runs)
    (args.out / "isolation.md").write_text(md)
    print(md)
    final = runs[-1]["rows"]
    worst = max(final, key=lambda r: r["ratio"] if not math.isnan(r["ratio"]) else 0)
    print(f"worst loaded/idle ratio: {worst['ratio']:.3f} ({worst['scenario']} {worst['strategy']} {worst['metric']}, "
          f"{worst['status']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
