"""One case's layer-0 attention, in a process of its own (GPU): `measure` times it the harness's way and writes
attn_us, the attention's byte floor, the control copy bandwidth and a third timer's figure (cupti_per_call);
`profile` calls it inside the NVTX range "attn" for Nsight Compute (`ncu --nvtx --nvtx-include attn/`), after a
warm-up outside the range.

    python -m ci.experiments.ncu_fused.launch {measure,profile} --preset P --scenario S [--strategy fused_fp8]
        [--repeats 20] [--launches 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from harness.execute.prepared import PreparedCase
from harness.inputs.cases import Case
from harness.measure.collect import layer0, measure
from harness.measure.control import measure_control
from harness.results import roofline
from harness.spec.presets import get_preset, get_scale
from harness.spec.scenario import load_scenario

NVTX_RANGE = "attn"
WARMUP = 3
TRACE_REPLAYS = 10


def timer_calls() -> int:
    """Calls per graph replay of harness.measure.timing's single-kernel timer: flashinfer.testing's default."""
    import inspect

    from flashinfer.testing.utils import bench_gpu_time_with_cudagraph

    return inspect.signature(bench_gpu_time_with_cudagraph).parameters["num_iters_within_graph"].default


def spans_per_call(kernels: list[tuple[float, float]], replays: int, calls: int) -> list[float]:
    """Per replay (the kernels' (start, end) in time order, the replays one after another), the first kernel's
    start to the last one's end, over the replay's calls."""
    if not kernels or len(kernels) % replays:
        raise ValueError(f"expected the same kernels in each of {replays} replays, got {len(kernels)} kernels")
    n = len(kernels) // replays
    return [(max(end for _, end in k) - k[0][0]) / calls for k in (kernels[i * n:(i + 1) * n] for i in range(replays))]


def cupti_per_call(fn, fn_args, calls: int, replays: int = TRACE_REPLAYS) -> list[float]:
    """us per call of a CUDA graph of `calls` calls captured as the timer captures them, from CUPTI's kernel records
    (torch.profiler), not CUDA events: the calls overlap in the graph as they do there (spans_per_call)."""
    from torch.profiler import ProfilerActivity, profile

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn(*fn_args)
    for _ in range(WARMUP):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel")
    return spans_per_call(kernels, replays, calls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.experiments.ncu_fused.launch", description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("measure", "profile"))
    parser.add_argument("--preset", default="glm5-tp8")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--strategy", default="fused_fp8")
    parser.add_argument("--scale", default="prod")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--launches", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    case = Case(get_preset(args.preset), get_scale(args.scale), load_scenario(args.scenario))
    prepared = PreparedCase(case, torch.device("cuda")).build()
    with prepared.session(args.strategy) as session:
        session.run_all(())
        if args.mode == "measure":
            attn = measure(session, args.repeats).metrics["attn_us"]
            last = session.schedule.steps[-1]
            nbytes = roofline.step_bytes(args.strategy, session.strategy.pool.geometry, last, case.preset.heads_per_rank).attn
            calls = timer_calls()
            doc = {"attn_us": list(attn.values), "attn_bytes": nbytes, "copy_gbps": measure_control(torch.device("cuda")).median,
                   "kernel": prepared.backend.name, "cupti_calls": calls, "cupti_us": cupti_per_call(*layer0(session).attend, calls)}
            args.out.write_text(json.dumps(doc) + "\n")
        else:
            fn, fn_args = layer0(session).attend
            for _ in range(WARMUP):
                fn(*fn_args)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(NVTX_RANGE)
            for _ in range(args.launches):
                fn(*fn_args)
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
