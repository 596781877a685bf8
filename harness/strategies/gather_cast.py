"""gather_cast: per layer, gather the active rows and cast them into a compact BF16 buffer.

The plan is made once per step with sequential indices [0, nnz) into the compact
buffer and shared by every layer; the pool indices are kept for the gathers. Under a
bucket graph the gather reads a capacity-sized index buffer and a device-side row
count, both refilled per step without a host sync.
"""

from __future__ import annotations

import torch

from harness.spec.faults import Fault
from harness.strategies.base import Strategy, register


@register("gather_cast", order=30, devices=("cpu", "cuda"), kv_dtype=torch.bfloat16, tier="bitwise",
          faults=(Fault.REMAP_OFF_BY_ONE,), sglang="harness.tpot.sglang_plugin:gather_cast_backend_class")
class GatherCast(Strategy):
    extra_per_slot = False  # the compact buffer holds a step's active rows, not the pool
    cuda_triton_e4m3 = True  # the fused gather+cast kernel

    @classmethod
    def extra_bytes(cls, geometry, schedule) -> int:
        return (schedule.max_active_rows + 1) * geometry.row_width * 2

    def setup(self, schedule):
        rows = schedule.max_active_rows + 1  # +1: room for an off-by-one to read garbage, not fault
        self.compact = torch.empty((rows, 1, self.pool.geometry.row_width), dtype=torch.bfloat16, device=self.device)
        self.gather_indices = None
        self.count = None  # device-side row count (int32 [1]) under a bucket graph

    def teardown(self):
        del self.compact
        self.gather_indices = self.count = None

    def use_graph_capacity(self, capacity):
        if capacity + 1 > self.compact.shape[0]:
            self.compact = torch.empty((capacity + 1, *self.compact.shape[1:]), dtype=torch.bfloat16, device=self.device)
        self.gather_indices = torch.zeros(capacity, dtype=torch.int32, device=self.device)
        self.count = torch.zeros(1, dtype=torch.int32, device=self.device)

    @classmethod
    def cast_bytes(cls, geometry, batch) -> int:
        return len(batch.kv_indices) * geometry.row_width * 3  # read FP8, write BF16

    def step_indices(self, batch):
        """Sequential indices into the compact buffer; the pool rows are kept for the gather."""
        # a copy, never a view of the schedule's array: the in-place refills below would rewrite an earlier step's indices
        pool_rows = torch.tensor(batch.kv_indices, dtype=torch.int32, device=self.device)
        if self.count is not None:  # in place: a captured graph keeps reading these tensors
            self.gather_indices[: len(pool_rows)].copy_(pool_rows)
            self.count.fill_(len(pool_rows))
        elif self.gather_indices is not None and self.gather_indices.shape == pool_rows.shape:
            self.gather_indices.copy_(pool_rows)  # in place: a graph captured over the old tensor stays valid
        else:
            self.gather_indices = pool_rows
        start = 1 if Fault.REMAP_OFF_BY_ONE in self.faults else 0
        return torch.arange(start, start + len(batch.kv_indices), dtype=torch.int32)

    def cast_call(self, layer):
        return _gather_cast, (self.pool.buffers[layer], self.gather_indices, self.compact, self.count)


def _gather_cast(pool_u8: torch.Tensor, indices: torch.Tensor, compact: torch.Tensor, count: torch.Tensor | None = None) -> torch.Tensor:
    """compact[i] = bf16(pool[indices[i]]) for i < count (default: all indices): one fused Triton
    kernel on CUDA (the count read on the device), index_select + cast on CPU."""
    if pool_u8.is_cuda:
        from harness.kernels.gather_cast import gather_cast_

        gather_cast_(pool_u8, indices, compact, count)
    else:
        n = indices.numel() if count is None else int(count)
        rows = pool_u8.view(torch.float8_e4m3fn).index_select(0, indices[:n].to(torch.int64))
        compact[:n] = rows.to(torch.bfloat16)
    return compact
