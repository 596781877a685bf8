"""req_to_token kept the way SGLang's scheduler keeps it, in SGLang's own ReqToTokenPool.

A request takes a free row when it first runs (its whole prefix written then, as prefill leaves
it); each later step appends the positions it added (decode: one token); a request that is gone
from the batch has finished and its row goes back to the free list, to be handed to a later
request that overwrites it. Row 0 is SGLang's padding row: a CUDA-graph padding request reads
position 0 of it, slot 0 (harness.spec.buckets.PAD_ROW)."""

from __future__ import annotations

import numpy as np
import torch

from harness.integrations.sglang import runtime
from harness.spec.buckets import PAD_REQUEST, PAD_ROW
from harness.spec.faults import Fault
from harness.spec.schedule import Schedule, StepBatch


class RequestTable:
    """SGLang's ReqToTokenPool for one schedule, updated step by step (`update`)."""

    def __init__(self, schedule: Schedule, device: torch.device, faults: frozenset[Fault] = frozenset()):
        pools = runtime.load(runtime.MEMORY_POOL)
        lens = [np.diff(b.kv_indptr) for b in schedule.steps]
        self.pool = pools.ReqToTokenPool(size=max(b.batch_size for b in schedule.steps),
                                         max_context_len=int(max(x.max() for x in lens)) + 1,
                                         device=str(device), enable_memory_saver=False)
        self.off_by_one = Fault.REQ_TO_TOKEN_OFF_BY_ONE in faults
        self.rows: dict[int, int] = {}  # request id -> its row
        self.known: dict[int, int] = {}  # request id -> positions written into its row

    @property
    def req_to_token(self) -> torch.Tensor:
        return self.pool.req_to_token

    def update(self, batch: StepBatch) -> torch.Tensor:
        """Bring the table to `batch` (free finished rows, take rows for new requests, write the
        positions each request added); the batch's req_pool_indices (int64, on the table's device)."""
        ids = [int(r) for r in batch.request_ids]
        running = {r for r in ids if r != PAD_REQUEST}
        finished = [r for r in self.rows if r not in running]
        self.pool.free_rows([self.rows.pop(r) for r in finished])
        for r in finished:
            del self.known[r]
        new = [r for r in ids if r != PAD_REQUEST and r not in self.rows]
        for r, row in zip(new, self.pool.alloc_rows(len(new)) or []):
            self.rows[r], self.known[r] = row, 0
        if len(self.rows) != len(running):
            raise RuntimeError(f"step {batch.step}: the request table has no free row for {len(running)} requests")
        rows, cols, slots, indices = [], [], [], []
        for i, r in enumerate(ids):
            span = batch.kv_indices[batch.rows_of(i)]
            if r == PAD_REQUEST:
                if len(span) != 1 or int(span[0]) != PAD_ROW:
                    raise ValueError(f"step {batch.step}: a padding request must read slot {PAD_ROW} only")
                indices.append(0)
                continue
            row, start = self.rows[r], self.known[r]
            if len(span) > start:
                added = span[start:].astype(np.int64)
                if self.off_by_one:  # the planted fault: the newest position names the next slot
                    added = added.copy()
                    added[-1] += 1
                rows.append(np.full(len(added), row))
                cols.append(np.arange(start, len(span)))
                slots.append(added)
                self.known[r] = len(span)
            indices.append(row)
        if rows:
            where = (torch.as_tensor(np.concatenate(rows)), torch.as_tensor(np.concatenate(cols)))
            values = torch.as_tensor(np.concatenate(slots), dtype=torch.int32)
            device = self.req_to_token.device
            self.pool.write(tuple(w.to(device) for w in where), values.to(device))
        return torch.as_tensor(indices, dtype=torch.int64).to(self.req_to_token.device)
