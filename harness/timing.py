"""Timing: device time through flashinfer.testing on CUDA, host time on CPU.

Metrics (all samples kept): cast_us and attn_us per layer (the cast/gather kernel
alone, the attention kernel alone) and step_ms (the whole layer loop of one decode
step: plan, writes, casts and attention — the attention path's TPOT).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Samples:
    unit: str
    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def iqr(self) -> float:
        if len(self.values) < 4:
            return 0.0
        q = statistics.quantiles(self.values, n=4)
        return q[2] - q[0]


def host_time_ms(fn, repeats: int, warmup: int = 1) -> list[float]:
    """Wall time of fn() in ms, synchronizing a CUDA device if one is in use."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def device_time_ms(fn, repeats: int, use_cuda_graph: bool = False, cold_l2: bool = True) -> list[float]:
    """GPU time of fn() in ms via flashinfer.testing.bench_gpu_time (CUDA events/CUPTI, cold L2)."""
    from flashinfer.testing import bench_gpu_time

    times = bench_gpu_time(
        fn,
        dry_run_iters=3,
        repeat_iters=repeats,
        cold_l2_cache=cold_l2,
        use_cuda_graph=use_cuda_graph,
    )
    return [float(t) for t in times]
