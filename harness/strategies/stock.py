"""stock: SGLang's decode path today — cast the whole layer pool to BF16, attend with pool indices."""

from __future__ import annotations

import torch

from harness.strategies.base import Strategy, register


@register("stock", devices=("cpu", "cuda"), kv_dtype=torch.bfloat16, tier="bitwise")
class Stock(Strategy):
    @classmethod
    def extra_bytes(cls, geometry, schedule) -> int:
        return geometry.layer_bytes * 2  # the BF16 temporary of one layer

    @classmethod
    def cast_bytes(cls, geometry, batch) -> int:
        return geometry.layer_bytes * 3  # read the FP8 layer, write it as BF16

    def prepare_kv(self, layer):
        # exactly `get_key_buffer(layer).to(q.dtype)`: a fresh pool-sized BF16 tensor per layer
        return self.split(self.pool.fp8(layer).to(torch.bfloat16))


@register("stock_vectorized", devices=("cuda",), kv_dtype=torch.bfloat16, tier="bitwise")
class StockVectorized(Strategy):
    """stock with the cast done by one vectorized Triton pass into a preallocated buffer."""

    @classmethod
    def extra_bytes(cls, geometry, schedule) -> int:
        return geometry.layer_bytes * 2

    @classmethod
    def cast_bytes(cls, geometry, batch) -> int:
        return geometry.layer_bytes * 3

    def setup(self, schedule):
        g = self.pool.geometry
        self.buf = torch.empty((g.rows, 1, g.row_width), dtype=torch.bfloat16, device=self.device)

    def teardown(self):
        del self.buf

    def prepare_kv(self, layer):
        from harness.kernels.cast import cast_pool_to_bf16

        cast_pool_to_bf16(self.pool.buffers[layer], self.buf)
        return self.split(self.buf)
