"""stock: SGLang's decode path today — cast the whole layer pool to BF16, attend with pool indices."""

from __future__ import annotations

import torch

from harness.strategies.base import Strategy, register


@register("stock", order=10, baseline=True, devices=("cpu", "cuda"), kv_dtype=torch.bfloat16, tier="bitwise")
class Stock(Strategy):
    @classmethod
    def extra_bytes(cls, geometry, schedule) -> int:
        return geometry.layer_bytes * 2  # the BF16 temporary of one layer

    @classmethod
    def cast_bytes(cls, geometry, batch) -> int:
        return geometry.layer_bytes * 3  # read the FP8 layer, write it as BF16

    def cast_call(self, layer):
        # exactly `get_key_buffer(layer).to(q.dtype)`: a fresh pool-sized BF16 tensor per layer
        return _torch_cast, (self.pool.buffers[layer],)


# benchmark=False: a variant of stock's cast that `harness run` times (the report's cross-check row);
# the asv benchmarks and `tpot` time stock itself
@register("stock_vectorized", order=20, devices=("cuda",), kv_dtype=torch.bfloat16, tier="bitwise", benchmark=False)
class StockVectorized(Stock):
    """stock with the cast done by one vectorized Triton pass into a preallocated buffer."""

    cuda_triton_e4m3 = True

    def setup(self, schedule):
        g = self.pool.geometry
        self.buf = torch.empty((g.rows, 1, g.row_width), dtype=torch.bfloat16, device=self.device)

    def teardown(self):
        del self.buf

    def cast_call(self, layer):
        return _triton_cast, (self.pool.buffers[layer], self.buf)


def _torch_cast(pool_u8: torch.Tensor) -> torch.Tensor:
    return pool_u8.view(torch.float8_e4m3fn).to(torch.bfloat16)


def _triton_cast(pool_u8: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    from harness.kernels.cast import cast_pool_to_bf16

    cast_pool_to_bf16(pool_u8, out)
    return out
