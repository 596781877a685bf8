"""Strategy registry: how each decode path turns the FP8 pool into what attention reads."""

from __future__ import annotations

from typing import Callable, ClassVar, Optional

import torch

from harness.backends.base import AttnProblem
from harness.faults import Fault
from harness.pool import KVPool, PoolGeometry
from harness.presets import ModelPreset
from harness.schedule import Schedule, StepBatch

REGISTRY: dict[str, type["Strategy"]] = {}


def register(name: str, *, devices: tuple[str, ...], kv_dtype: torch.dtype, tier: str):
    """Class decorator: add a strategy with its capabilities to the registry."""

    def wrap(cls):
        cls.name, cls.devices, cls.kv_dtype, cls.tier = name, devices, kv_dtype, tier
        REGISTRY[name] = cls
        return cls

    return wrap


class Strategy:
    """One decode path. Per step: `begin_step` plans; per layer: `write`, `prepare_kv`, `attend`."""

    name: ClassVar[str]
    devices: ClassVar[tuple[str, ...]]
    kv_dtype: ClassVar[torch.dtype]
    tier: ClassVar[str]  # "bitwise": must equal stock bit for bit; "tolerance": held to a policy

    def __init__(self, pool: KVPool, backend, preset: ModelPreset, faults: frozenset[Fault] = frozenset()):
        self.pool = pool
        self.backend = backend
        self.preset = preset
        self.faults = faults
        self.device = pool.device
        self.kv_scale: Optional[float] = None

    @classmethod
    def unsupported_reason(cls, device: torch.device, backend) -> Optional[str]:
        if device.type not in cls.devices:
            return f"{cls.name} runs on {', '.join(cls.devices)} only"
        return backend.unsupported_reason(device, cls.kv_dtype)

    @classmethod
    def extra_bytes(cls, geometry: PoolGeometry, schedule: Schedule) -> int:
        """Device memory this strategy needs beyond the FP8 pool."""
        return 0

    @classmethod
    def cast_bytes(cls, geometry: PoolGeometry, batch: StepBatch) -> int:
        """Bytes one layer's `prepare_kv` must read plus write (0: no cast at all)."""
        return 0

    @classmethod
    def attn_bytes(cls, geometry: PoolGeometry, batch: StepBatch, num_heads: int) -> int:
        """Bytes one layer's attention must move: every active KV row once in kv_dtype, the
        queries (bf16, 576 channels) and the output (bf16 512 + fp32 LSE) of every head."""
        rows = len(batch.kv_indices) * geometry.row_width * cls.kv_dtype.itemsize
        return rows + batch.batch_size * num_heads * (geometry.row_width * 2 + 512 * 2 + 4)

    @classmethod
    def write_bytes(cls, geometry: PoolGeometry, batch: StepBatch) -> int:
        """Bytes one layer's KV write stores: the new tokens' FP8 rows."""
        return batch.batch_size * geometry.row_width

    def setup(self, schedule: Schedule) -> None:
        """Allocate persistent buffers before the first step."""

    def teardown(self) -> None:
        """Release what setup allocated."""

    def problem(self, batch: StepBatch, kv_indices: torch.Tensor) -> AttnProblem:
        indptr = torch.as_tensor(batch.kv_indptr, dtype=torch.int32)
        if Fault.DROPPED_LAST_TOKEN in self.faults:
            lens = (indptr[1:] - indptr[:-1] - 1).clamp(min=0)
            keep = torch.cat([torch.arange(int(s), int(s) + int(n)) for s, n in zip(indptr[:-1], lens)])
            kv_indices = kv_indices[keep.to(kv_indices.device)]
            indptr = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(lens, 0).to(torch.int32)])
        return AttnProblem(
            kv_indptr=indptr,
            kv_indices=kv_indices.to(device=self.device, dtype=torch.int32),
            num_heads=self.preset.heads_per_rank,
            sm_scale=self.preset.sm_scale,
            kv_dtype=self.kv_dtype,
        )

    def step_indices(self, batch: StepBatch) -> torch.Tensor:
        """The KV rows the plan points at (pool rows by default)."""
        return torch.as_tensor(batch.kv_indices)

    def begin_step(self, batch: StepBatch, graph_capacity: int | None = None):
        """Plan once for the step; reused by every layer. With `graph_capacity`, a re-plannable plan."""
        return self.backend.plan(self.problem(batch, self.step_indices(batch)), graph_capacity=graph_capacity)

    def replan_step(self, plan, batch: StepBatch) -> None:
        """Re-plan a graph plan in place (same buffers) for `batch`."""
        self.backend.replan(plan, self.problem(batch, self.step_indices(batch)))

    def write(self, batch: StepBatch, layer: int, slots: torch.Tensor, codes: torch.Tensor) -> None:
        """Store the step's new tokens (FP8 bytes) into the pool."""
        self.pool.write(layer, slots, codes)

    def cast_call(self, layer: int) -> tuple[Callable, tuple]:
        """(fn, tensors): fn(*tensors) returns the [rows, 1, 576] buffer attention reads for this
        layer — running the cast or gather kernel where the strategy has one. Split out so
        timing can rotate the tensors for cold-L2 measurements."""
        raise NotImplementedError

    def prepare_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ckv, kpe) buffers the kernel reads for this layer: after the cast, gather or nothing."""
        fn, tensors = self.cast_call(layer)
        return self.split(fn(*tensors))

    def attend(self, plan, q_nope, q_pe, kv) -> tuple[torch.Tensor, torch.Tensor]:
        ckv, kpe = kv
        return self.backend.run(plan, q_nope, q_pe, ckv, kpe, kv_scale=self.kv_scale)


    def split(self, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ckv, kpe) views of a [rows, 1, 576] buffer."""
        rank = self.preset.kv_lora_rank
        return buf[..., :rank], buf[..., rank:]
