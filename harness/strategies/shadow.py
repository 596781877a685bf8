"""shadow: attend on a BF16 copy of the pool that every KV write keeps in sync."""

from __future__ import annotations

import torch

from harness.spec.faults import Fault
from harness.strategies.base import Strategy, register


@register("shadow", order=40, devices=("cpu", "cuda"), kv_dtype=torch.bfloat16, tier="bitwise",
          faults=(Fault.SHADOW_SKIPPED_STEP, Fault.STALE_AFTER_REUSE))
class Shadow(Strategy):
    cuda_triton_e4m3 = True  # the fused FP8 + BF16 write kernel
    @classmethod
    def extra_bytes(cls, geometry, schedule) -> int:
        return geometry.kv_bytes * 2

    @classmethod
    def write_bytes(cls, geometry, batch) -> int:
        return batch.batch_size * geometry.row_width * 3  # the FP8 row and its BF16 shadow

    def setup(self, schedule):
        # the shadow exists from server start, so it begins as a cast of the whole pool
        self.last_step = schedule.steps[-1].step
        self.shadow = [self.pool.fp8(layer).to(torch.bfloat16) for layer in range(self.pool.geometry.num_layers)]

    def teardown(self):
        del self.shadow

    def write(self, batch, layer, slots, codes):
        keep = torch.ones(len(slots), dtype=torch.bool)
        if Fault.SHADOW_SKIPPED_STEP in self.faults and batch.step == self.last_step:
            keep[:] = False
        if Fault.STALE_AFTER_REUSE in self.faults:
            keep &= ~torch.isin(torch.as_tensor(batch.write_slots), torch.as_tensor(batch.reused_slots))
        if self.device.type == "cuda" and bool(keep.all()):
            from harness.kernels.shadow_write import write_fp8_and_bf16_

            write_fp8_and_bf16_(self.pool.buffers[layer], self.shadow[layer], slots, codes)
            return
        self.pool.write(layer, slots, codes)
        keep = keep.to(slots.device)
        bf16 = codes[keep].view(torch.float8_e4m3fn).to(torch.bfloat16)
        self.shadow[layer].view(self.shadow[layer].shape[0], -1).index_copy_(0, slots[keep], bf16)

    def cast_call(self, layer):
        return _identity, (self.shadow[layer],)


def _identity(buffer: torch.Tensor) -> torch.Tensor:
    return buffer
