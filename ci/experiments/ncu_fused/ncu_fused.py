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
One launch's ncu time is the sum, over the kernels one call launches, of each kernel's median duration.
Writes OUT_DIR/summary.json and summary.md (and each scenario's measure JSON and ncu CSV); exits 0 when
every scenario's ncu time lies within the tolerance of the harness's attn_us median, 1 otherwise.
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
    """One call's ncu figures: per kernel name, the median over the launches; summed over the names."""
    by_name: dict[str, list[dict]] = {}
    for k in kernels:
        by_name.setdefault(k["name"], []).append(k)
    uneven = {n: len(ks) for n, ks in by_name.items() if len(ks) != launches}
    if uneven:
        raise ValueError(f"expected each kernel {launches} times, got {uneven}")
    med = {n: {f: statistics.median(k[f] for k in ks) for f in ("ns", "read", "write")} for n, ks in by_name.items()}
    return {"us": sum(m["ns"] for m in med.values()) / 1e3, "dram_bytes": sum(m["read"] + m["write"] for m in med.values()),
            "kernels": {n: {"us": m["ns"] / 1e3, "dram_bytes": m["read"] + m["write"]} for n, m in med.items()}}


def judge(scenario: str, measured: dict, ncu: dict, tolerance: float) -> dict:
    """The harness's attn_us median beside ncu's per-launch time, and both against the attention's byte floor."""
    from harness.results.roofline import floor_us as roofline_floor_us

    harness_us = statistics.median(measured["attn_us"])
    floor_us = roofline_floor_us(measured["attn_bytes"], measured["copy_gbps"])
    ratio = ncu["us"] / harness_us
    return {"scenario": scenario, "harness_attn_us": harness_us, "ncu_us": ncu["us"], "ratio": ratio,
            "agree": abs(ratio - 1) <= tolerance, "floor_us": floor_us, "harness_floor_ratio": harness_us / floor_us,
            "ncu_floor_ratio": ncu["us"] / floor_us, "attn_bytes": measured["attn_bytes"], "dram_bytes": ncu["dram_bytes"],
            "dram_over_floor_bytes": ncu["dram_bytes"] / measured["attn_bytes"], "kernels": ncu["kernels"]}


def markdown(doc: dict) -> str:
    lines = [f"# Nsight Compute vs the harness's attn_us ({doc['preset']}, {doc['strategy']}, tolerance {doc['tolerance']:.0%})", "",
             "| scenario | harness attn_us | ncu us (one launch) | ncu / harness | agree | floor us | harness / floor | "
             "ncu / floor | DRAM bytes / floor bytes |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["scenarios"]:
        lines.append(f"| {r['scenario']} | {r['harness_attn_us']:.1f} | {r['ncu_us']:.1f} | {r['ratio']:.3f} | "
                     f"{'yes' if r['agree'] else 'NO'} | {r['floor_us']:.1f} | {r['harness_floor_ratio']:.2f} | "
                     f"{r['ncu_floor_ratio']:.2f} | {r['dram_over_floor_bytes']:.3f} |")
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
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"preset": args.preset, "strategy": args.strategy, "tolerance": args.tolerance, "scenarios": [],
           "command": " ".join(["python -m ci.experiments.ncu_fused", *(argv if argv is not None else sys.argv[1:])])}
    for scenario in args.scenario or HEADLINE:
        common = ["--preset", args.preset, "--scenario", scenario, "--strategy", args.strategy]
        measured_path, csv_path = args.out / f"{scenario}-measure.json", args.out / f"{scenario}-ncu.csv"
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
