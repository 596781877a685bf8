"""Timing: device time through flashinfer.testing on CUDA, host time on CPU.

Metrics (all samples kept): cast_us and attn_us per layer (the cast/gather kernel
alone, the attention kernel alone) and step_ms (the whole layer loop of one decode
step: plan, writes, casts and attention — the attention path's TPOT).
"""

from __future__ import annotations

import gc
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from harness.results.schema import sample_iqr

GRAPH_ROUNDS = 3  # separately captured benchmark calls per single-kernel timing


@dataclass(frozen=True)
class Samples:
    unit: str
    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def iqr(self) -> float | None:
        """The interquartile range; None under 4 samples (results.schema.sample_iqr)."""
        return sample_iqr(self.values)


@contextmanager
def no_gc():
    """Keep Python's garbage collector from pausing the host in the middle of a timed region."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def host_time_ms(fn, repeats: int, warmup: int = 1) -> list[float]:
    """Wall time of fn() in ms, synchronizing a CUDA device if one is in use."""
    for _ in range(warmup):
        fn()
    out = []
    with no_gc():
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def event_time_ms(fn, repeats: int, warmup: int = 3, *, queued: bool = False, before=None) -> list[float]:
    """Device time of fn() in ms between two CUDA events, one sample per call (host work inside fn included).

    queued: every sample's events are recorded back to back and the GPU is synchronized once at the end
    (the host stays ahead, so launch latency hides behind the previous call); otherwise each sample waits
    for its end event. `before()` runs before each call, warm-up included, outside the timed region.
    """
    for _ in range(warmup):
        if before:
            before()
        fn()
    torch.cuda.synchronize()
    marks = []
    with no_gc():
        for _ in range(repeats):
            if before:
                before()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            if not queued:
                end.synchronize()
            marks.append((start, end))
        torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in marks]


def idle_start_ms(fn, repeats: int) -> tuple[list[float], list[float]]:
    """(host ms, end-to-end device ms) of fn() per call, each call starting from an idle GPU: host is the
    time fn() takes to return (planning, copies, launches), end to end the CUDA events around it."""
    host, whole = [], []
    with no_gc():
        for _ in range(repeats):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e3)
            end.record()
            end.synchronize()
            whole.append(start.elapsed_time(end))
    return host, whole


def device_time_ms(fn, repeats: int, *, use_cuda_graph: bool = False, input_args: tuple = ()) -> list[float]:
    """GPU time of fn(*input_args) in ms via flashinfer.testing.bench_gpu_time.

    With `use_cuda_graph` (single kernels): 10 calls per graph replay amortize launch
    latency, and L2 is kept cold by rotating clones of `input_args`. The samples come from
    GRAPH_ROUNDS separate benchmark calls (each its own graph capture and clones), so that a
    shift between captures, seen on an H200 as a 5% A/A jump of a 18 us kernel, lands inside
    one result's samples instead of between two results. Without it (whole decode steps):
    CUDA events around each call, host work such as planning included, no L2 flush (a
    78-layer step streams far more than L2 holds).
    """
    from flashinfer.testing import bench_gpu_time

    rounds = GRAPH_ROUNDS if use_cuda_graph else 1
    per_round = -(-repeats // rounds)
    times: list[float] = []
    with no_gc():
        for _ in range(rounds):
            times += bench_gpu_time(
                fn,
                dry_run_iters=5,
                repeat_iters=per_round,
                cold_l2_cache=use_cuda_graph,
                use_cuda_graph=use_cuda_graph,
                input_args=input_args,
            )
    return [float(t) for t in times[:repeats]]
