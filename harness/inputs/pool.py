"""SGLang MLATokenToKVPool layout: per layer a uint8 buffer [slots + page_size, 1, 576].

SGLang's paged allocator never hands out page 0, so rows 0..page_size-1 stay as
allocated (zeros: padded tokens of a CUDA-graph batch target row 0, which SGLang 0.5.23's KV write skips and
the harness's stock path writes zeros to); rows
page_size..slots+page_size-1 hold unscaled e4m3 bits from the synthetic generator
at generation 0. Writes put a slot's bytes of a later generation in place.

A DSA model (GLM-5) also has, per layer, an index-K cache of
(slots + page_size + 1) // page_size pages of page_size x 132 bytes
(DSATokenToKVPool / IndexKeyCache); the decode strategies never read it, so it is
allocated as zeros: it is there for the memory it takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.spec import synth

HOST_FILL_ROWS = 8192


@dataclass(frozen=True)
class PoolGeometry:
    slots: int
    num_layers: int
    row_width: int
    page_size: int = 1
    index_k_bytes: int = 0  # DSA index-K bytes per token per layer
    # slots need not fill whole pages: like SGLang's allocator, only slots // page_size pages are handed out

    @property
    def rows(self) -> int:
        return self.slots + self.page_size

    @property
    def layer_bytes(self) -> int:
        """One layer's KV buffer (what `stock` casts)."""
        return self.rows * self.row_width

    @property
    def kv_bytes(self) -> int:
        return self.layer_bytes * self.num_layers

    @property
    def index_k_pages(self) -> int:
        """Pages of one layer's index-K cache, as SGLang's IndexKeyCache sizes it."""
        return (self.slots + self.page_size + 1) // self.page_size if self.index_k_bytes else 0

    @property
    def index_k_layer_bytes(self) -> int:
        return self.index_k_pages * self.page_size * self.index_k_bytes

    @property
    def total_bytes(self) -> int:
        """Everything the pool allocates: KV rows plus the index-K cache."""
        return self.kv_bytes + self.index_k_layer_bytes * self.num_layers


def geometry_for(preset, slots: int, num_layers: int) -> PoolGeometry:
    """The pool SGLang builds for `preset` with `slots` token slots."""
    return PoolGeometry(slots, num_layers, preset.row_width, preset.page_size, preset.index_k_bytes)


def _fill_layer_host(buf: torch.Tensor, seed: int, layer: int, page_size: int) -> None:
    flat = buf.view(buf.shape[0], -1)
    flat[:page_size].zero_()
    for start in range(page_size, flat.shape[0], HOST_FILL_ROWS):
        stop = min(start + HOST_FILL_ROWS, flat.shape[0])
        flat[start:stop] = synth.kv_codes(seed, layer, range(start, stop), 0, flat.shape[1])


def fill_layer(buf: torch.Tensor, seed: int, layer: int, page_size: int = 1) -> None:
    """Fill one layer buffer with generation-0 content (first page zero), on its own device."""
    if buf.is_cuda:
        from harness.kernels.synth_fill import fill_layer_

        fill_layer_(buf, seed, layer, page_size)
    else:
        _fill_layer_host(buf, seed, layer, page_size)


def kv_rows(seed: int, layer: int, slots, gens, row_width: int, device: torch.device) -> torch.Tensor:
    """uint8 [n, row_width] content of `slots` at generation `gens`, made on `device`."""
    if device.type == "cuda":
        from harness.kernels.synth_fill import kv_codes_cuda

        slots_t = torch.as_tensor(slots, dtype=torch.int64, device=device)
        gens_t = torch.as_tensor(gens, dtype=torch.int64, device=device).expand_as(slots_t)
        return kv_codes_cuda(seed, layer, slots_t, gens_t, row_width, device=device)
    return synth.kv_codes(seed, layer, slots, gens, row_width)


class KVPool:
    """One FP8 (uint8-stored) buffer per layer, filled deterministically."""

    def __init__(self, geometry: PoolGeometry, seed: int, device: torch.device, progress=None):
        self.geometry = geometry
        self.seed = seed
        self.device = device
        self.buffers: list[torch.Tensor] = []
        self.index_k: list[torch.Tensor] = []
        for layer in range(geometry.num_layers):
            buf = torch.empty((geometry.rows, 1, geometry.row_width), dtype=torch.uint8, device=device)
            fill_layer(buf, seed, layer, geometry.page_size)
            self.buffers.append(buf)
            if geometry.index_k_bytes:
                shape = (geometry.index_k_pages, geometry.page_size * geometry.index_k_bytes)
                self.index_k.append(torch.zeros(shape, dtype=torch.uint8, device=device))
            if progress is not None:
                progress(layer + 1, geometry.num_layers)

    def fp8(self, layer: int) -> torch.Tensor:
        return self.buffers[layer].view(torch.float8_e4m3fn)

    def write(self, layer: int, slots: torch.Tensor, codes: torch.Tensor) -> None:
        self.buffers[layer].view(self.geometry.rows, -1).index_copy_(0, slots, codes)

    def restore(self, slots) -> None:
        """Put generation-0 content back into `slots` of every layer (undo a run's writes)."""
        slots_t = torch.as_tensor(slots, dtype=torch.int64, device=self.device)
        for layer in range(self.geometry.num_layers):
            rows = kv_rows(self.seed, layer, slots, 0, self.geometry.row_width, self.device)
            self.write(layer, slots_t, rows.to(self.device))
