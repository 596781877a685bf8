"""Memory plans: every big allocation is checked against free memory first."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from harness.errors import HarnessError

GIB = 1024**3
HEADROOM = 0.95  # leave 5% of free memory to the allocator and the kernels' workspaces


def free_bytes(device: torch.device) -> int:
    """Bytes free to this process on `device`, once unreachable objects are collected: an earlier run in this process
    can leave its pool in a reference cycle (importing SGLang kept the first run's frames, its 25 GiB pool among their
    locals, until a full collection; on an H100 the next GLM-5 prod case was refused at 51.8 GiB free)."""
    gc.collect()
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # blocks this process's caching allocator holds but no tensor uses are free to it too (an earlier case's pool,
        # freed: without them a second prod case in one pytest process on an 80 GB H100 was refused at 51.9 GiB free)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise HarnessError("/proc/meminfo", "no MemAvailable line; cannot plan host memory")


@dataclass(frozen=True)
class MemoryPlan:
    """Named allocations, plus how the total grows with the pool's slot count."""

    items: tuple[tuple[str, int], ...]
    bytes_per_slot: int
    slots: int

    @property
    def total(self) -> int:
        return sum(b for _, b in self.items)

    def describe(self) -> str:
        parts = ", ".join(f"{name} {b / GIB:.2f} GiB" for name, b in self.items if b)
        return f"{self.total / GIB:.2f} GiB ({parts})"

    @property
    def fixed(self) -> int:
        """Bytes that do not grow with the pool's slots (the step inputs and outputs: the batch, steps and layers)."""
        return max(0, self.total - self.bytes_per_slot * self.slots)

    def largest_slots(self, available: int) -> int:
        return max(0, int((available * HEADROOM - self.fixed) // max(self.bytes_per_slot, 1)))

    def check(self, device: torch.device, available: int | None = None, needed: tuple[str, int] | None = None) -> None:
        """`needed`: (where, slots) of the scenario the pool is sized for: when no pool of that many slots fits, the
        scenario is what must shrink, and the error names it at `where` (its file and field), not --slots."""
        available = free_bytes(device) if available is None else available
        if self.total > available * HEADROOM:
            slots = self.largest_slots(available)
            where, least = needed or ("memory plan", 0)
            if slots and slots >= least:
                where, fix = "memory plan", f"the largest pool that fits has {slots} slots (--slots)"
            elif slots:
                fix = (f"the largest pool that fits has {slots:,} slots, fewer than the {least:,} it needs: fewer or shorter requests, "
                       f"fewer steps or lower explicit slots")
            else:
                fix = f"{self.fixed / GIB:.2f} GiB of it does not shrink with the pool: fewer requests, steps or --layers"
            raise HarnessError(
                where,
                f"needs {self.describe()} but {device} has {available / GIB:.2f} GiB free ({HEADROOM:.0%} of it usable); {fix}",
            )
