"""The step's two all-reduces per layer: real NCCL across ranks, a measured-latency stand-in on one
GPU, or nothing (CPU, or when no table is given — then TPOT excludes communication, and says so)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.datafiles import read_toml
from harness.errors import HarnessError
from harness.measure.timing import event_time_ms


@dataclass(frozen=True)
class LatencyTable:
    """Measured all-reduce latency (µs) by message size (bytes), interpolated linearly between points."""

    source: str
    sizes: tuple[int, ...]
    micros: tuple[float, ...]

    def us(self, nbytes: int) -> float:
        i = bisect.bisect_left(self.sizes, nbytes)
        if i == 0:
            return self.micros[0]
        if i == len(self.sizes):
            return self.micros[-1] * nbytes / self.sizes[-1]  # past the table: bandwidth-bound growth
        (s0, s1), (u0, u1) = self.sizes[i - 1 : i + 1], self.micros[i - 1 : i + 1]
        return u0 + (u1 - u0) * (nbytes - s0) / (s1 - s0)


def load_table(path: Path) -> LatencyTable:
    """A table TOML: `source = "..."` and [[point]] rows with `bytes` and `us`, sizes increasing."""
    data = read_toml(path)
    points = data.get("point")
    if not isinstance(points, list) or not points:
        raise HarnessError(f"{path}: point", "needs [[point]] rows with bytes and us")
    sizes, micros = [], []
    for i, p in enumerate(points):
        where = f"{path}: point[{i}]"
        if not isinstance(p, dict) or not {"bytes", "us"} <= set(p):
            raise HarnessError(where, "every [[point]] needs bytes and us")
        size, us = p["bytes"], p["us"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise HarnessError(f"{where}.bytes", f"must be an integer >= 1, got {size!r}")
        if isinstance(us, bool) or not isinstance(us, (int, float)) or not 0 <= us < math.inf:  # nan fails too
            raise HarnessError(f"{where}.us", f"must be a finite latency >= 0, got {us!r}")
        if sizes and size <= sizes[-1]:
            raise HarnessError(f"{where}.bytes", f"must be larger than the point before ({sizes[-1]}): sizes increase strictly")
        sizes.append(size)
        micros.append(float(us))
    return LatencyTable(str(data.get("source", path)), tuple(sizes), tuple(micros))


DEFAULT_TABLE = Path(__file__).with_name("allreduce_h200_tp2.toml")  # copy of docs/h200/2026-11-30/phase2/tp2/


class AllReduce:
    """Called on the [B, hidden] bf16 tensor after o_proj and after the FFN; returns it reduced."""

    mode = "none"

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def describe(self) -> str:
        return "none: all-reduce time not included"

    def model_ms(self, batch: int, hidden: int, layers: int) -> float | None:
        """The step's all-reduce time this model adds (2 per layer, [batch, hidden] bf16): 0 for none,
        the table's latency sum for the latency model, None (unmodeled: measured) for real NCCL."""
        return 0.0


class NcclAllReduce(AllReduce):
    """torch.distributed all-reduce (NCCL) over the default process group: capturable in a CUDA graph."""

    mode = "nccl"

    def __call__(self, t):
        import torch.distributed as dist

        dist.all_reduce(t)
        return t

    def describe(self) -> str:
        import torch.distributed as dist

        return f"nccl: real all-reduce over {dist.get_world_size()} ranks"

    def model_ms(self, batch, hidden, layers):
        return None


class LatencyAllReduce(AllReduce):
    """One GPU: a spin kernel lasting the table's latency for the message size (inside the graph)."""

    mode = "latency"

    def __init__(self, table: LatencyTable, device: torch.device, default: bool = False):
        self.table, self.default = table, default
        self.cycles_per_us = _spin_rate(device)

    def model_ms(self, batch, hidden, layers):
        return 2 * layers * self.table.us(batch * hidden * 2) / 1e3

    def __call__(self, t):
        torch.cuda._sleep(max(1, int(self.table.us(t.numel() * t.element_size()) * self.cycles_per_us)))
        return t

    def describe(self) -> str:
        how = "default one-GPU model (no --allreduce-table given)" if self.default else "--allreduce-table"
        return f"latency ({how}): measured per-size latency from {self.table.source}"


def _spin_rate(device: torch.device, cycles: int = 2_000_000) -> float:
    """Clock cycles of torch.cuda._sleep per µs on this GPU (calibrated with CUDA events)."""
    with torch.cuda.device(device):
        (ms,) = event_time_ms(lambda: torch.cuda._sleep(cycles), 1, warmup=1)
    return cycles / (ms * 1e3)
