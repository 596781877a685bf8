"""Compile a scenario against a pool size into concrete per-step index lists.

The allocator works like SGLang's (Paged)TokenToKVPoolAllocator: it hands out
whole pages of `page_size` slots (page 0 is never handed out; slot = page *
page_size + offset) from a free list whose order is the scenario's layout
(scattered like a churned allocator, contiguous, or from the pool's end). A
request's prefilled tokens fill fresh pages in order; its new token goes into the
slot after its last one while that page has room, else to the first slot of a
fresh page. Pages freed by a finished request go to the front of the free list,
so they are reused first (SGLang sets them aside and merges them back when its
free list runs low: the harness reuses at once to exercise stale-copy bugs).
With page_size 1 this is SGLang's token allocator: every slot its own page.
A slot's content is identified by its generation: 0 for the prefilled pool,
step + 1 for the token written at that step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from harness.errors import HarnessError
from harness.spec import synth
from harness.spec.scenario import Scenario

NEW_TOKENS = 1  # KV rows a decode step writes per request: its new token, the last of its indices (write_slots)


@dataclass(frozen=True)
class StepBatch:
    """One decode step: who attends over which rows, and which rows it writes first."""

    step: int
    request_ids: np.ndarray  # int64 [B]
    kv_indptr: np.ndarray  # int32 [B+1]
    # int32 [nnz]: pool rows (= slot numbers; page 0 is the dummy), token-level even in a 64-token-page
    # pool: SGLang's FlashInfer MLA backend plans with page_size 1 over token ids from req_to_token
    # (flashinfer_mla_backend.py call_begin_forward, sglang 0.5.23), and so do the harness's backends.
    kv_indices: np.ndarray
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


def pages_needed(scenario: Scenario, page_size: int) -> int:
    """Pages the scenario can hold at once: each request's tokens fill whole pages of its own."""
    return sum(-(-(n - 1 + scenario.steps) // page_size) for n in scenario.kv_lens)


def least_pool(scenario: Scenario, page_size: int) -> tuple[str, int]:
    """(where, slots): the smallest pool the scenario runs in (whole pages), and the file and field that ask for it.
    An explicit layout also needs its highest prefilled slot's page, and past it a fresh page per request for each
    page_size new tokens (an upper bound: new tokens may fill the rest of a prefilled page first)."""
    need = max(slots_needed(scenario), pages_needed(scenario, page_size) * page_size)
    top = max((max(s) for s in scenario.slots if s), default=0)
    explicit = (top // page_size + len(scenario.kv_lens) * -(-scenario.steps // page_size)) * page_size if top else 0
    return (_where(scenario, "slots"), explicit) if explicit > need else (_where(scenario, scenario.lens_field), need)


def _where(scenario: Scenario, field: str) -> str:
    return f"{scenario.source or scenario.name}: {field}"


def _page_order(scenario: Scenario, pages: np.ndarray) -> np.ndarray:
    if scenario.layout == "tail":
        return pages[::-1]
    if scenario.layout == "scattered":
        return pages[np.argsort(synth.slot_order_keys(scenario.seed, pages), kind="stable")]
    return pages


class _Allocator:
    """Page free list plus the slots each request owns."""

    def __init__(self, scenario: Scenario, pool_slots: int, page_size: int):
        self.page_size = page_size
        pages = np.arange(1, pool_slots // page_size + 1, dtype=np.int64)
        self.owned: dict[int, list[int]] = {}
        self.taken: set[int] = set()
        if scenario.layout == "explicit":
            end = (len(pages) + 1) * page_size  # past the last whole page: the rows of a partial one are never handed out
            for r, slot_list in enumerate(scenario.slots):
                for s in slot_list:
                    if not page_size <= s < end:
                        raise HarnessError(
                            _where(scenario, "slots"),
                            f"slot {s} is outside the pool's slots {page_size}..{end - 1} "
                            f"(page_size {page_size}; page 0 is reserved)",
                        )
                self.owned[r] = list(slot_list)
                self.taken.update(slot_list)
            pages = np.setdiff1d(pages, np.array(sorted({s // page_size for s in self.taken}), dtype=np.int64))
        self.free = deque(_page_order(scenario, pages).tolist())
        if scenario.layout != "explicit":
            for r, n in enumerate(scenario.kv_lens):
                self.owned[r] = []
                for _ in range(n - 1):
                    self.owned[r].append(self.next_slot(r))

    def next_slot(self, r: int) -> int:
        """The slot after request r's last one if its page has room, else a fresh page's first."""
        slots = self.owned[r]
        if slots and (slots[-1] + 1) % self.page_size and slots[-1] + 1 not in self.taken:
            slot = slots[-1] + 1
        else:
            slot = self.free.popleft() * self.page_size
        self.taken.add(slot)
        return slot

    def release(self, r: int) -> list[int]:
        """Free request r: its slots, and (to the front of the free list) its pages no one else holds."""
        released = self.owned.pop(r)
        self.taken.difference_update(released)
        held = {s // self.page_size for s in self.taken}
        pages = [p for p in dict.fromkeys(s // self.page_size for s in released) if p not in held]
        self.free.extendleft(reversed(pages))
        return released


def compile_schedule(scenario: Scenario, pool_slots: int, page_size: int = 1) -> Schedule:
    need, pages = slots_needed(scenario), pages_needed(scenario, page_size)
    if need > pool_slots or pages > pool_slots // page_size:
        held = f"{pool_slots} slots"
        if page_size > 1:  # a request's tokens sit in whole pages: the need is in pages
            need_text = f"{need} tokens in {pages} {page_size}-token pages ({pages * page_size} slots)"
            held += f" ({pool_slots // page_size} whole pages)"
        else:
            need_text = f"{need} slots"
        raise HarnessError(_where(scenario, scenario.lens_field), f"scenario needs up to {need_text} but the pool has {held}; "
                                                          f"use a larger scale or --slots {max(need, pages * page_size)}")
    alloc = _Allocator(scenario, pool_slots, page_size)
    gen: dict[int, int] = {}
    freed: set[int] = set()
    written: list[int] = []
    steps = []
    for t in range(scenario.steps):
        rids = sorted(alloc.owned)
        try:
            write = [alloc.next_slot(r) for r in rids]
        except IndexError:
            raise HarnessError(_where(scenario, "slots"), f"the pool ran out of free pages at step {t}") from None
        reused = [s for s in write if s in freed]
        freed.difference_update(write)
        for r, s in zip(rids, write):
            alloc.owned[r].append(s)
            gen[s] = t + 1
        written.extend(write)
        lens = [len(alloc.owned[r]) for r in rids]
        indices = np.array([s for r in rids for s in alloc.owned[r]], dtype=np.int64)
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
                freed.update(alloc.release(f.request))
    return Schedule(scenario, pool_slots, tuple(steps), np.unique(np.array(written, dtype=np.int64)))
