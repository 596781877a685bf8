"""SGLang MLATokenToKVPool layout: per layer a uint8 buffer [slots + 1, 1, 576].

Row 0 is the reserved dummy slot (zeros); rows 1..slots hold unscaled e4m3 bits
from the synthetic generator at generation 0. Writes put a slot's bytes of a
later generation in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness import synth

PAGE_SIZE = 1
HOST_FILL_ROWS = 8192


@dataclass(frozen=True)
class PoolGeometry:
    slots: int
    num_layers: int
    row_width: int

    @property
    def rows(self) -> int:
        return self.slots + PAGE_SIZE

    @property
    def layer_bytes(self) -> int:
        return self.rows * self.row_width

    @property
    def total_bytes(self) -> int:
        return self.layer_bytes * self.num_layers


def _fill_layer_host(buf: torch.Tensor, seed: int, layer: int) -> None:
    flat = buf.view(buf.shape[0], -1)
    flat[0].zero_()
    for start in range(1, flat.shape[0], HOST_FILL_ROWS):
        stop = min(start + HOST_FILL_ROWS, flat.shape[0])
        flat[start:stop] = synth.kv_codes(seed, layer, range(start, stop), 0, flat.shape[1])


def fill_layer(buf: torch.Tensor, seed: int, layer: int) -> None:
    """Fill one layer buffer with generation-0 content, on its own device."""
    if buf.is_cuda:
        from harness.kernels.synth_fill import fill_layer_

        fill_layer_(buf, seed, layer)
    else:
        _fill_layer_host(buf, seed, layer)


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
        for layer in range(geometry.num_layers):
            buf = torch.empty((geometry.rows, 1, geometry.row_width), dtype=torch.uint8, device=device)
            fill_layer(buf, seed, layer)
            self.buffers.append(buf)
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
