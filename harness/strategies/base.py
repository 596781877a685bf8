"""Strategy registry: how each decode path turns the FP8 pool into what attention reads.

Every per-strategy fact lives here, declared once by `register(...)` or a class attribute, and every
list elsewhere (runs, tables, asv and `tpot` defaults, the dtype contract, fault targets, the SGLang
driver's strategies, memory plans, byte counts) is derived from REGISTRY (see docs/extending.md)."""

from __future__ import annotations

from typing import Callable, ClassVar, Optional

import torch

from harness.backends import backend_family
from harness.backends.base import AttnProblem
from harness.inputs.pool import KVPool, PoolGeometry
from harness.spec.faults import Fault
from harness.spec.presets import ModelPreset
from harness.spec.schedule import Schedule, StepBatch

REGISTRY: dict[str, type["Strategy"]] = {}
TIERS = ("bitwise", "tolerance")
# Triton's e4m3 type (tl.float8e4nv: harness.kernels.cast.e4m3_to_bf16, the fused kernel's fp16 P.V) compiles for sm_89
# and newer only: on an A100 (sm_80) every Triton kernel that decodes e4m3 fails to build
TRITON_E4M3_ARCH = (8, 9)


def triton_e4m3_reason(name: str, device: torch.device) -> Optional[str]:
    """Why `name`'s Triton e4m3 kernels cannot build for this CUDA GPU (None: they can, or it is not a CUDA device)."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) >= TRITON_E4M3_ARCH:
        return None
    return (f"{name} decodes e4m3 in Triton (tl.float8e4nv), which builds for sm_{TRITON_E4M3_ARCH[0]}{TRITON_E4M3_ARCH[1]} "
            f"or newer only; this GPU is sm_{major}{minor}")


def register(name: str, *, devices: tuple[str, ...], kv_dtype: torch.dtype, tier: str,
             order: int, baseline: bool = False, backends: tuple[str, ...] | None = None,
             faults: tuple[Fault, ...] = (), benchmark: bool = True, sglang: str | None = None):
    """Class decorator: add a strategy and what it declares to the registry.

    kv_dtype: the dtype of the KV buffers the strategy hands attention (the dtype contract the
    decode session asserts after every attend); order: position in runs, tables and test lists
    (explicit: a default from the strategies imported so far would hang on the import order); baseline: the one strategy every
    bitwise-tier strategy must equal (stock: SGLang today); backends: backend families it runs on
    (None: all); faults: the planted faults whose code path lives in this strategy (a fault no
    strategy claims targets every strategy; several may claim one); benchmark: in the default
    strategy list of the asv benchmarks and `harness tpot` (False: `harness run` only);
    sglang: "module:function" returning the SGLang attention-backend class that runs this
    strategy inside SGLang (the baseline is SGLang's own path; None: not offered there)."""

    def wrap(cls):
        if name in REGISTRY:
            raise ValueError(f"strategy {name!r}: registered twice")
        if taken := [n for n, c in REGISTRY.items() if c.order == order]:
            raise ValueError(f"strategy {name!r}: order {order} is {taken[0]}'s; choose a free one")
        if tier not in TIERS:
            raise ValueError(f"strategy {name!r}: tier must be one of {TIERS}, got {tier!r}")
        if baseline and any(c.baseline for c in REGISTRY.values()):
            raise ValueError(f"strategy {name!r}: a second baseline")
        cls.name, cls.order, cls.devices, cls.kv_dtype, cls.tier = name, order, devices, kv_dtype, tier
        cls.baseline, cls.backends, cls.faults_owned = baseline, backends, tuple(faults)
        cls.benchmark, cls.sglang = benchmark, sglang
        REGISTRY[name] = cls
        return cls

    return wrap


def unregister(name: str) -> None:
    """Remove a strategy (a test's toy strategy; the shipped ones stay registered)."""
    REGISTRY.pop(name)


class Strategy:
    """One decode path. Per step: `begin_step` plans; per layer: `write`, `prepare_kv`, `attend`."""

    name: ClassVar[str]
    devices: ClassVar[tuple[str, ...]]
    kv_dtype: ClassVar[torch.dtype]
    tier: ClassVar[str]  # "bitwise": must equal the baseline bit for bit; "tolerance": held to a policy
    order: ClassVar[int]
    baseline: ClassVar[bool]
    backends: ClassVar[Optional[tuple[str, ...]]]
    faults_owned: ClassVar[tuple[Fault, ...]]
    benchmark: ClassVar[bool]
    sglang: ClassVar[Optional[str]]
    extra_per_slot: ClassVar[bool] = True  # extra_bytes grows with the pool's slots (False: with the batch)
    runs_sglang: ClassVar[bool] = False  # runs the installed SGLang's code (its CPU checks live in suites/sglang)
    cast_untimed: ClassVar[str] = ""  # with no cast_bytes: why no cast_us, when the step may still cast (inside code not split)
    unmodelled: ClassVar[str] = ""  # why the harness's byte and memory model (extra_bytes, roofline) does not describe it
    cuda_triton_e4m3: ClassVar[bool] = False  # on CUDA its kernels decode e4m3 in Triton (sm_89+: triton_e4m3_reason)

    def run_tier(self) -> str:
        """The exactness tier of this run's outputs (the declared one; a strategy running code it does not own may
        find out which applies as it runs)."""
        return self.tier

    @classmethod
    def runner_reason(cls) -> Optional[str]:
        """Why this strategy cannot run on this runner whatever SGLang commit is installed (None: it may)."""
        return None

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
        if cls.backends is not None and backend_family(backend.name) not in cls.backends:
            return f"{cls.name} runs on the {', '.join(cls.backends)} backend(s) only"
        if cls.cuda_triton_e4m3 and (reason := triton_e4m3_reason(cls.name, device)):
            return reason
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
    def kv_read_bytes(cls, geometry: PoolGeometry, batch: StepBatch) -> int:
        """Bytes of KV one layer's attention reads: every active row once, in kv_dtype."""
        return len(batch.kv_indices) * geometry.row_width * cls.kv_dtype.itemsize

    @classmethod
    def attn_bytes(cls, geometry: PoolGeometry, batch: StepBatch, num_heads: int) -> int:
        """Bytes one layer's attention must move: its KV (`kv_read_bytes`), the queries (bf16, 576
        channels) and the output (bf16 512 + fp32 LSE) of every head."""
        return cls.kv_read_bytes(geometry, batch) + batch.batch_size * num_heads * (geometry.row_width * 2 + 512 * 2 + 4)

    @classmethod
    def write_bytes(cls, geometry: PoolGeometry, batch: StepBatch) -> int:
        """Bytes one layer's KV write stores: the new tokens' FP8 rows."""
        return batch.batch_size * geometry.row_width

    def setup(self, schedule: Schedule) -> None:
        """Allocate persistent buffers before the first step."""

    def teardown(self) -> None:
        """Release what setup allocated."""

    def use_graph_capacity(self, capacity: int) -> None:
        """Size per-step buffers for a CUDA graph that replays steps of up to `capacity` KV rows."""

    def problem(self, batch: StepBatch, kv_indices: torch.Tensor) -> AttnProblem:
        indptr = torch.as_tensor(batch.kv_indptr, dtype=torch.int32)
        if Fault.DROPPED_LAST_TOKEN in self.faults:
            lens = (indptr[1:] - indptr[:-1] - 1).clamp(min=0)
            keep = torch.cat([torch.arange(int(s), int(s) + int(n)) for s, n in zip(indptr[:-1], lens)])
            kv_indices = kv_indices[keep.to(kv_indices.device)]
            indptr = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(lens, 0).to(torch.int32)])
        if Fault.LAST_REQUEST_MISREAD in self.faults and len(indptr) > 2:
            first, start, end = kv_indices[: int(indptr[1])], int(indptr[-2]), int(indptr[-1])
            kv_indices = torch.cat([kv_indices[:start], first[torch.arange(end - start) % len(first)]])
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
        """(out, lse) of one layer. The decode session asserts the dtype contract after it
        (harness.execute.decode.attend), whatever a strategy's own attend does."""
        ckv, kpe = kv
        return self.backend.run(plan, q_nope, q_pe, ckv, kpe, kv_scale=self.kv_scale)

    def split(self, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ckv, kpe) views of a [rows, 1, 576] buffer."""
        rank = self.preset.kv_lora_rank
        return buf[..., :rank], buf[..., rank:]
