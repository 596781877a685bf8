"""A prepared case: schedule, backend, pool and step data built once, decode sessions per strategy.

`harness run`, the asv benchmarks and the GPU perf and input tests all set a case up through
this one object, so each pool is built once per (case, process) and every strategy and metric
reads the same bytes. `PreparedCase.builds` counts pool builds per case name.
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import torch

from harness.backends import make_backend
from harness.errors import HarnessError
from harness.execute.decode import DecodeSession, StepData, make_step_data, outputs_bytes, step_data_bytes
from harness.inputs.cases import Case
from harness.inputs.memory import MemoryPlan
from harness.inputs.pool import KVPool
from harness.strategies import FAULT_TARGETS, REGISTRY

POOL_ITEM = "fp8 pool"  # the memory plan's item for the pool itself


def case_memory_plan(case: Case, schedule, extra: int, *more: tuple[str, int]) -> MemoryPlan:
    """`case`'s pool, the largest buffer a strategy adds (`extra`), the step inputs, and `more` (name, bytes)."""
    g = case.geometry
    per_slot = -(-(g.total_bytes + extra) // g.slots)  # conservative: pool and buffer scale with slots
    items = ((POOL_ITEM, g.total_bytes), ("largest strategy buffer", extra),
             ("step inputs", step_data_bytes(case.preset, schedule, g.num_layers)), *more)
    return MemoryPlan(items, per_slot, g.slots)


class PreparedCase:
    builds: Counter = Counter()  # case name -> pools built in this process

    def __init__(self, case: Case, device: torch.device, backend: str = "auto", kernel: str = "auto", faults=frozenset()):
        self.case, self.device, self.faults = case, device, frozenset(faults)
        self.schedule = case.schedule()
        self.backend = make_backend(backend, device, kernel)
        self.geometry = case.geometry
        self.pool: KVPool | None = None
        self.data: StepData | None = None
        self.build_s: float | None = None

    def unsupported_reason(self, strategy: str) -> str | None:
        return REGISTRY[strategy].unsupported_reason(self.device, self.backend)

    def extra_bytes(self, strategy: str) -> int:
        return REGISTRY[strategy].extra_bytes(self.geometry, self.schedule)

    def memory_plan(self, strategies) -> MemoryPlan:
        """case_memory_plan with the largest buffer any of `strategies` adds (they run one at a time), and on the CPU
        (where they live) the checked outputs each strategy's result keeps."""
        extra = max((self.extra_bytes(n) for n in strategies), default=0)
        more = ()
        if self.device.type == "cpu":
            more = (("checked outputs kept", len(strategies) * outputs_bytes(self.case.preset, self.schedule, self.case.checked_layers())),)
        return case_memory_plan(self.case, self.schedule, extra, *more)

    def build(self, progress=None) -> "PreparedCase":
        """Fill the pool and make the step data (once; later calls return at once)."""
        if self.pool is None:
            t0 = time.perf_counter()
            self.pool = KVPool(self.geometry, self.case.scenario.seed, self.device, progress=progress)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.build_s = time.perf_counter() - t0
            PreparedCase.builds[self.case.name] += 1
            self.data = make_step_data(self.case.preset, self.schedule, self.pool, self.faults)
        return self

    @contextmanager
    def session(self, strategy: str, faults=None) -> Iterator[DecodeSession]:
        """A decode session of `strategy` over the built pool; its pool writes are undone on exit.
        faults: planted faults (default: the case's), each kept only for the strategies it targets
        (register(faults=...); a fault no strategy claims reaches every strategy)."""
        if self.pool is None:
            raise HarnessError("prepared case", "build() the pool before opening a session")
        if strategy not in REGISTRY:
            raise HarnessError("--strategy", f"unknown strategy {strategy!r}; choose from {', '.join(REGISTRY)}")
        wanted = self.faults if faults is None else frozenset(faults)
        mine = frozenset(f for f in wanted if not FAULT_TARGETS[f] or strategy in FAULT_TARGETS[f])
        cls = REGISTRY[strategy]
        with DecodeSession(cls(self.pool, self.backend, self.case.preset, mine), self.schedule, self.data) as s:
            yield s
