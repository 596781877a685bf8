"""The control: a fixed reference workload measured in the same run as the metrics.

A copy of a fixed buffer, timed repeatedly: device copy bandwidth with CUDA events on a
GPU, host memcpy bandwidth on CPU. Its rows (metric control_copy_gbps) let `compare`
tell a changed environment (a throttled GPU, a loaded CPU runner) from a changed commit.
"""

from __future__ import annotations

import torch

from harness.measure import clocks
from harness.measure.timing import Samples, event_time_ms, host_time_ms
from harness.results.document import Row

CUDA_BYTES = 1 << 30  # 1 GiB: far past L2, ~0.5 ms per copy on an H200
CPU_BYTES = 64 << 20  # 64 MiB: past a server's last-level cache, ~10-30 ms per copy
REPEATS = 20
WARMUP = 3


def _copy_ms(device: torch.device, nbytes: int, repeats: int) -> list[float]:
    src = torch.full((nbytes,), 7, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    if device.type == "cuda":
        with torch.cuda.device(device):
            return event_time_ms(lambda: dst.copy_(src), repeats, WARMUP, queued=True)
    return host_time_ms(lambda: dst.copy_(src), repeats, WARMUP)


def measure_control(device: torch.device, repeats: int = REPEATS) -> Samples:
    """Copy bandwidth (bytes read + written per second, GB/s) of a fixed buffer, one sample per copy."""
    nbytes = CUDA_BYTES if device.type == "cuda" else CPU_BYTES
    return Samples("GB/s", tuple(2 * nbytes / (ms * 1e-3) / 1e9 for ms in _copy_ms(device, nbytes, repeats)))


def copy_bytes_per_ms(device: torch.device) -> float:
    """Bytes a copy moves per millisecond on this device: the control's bandwidth, which counts
    bytes read + written, halved (what a planted slowdown of known cost is calibrated with)."""
    return measure_control(device).median * 1e9 / 2 / 1e3


def control_row(ident: dict, device: torch.device) -> Row:
    """The control as a results row (strategy "control"), measured under the clock guard.
    `ident`: the run's preset, scale, scenario and backend."""
    samples, guard = clocks.guarded(lambda: measure_control(device), device)
    return Row(strategy="control", metric="control_copy_gbps", value=samples.median, unit=samples.unit,
               iqr=samples.iqr, samples=list(samples.values), detail={"guard": guard}, **ident)
