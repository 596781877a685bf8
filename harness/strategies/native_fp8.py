"""native_fp8: attend on the FP8 pool directly with a per-tensor scale (1.0: SGLang's bits are unscaled)."""

from __future__ import annotations

import torch

from harness.spec.faults import Fault
from harness.strategies.base import Strategy, register

KV_SCALE = 1.0


@register("native_fp8", order=50, devices=("cpu", "cuda"), kv_dtype=torch.float8_e4m3fn, tier="tolerance",
          faults=(Fault.SCALE_ERROR, Fault.LAST_REQUEST_MISREAD))
class NativeFP8(Strategy):
    def setup(self, schedule):
        self.kv_scale = KV_SCALE * (1.01 if Fault.SCALE_ERROR in self.faults else 1.0)

    def cast_call(self, layer):
        return _as_fp8, (self.pool.buffers[layer],)


def _as_fp8(pool_u8: torch.Tensor) -> torch.Tensor:
    return pool_u8.view(torch.float8_e4m3fn)
