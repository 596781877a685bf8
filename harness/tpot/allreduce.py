"""The step's two all-reduces per layer: real NCCL across ranks, a measured-latency stand-in on one
GPU, or nothing (CPU, or when no table is given — then TPOT excludes communication, and says so)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import msgspec
import torch

from harness.datafiles import read_toml
from harness.errors import HarnessError
from harness.measure.timing import event_time_ms
from harness.results.schema import validate

# One all-reduce of a decode step's message takes µs: a second (1e6 µs) is no measurement, and the latency model's spin
# kernel takes its cycle count as a 64-bit integer (torch.cuda._sleep(us x cycles per µs): us = 1e300 overflows it).
MAX_US = 1e6


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


class _Point(msgspec.Struct, forbid_unknown_fields=True):
    bytes: Annotated[int, msgspec.Meta(ge=1)]
    us: Annotated[float, msgspec.Meta(gt=0, le=MAX_US)]  # NaN fails both bounds


class _Table(msgspec.Struct, forbid_unknown_fields=True):
    point: Annotated[list[_Point], msgspec.Meta(min_length=1)]
    source: str | None = None


def load_table(path: Path) -> LatencyTable:
    """A table TOML: `source = "..."` and [[point]] rows with `bytes` and `us`, sizes increasing; nothing else."""
    table = validate(read_toml(path), _Table, path, "all-reduce table")
    for i, (before, p) in enumerate(zip(table.point, table.point[1:]), 1):
        if p.bytes <= before.bytes:
            raise HarnessError(f"{path}: point[{i}].bytes", f"must be larger than the point before ({before.bytes}): sizes increase strictly")
    return LatencyTable(table.source or str(path), tuple(p.bytes for p in table.point), tuple(p.us for p in table.point))


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
