"""TP2 slice on two GPUs (run with `python -m torch.distributed.run --nproc-per-node 2 -m ci.experiments.tp2_allreduce --out DIR`).

1. Measures NCCL all-reduce latency per message size (bf16, 20 back-to-back calls in one CUDA graph,
   CUDA events) and writes it as the latency table `harness tpot --allreduce-table` reads.
2. Checks the one-GPU all-reduce model of the TPOT step: each rank runs the model-shaped step (a TP8
   rank's shapes, a few layers) three ways — real NCCL all-reduce inside the graph, the latency
   stand-in from the table just measured, and no all-reduce — and rank 0 writes all medians.
Two of the eight ranks reduce here: a TP8 all-reduce crosses more GPUs (higher latency), which is
why the table is labeled TP2. NVLink multicast stays off: export NCCL_NVLS_ENABLE=0 before running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from harness.inputs.cases import Case  # noqa: E402
from harness.measure.timing import event_time_ms  # noqa: E402
from harness.spec.presets import get_preset, get_scale  # noqa: E402
from harness.spec.scenario import load_scenario  # noqa: E402
from harness.tpot.allreduce import AllReduce, LatencyAllReduce, NcclAllReduce, load_table  # noqa: E402
from harness.tpot.config import load_shape  # noqa: E402
from harness.tpot.tpot import build_context, time_strategy  # noqa: E402

CALLS_PER_GRAPH = 20


def allreduce_us(numel: int, device, repeats: int = 20) -> tuple[float, str]:
    """(median µs per all-reduce, how it was timed): in a CUDA graph, or eagerly if capture fails."""
    t = torch.ones(numel, dtype=torch.bfloat16, device=device)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # NCCL's watchdog thread polls events
            for _ in range(CALLS_PER_GRAPH):
                dist.all_reduce(t)
        run, how = graph.replay, "cuda-graph"
    except RuntimeError as exc:  # both ranks fail alike: same code, same NCCL
        print(f"all-reduce graph capture failed ({str(exc).splitlines()[0]}); timing eagerly", flush=True)

        def run():
            for _ in range(CALLS_PER_GRAPH):
                dist.all_reduce(t)

        how = "eager"
    times = event_time_ms(run, repeats, warmup=1)
    return statistics.median(times) * 1e3 / CALLS_PER_GRAPH, how


def rank_max(value: float, device) -> float:
    """The slowest rank's value (a step is as slow as its slowest rank); no pickled objects."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--preset", default="glm5-tp8")
    ap.add_argument("--scenario", action="append", help="scenarios of the step check (default b1-l4096, b32-l4096)")
    ap.add_argument("--slots", type=int, default=262_144)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--weight-sets", type=int, default=4)
    ap.add_argument("--strategy", default="gather_cast")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(device)

    shape = load_shape(args.preset)
    step_sizes = [b * shape.hidden_size * 2 for b in (1, 32)]
    sizes = sorted(set([1 << k for k in range(10, 24)] + step_sizes))
    measured = [(n, *allreduce_us(n // 2, device)) for n in sizes]
    points = [(n, rank_max(us, device)) for n, us, _ in measured]
    timed_as = sorted({how for _, _, how in measured})
    table_path = args.out / "allreduce_tp2.toml"
    if rank == 0:
        lines = [f'source = "NCCL all-reduce, {world}x {gpu}, bf16, {"/".join(timed_as)} timing of {CALLS_PER_GRAPH} back-to-back calls, '
                 f'NCCL_NVLS_ENABLE={os.environ.get("NCCL_NVLS_ENABLE", "unset")}, slowest rank"', ""]
        for n, us in points:
            lines += ["[[point]]", f"bytes = {n}", f"us = {us:.3f}", ""]
        table_path.write_text("\n".join(lines))
        print("\n".join(f"all-reduce {n:>9} B: {us:8.2f} us" for n, us in points), flush=True)
    dist.barrier()
    table = load_table(table_path)

    checks = []
    for scenario in args.scenario or ["b1-l4096", "b32-l4096"]:
        case = Case(get_preset(args.preset), get_scale("prod", args.slots, args.layers), load_scenario(scenario))
        ctx = build_context(case, shape, device, "auto", args.weight_sets, NcclAllReduce(), strategies=(args.strategy,))
        result = {"scenario": scenario, "layers": args.layers, "slots": args.slots, "strategy": args.strategy}
        for label, allreduce in (("nccl", ctx.allreduce), ("modeled", LatencyAllReduce(table, device)), ("none", AllReduce())):
            ctx.allreduce = allreduce
            try:
                r = time_strategy(args.strategy, ctx, args.repeats)
            except Exception as exc:  # e.g. NCCL not capturable here: both ranks fail alike, log and go on
                result[f"{label}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                continue
            result[f"{label}_ms"] = rank_max(r.tpot, device)
            result[f"{label}_ms_this_rank"] = r.tpot
            result[f"{label}_kernels"] = r.kernels
        if {"modeled_ms", "nccl_ms", "none_ms"} <= set(result):
            result["modeled_over_nccl"] = result["modeled_ms"] / result["nccl_ms"]
            result["allreduce_share_nccl"] = 1 - result["none_ms"] / result["nccl_ms"]
        checks.append(result)
        if rank == 0:
            print(json.dumps({k: v for k, v in result.items() if not k.endswith("kernels")}), flush=True)
        del ctx
        torch.cuda.empty_cache()
    if rank == 0:
        doc = {"gpu": gpu, "world": world, "table": str(table_path), "nvls": os.environ.get("NCCL_NVLS_ENABLE"),
               "allreduce_points": [{"bytes": n, "us": us} for n, us in points], "step_checks": checks}
        (args.out / "tp2_check.json").write_text(json.dumps(doc, indent=1) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
