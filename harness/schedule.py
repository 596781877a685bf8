"""Compile a scenario against a pool size into concrete per-step index lists.

The allocator hands out slots from a free list whose order is the scenario's
layout (scattered like a churned allocator, contiguous, or from the pool's end);
slots freed by a finished request go to the front, so they are reused first.
A slot's content is identified by its generation: 0 for the prefilled pool,
step + 1 for the token written at that step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from harness import synth
from harness.errors import HarnessError
from harness.scenario import Scenario


@dataclass(frozen=True)
class StepBatch:
    """One decode step: who attends over which rows, and which rows it writes first."""

    step: int
    request_ids: np.ndarray  # int64 [B]
    kv_indptr: np.ndarray  # int32 [B+1]
    kv_indices: np.ndarray  # int32 [nnz]: pool rows (= slot numbers; row 0 is the dummy)
    index_gens: np.ndarray  # int64 [nnz]: generation of each row's content at this step
    write_slots: np.ndarray  # int64 [B]: the slot of each request's new token (its last index)
    reused_slots: np.ndarray  # int64: write_slots that held a finished request's token before

    @property
    def write_gen(self) -> int:
        return self.step + 1

    @property
    def batch_size(self) -> int:
        return len(self.request_ids)

    def rows_of(self, i: int) -> slice:
        return slice(int(self.kv_indptr[i]), int(self.kv_indptr[i + 1]))


@dataclass(frozen=True)
class Schedule:
    scenario: Scenario
    pool_slots: int
    steps: tuple[StepBatch, ...]
    written_slots: np.ndarray  # every slot any step writes (restored after a run)

    @property
    def max_active_rows(self) -> int:
        return max(len(b.kv_indices) for b in self.steps)


def slots_needed(scenario: Scenario) -> int:
    """Distinct slots the scenario can hold at once (an upper bound, ignoring reuse)."""
    return sum(n - 1 for n in scenario.kv_lens) + len(scenario.kv_lens) * scenario.steps


def _free_list(scenario: Scenario, pool_slots: int) -> deque:
    slots = np.arange(1, pool_slots + 1, dtype=np.int64)
    if scenario.layout == "explicit":
        taken = np.array([s for slot_list in scenario.slots for s in slot_list], dtype=np.int64)
        if taken.size and taken.max() > pool_slots:
            raise HarnessError(
                f"{scenario.source or scenario.name}: slots", f"slot {int(taken.max())} is beyond the pool's last slot {pool_slots}"
            )
        return deque([*taken.tolist(), *np.setdiff1d(slots, taken).tolist()])
    if scenario.layout == "contiguous":
        order = slots
    elif scenario.layout == "tail":
        order = slots[::-1]
    else:
        order = slots[np.argsort(synth.slot_order_keys(scenario.seed, slots), kind="stable")]
    return deque(order.tolist())


def compile_schedule(scenario: Scenario, pool_slots: int) -> Schedule:
    need = slots_needed(scenario)
    if need > pool_slots:
        raise HarnessError(
            f"{scenario.source or scenario.name}: kv_lens",
            f"scenario needs up to {need} slots but the pool has {pool_slots}; use a larger scale or --slots",
        )
    free = _free_list(scenario, pool_slots)
    owned = {r: [free.popleft() for _ in range(n - 1)] for r, n in enumerate(scenario.kv_lens)}
    gen: dict[int, int] = {}
    freed: set[int] = set()
    written: list[int] = []
    steps = []
    for t in range(scenario.steps):
        rids = sorted(owned)
        write = [free.popleft() for _ in rids]
        reused = [s for s in write if s in freed]
        freed.difference_update(write)
        for r, s in zip(rids, write):
            owned[r].append(s)
            gen[s] = t + 1
        written.extend(write)
        lens = [len(owned[r]) for r in rids]
        indices = np.array([s for r in rids for s in owned[r]], dtype=np.int64)
        steps.append(
            StepBatch(
                step=t,
                request_ids=np.array(rids, dtype=np.int64),
                kv_indptr=np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
                kv_indices=indices.astype(np.int32),
                index_gens=np.array([gen.get(int(s), 0) for s in indices], dtype=np.int64),
                write_slots=np.array(write, dtype=np.int64),
                reused_slots=np.array(reused, dtype=np.int64),
            )
        )
        for f in scenario.finish:
            if f.after_step == t:
                released = owned.pop(f.request)
                freed.update(released)
                free.extendleft(released)
    return Schedule(scenario, pool_slots, tuple(steps), np.unique(np.array(written, dtype=np.int64)))
