"""The harness's attn_us beside Nsight Compute's kernel time and DRAM bytes of the same launch (issue 28). GPU.

usage: python -m ci.experiments.ncu_fused OUT_DIR [--preset glm5-tp8] [--scenario b32-l4096 ...]
           [--strategy fused_fp8] [--repeats 20] [--launches 5] [--tolerance 0.05] [--ncu ncu]

Per scenario, two processes on the same production case (ci/experiments/ncu_fused/launch.py):
1. `measure`: the harness's own attn_us (layer 0's attention, cold L2, graph rounds), the attention's byte
   floor (harness.results.roofline) and the control copy bandwidth;
2. the same attention call, `--launches` times inside an NVTX range, under
   `ncu --clock-control none --nvtx --nvtx-include attn/` collecting gpu__time_duration.sum and
   dram__bytes_{read,write}.sum of every kernel in the range (ncu flushes the caches before each kernel:
   cold L2, as the harness times it).
ncu replays each kernel alone, so it times a call of several kernels serialized. When they run one after
the other (decode, then a merge kernel) the call is their sum; when they run beside each other (the
cluster-merge launch and the launch for the requests past its wave, which waits for it at its end) the
call lies between the longest kernel and the sum. The harness's attn_us median H agrees when
longest <= H * (1 + tolerance) and sum >= H * (1 - tolerance): for a call of one kernel, |ncu / H - 1| <= tolerance.
(Range replay, `--replay-mode range`, keeps the overlap but times each NVTX range from its start on the
host side: 187-324 us for these 5-65 us calls on the H200, so it is not used.)
Beside both, the measure process's third timer: CUPTI's kernel records (torch.profiler) of the timer's graph, the
first kernel's start to the last one's end over its calls (ci/experiments/ncu_fused/launch.py cupti_per_call);
unlike ncu it leaves the calls overlapping as the graph runs them, so it checks attn_us where ncu cannot
(reported, not part of the agreement above).
Writes OUT_DIR/summary.json and summary.md (and each scenario's measure JSON and ncu CSV); exits 0 when
every scenario agrees, 1 otherwise. `--judge-only` judges the files already in OUT_DIR again (no GPU).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")
HEADLINE = ("b32-l4096", "b128-l2048")


def ncu_command(ncu: str, csv_path: Path, launch_args: list[str]) -> list[str]:
    return [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", "attn/", "--metrics", ",".join(METRICS),
            "--csv", "--page", "raw", "--print-units", "base", "--log-file", str(csv_path),
            sys.executable, "-m", "ci.experiments.ncu_fused.launch", "profile", *launch_args]


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_ncu_csv(text: str) -> list[dict]:
    """Kernel rows of `ncu --csv --page raw --print-units base`: [{name, ns, read, write}] in launch order.
    Lines before the header (the program's and ncu's own output) and the units row are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") in the log")
    rows = list(csv.DictReader(lines[start:]))
    missing = [m for m in (*METRICS, "Kernel Name") if rows and m not in rows[0]]
    if missing:
        raise ValueError(f"ncu CSV lacks columns {missing}")
    out = []
    for row in rows:
        if not row.get("ID", "").strip().isdigit():
            continue  # the units row
        out.append({"name": row["Kernel Name"], "ns": _number(row[METRICS[0]]), "read": _number(row[METRICS[1]]),
                    "write": _number(row[METRICS[2]])})
    if not out:
        raise ValueError("ncu profiled no kernel inside the NVTX range")
    return out


def per_launch(kernels: list[dict], launches: int) -> dict:
    """One call's ncu figures: the kernels in launch order are `launches` equal calls (a call may launch several
    kernels); per call the sum over its kernels and its longest kernel, the medians over the calls, and each
    kernel's medians."""
    if not kernels or len(kernels) % launches:
        raise ValueError(f"expected a multiple of {launches} kernels (the same ones each call), got {len(kernels)}")
    n = len(kernels) // launches
    calls = [kernels[i * n:(i + 1) * n] for i in range(launches)]
    if any([k["name"] for k in c] != [k["name"] for k in calls[0]] for c in calls):
        raise ValueError("the calls inside the NVTX range did not launch the same kernels")
    med = [{f: statistics.median(c[p][f] for c in calls) for f in ("ns", "read", "write")} for p in range(n)]
    return {"us": statistics.median(sum(k["ns"] for k in c) for c in calls) / 1e3,
            "longest_us": statistics.median(max(k["ns"] for k in c) for c in calls) / 1e3,
            "dram_bytes": statistics.median(sum(k["read"] + k["write"] for k in c) for c in calls),
            "kernels": [{"name": calls[0][p]["name"].split("(")[0], "us": m["ns"] / 1e3, "dram_bytes": m["read"] + m["write"]}
                        for p, m in enumerate(med)]}


def judge(scenario: str, measured: dict, ncu: dict, tolerance: float) -> dict:
    """The harness's attn_us median against ncu's bounds of the call (its longest kernel .. the sum of its
    kernels), and both against the attention's byte floor."""
    from harness.results.roofline import floor_us as roofline_floor_us

    harness_us = statistics.median(measured["attn_us"])
    floor_us = roofline_floor_us(measured["attn_bytes"], measured["copy_gbps"])
    agree = ncu["longest_us"] <= harness_us * (1 + tolerance) and ncu["us"] >= harness_us * (1 - tolerance)
    cupti_us = statistics.median(measured["cupti_us"]) if measured.get("cupti_us") else None
    return {"scenario": scenario, "harness_attn_us": harness_us, "ncu_us": ncu["us"], "ncu_longest_us": ncu["longest_us"],
            "cupti_us": cupti_us, "cupti_ratio": cupti_us / harness_us if cupti_us else None,
            "ratio": ncu["us"] / harness_us, "agree": agree, "floor_us": floor_us,
            "harness_floor_ratio": harness_us / floor_us, "ncu_floor_ratio": ncu["longest_us"] / floor_us,
            "attn_bytes": measured["attn_bytes"], "dram_bytes": ncu["dram_bytes"],
            "dram_over_floor_bytes": ncu["dram_bytes"] / measured["attn_bytes"], "kernels": ncu["kernels"]}


def markdown(doc: dict) -> str:
    lines = [f"# Nsight Compute vs the harness's attn_us ({doc['preset']}, {doc['strategy']}, tolerance {doc['tolerance']:.0%})", "",
             "| scenario | harness attn_us | ncu kernels (us each, alone) | ncu longest / harness | ncu sum / harness | agree | "
             "CUPTI in the graph / harness | floor us | harness / floor | DRAM bytes / floor bytes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["scenarios"]:
        h, cupti = r["harness_attn_us"], r.get("cupti_ratio")
        lines.append(f"| {r['scenario']} | {h:.1f} | {' + '.join(format(k['us'], '.1f') for k in r['kernels'])} | "
                     f"{r['ncu_longest_us'] / h:.3f} | {r['ncu_us'] / h:.3f} | {'yes' if r['agree'] else 'NO'} | "
                     f"{'-' if cupti is None else format(cupti, '.3f')} | "
                     f"{r['floor_us']:.1f} | {r['harness_floor_ratio']:.2f} | {r['dram_over_floor_bytes']:.3f} |")
    lines += ["", f"Agree: {doc['agree']}. Command: `{doc['command']}`."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.experiments.ncu_fused", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", default="glm5-tp8")
    parser.add_argument("--scenario", action="append", help=f"default: {', '.join(HEADLINE)}")
    parser.add_argument("--strategy", default="fused_fp8")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--launches", type=int, default=5)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--ncu", default="ncu")
    parser.add_argument("--judge-only", action="store_true", help="judge the measure JSONs and ncu CSVs already in OUT_DIR")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"preset": args.preset, "strategy": args.strategy, "tolerance": args.tolerance, "scenarios": [],
           "command": " ".join(["python -m ci.experiments.ncu_fused", *(argv if argv is not None else sys.argv[1:])])}
    for scenario in args.scenario or HEADLINE:
        common = ["--preset", args.preset, "--scenario", scenario, "--strategy", args.strategy]
        measured_path, csv_path = args.out / f"{scenario}-measure.json", args.out / f"{scenario}-ncu.csv"
        if not args.judge_only:
            subprocess.run([sys.executable, "-m", "ci.experiments.ncu_fused.launch", "measure", *common, "--repeats",
                            str(args.repeats), "--out", str(measured_path)], check=True)
            subprocess.run(ncu_command(args.ncu, csv_path, [*common, "--launches", str(args.launches)]), check=True)
        ncu = per_launch(parse_ncu_csv(csv_path.read_text()), args.launches)
        doc["scenarios"].append(judge(scenario, json.loads(measured_path.read_text()), ncu, args.tolerance))
        print(f"{scenario}: harness {doc['scenarios'][-1]['harness_attn_us']:.1f} us, ncu {ncu['us']:.1f} us", flush=True)
    doc["agree"] = all(r["agree"] for r in doc["scenarios"])
    (args.out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "summary.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0 if doc["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
