"""FlashInfer FA2/FA3 batch-MLA decode (flashinfer-python 0.7.2), behind the backend contract.

One `BatchMLAPagedAttentionWrapper` per plan, planned from canonical CSR metadata
(`MLAPlanMetadata.csr`) with split nope/rope query and KV, page_size 1, non-causal,
`lse_mode="basee"`: the wrapper returns the LSE in natural log (the kernel multiplies
its base-2 LSE by ln 2). FP8 KV plans use `scale_mode="kv-per-tensor"` and run with
`ckv_scale = kpe_scale = kv_scale`; the kernel dequantizes in shared memory,
rounding the scale to BF16 and multiplying in BF16 (exact for 1.0).

Workspaces: the 128 MiB float workspace is allocated once per backend and shared
by its plans (runs are stream-ordered). FlashInfer's FA backend allocates its own
8 MiB int workspace (+ pinned mirror) at each eager plan; graph plans keep theirs.

CUDA graphs: `run` does no host sync, so any plan can be captured while it and its
tensors live. A plan made with `graph_capacity` owns fixed-size metadata buffers
(`use_cuda_graph=True`), and `replan` refills them in place for a new step of the
same batch size, heads, dtype and sm_scale, so a captured graph stays valid
(FA2/FA3 allow graph re-planning; the int workspace, grid and workspace offsets
do not change). sm_scale, kv_scale and tensor addresses are baked into a capture.

`replan` takes FlashInfer's fast path where the planned backend publishes one (FA2/FA3
mirror `_cached_module` onto the wrapper), as SGLang's `fast_mla_decode_plan` does: a
device-to-device copy of the new kv_indices into the captured buffer, then the module's
own scheduler on host-side indptr/lengths, with no blocking device-to-host copy and none
of `plan()`'s validation clones. The scheduler's plan info must equal the captured one
(it is baked into the graph); a change is an error, never a silent mis-replay.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional

import torch

from harness.backends import arch_policy
from harness.backends.base import AttnProblem, refuse_kv_scale
from harness.errors import HarnessError

FLOAT_WORKSPACE_BYTES = 128 * 1024 * 1024


@functools.cache
def _import_error() -> Optional[str]:
    try:
        import flashinfer.mla  # noqa: F401
    except Exception as error:  # a missing or broken install is a reason, not a crash
        return f"flashinfer is not importable: {type(error).__name__}: {error}"
    return None


@dataclass
class FlashInferPlan:
    """A planned wrapper and the problem it was planned for."""

    wrapper: Any  # flashinfer.mla.BatchMLAPagedAttentionWrapper
    problem: AttnProblem
    graph_capacity: Optional[int] = None  # kv_indices capacity of a CUDA-graph plan
    kv_indices_buf: Optional[torch.Tensor] = None  # the graph plan's fixed kv_indices buffer


class FlashInferBackend:
    def __init__(self, device: torch.device | str, kernel: str):
        if kernel not in arch_policy.KERNELS:
            raise HarnessError("kernel", f"expected one of {arch_policy.KERNELS}, got {kernel!r}")
        self.device = torch.device(device)
        self.kernel = kernel
        self.name = f"flashinfer-{kernel}"
        self._workspace: Optional[torch.Tensor] = None

    def unsupported_reason(self, device: torch.device, kv_dtype: torch.dtype) -> Optional[str]:
        if device.type != "cuda":
            return f"{self.name} needs a CUDA device, got {device.type}"
        if reason := _import_error():
            return reason
        found = arch_policy.support(torch.cuda.get_device_capability(device), kv_dtype)
        if found.reason:
            return found.reason
        if self.kernel not in found.kernels:
            return f"{self.kernel} is not in the {found.arch} policy for {kv_dtype}: {', '.join(found.kernels)}"
        return None

    def plan(self, problem: AttnProblem, graph_capacity: Optional[int] = None) -> FlashInferPlan:
        """Plan one step; with `graph_capacity` (max kv_indices) the plan can be `replan`ned in place."""
        from flashinfer.mla import BatchMLAPagedAttentionWrapper

        if self._workspace is None:
            self._workspace = torch.empty(FLOAT_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        buffers = {}
        if graph_capacity is not None:
            self._check_capacity(problem, graph_capacity)
            batch = problem.batch_size
            int32 = dict(dtype=torch.int32, device=self.device)
            buffers = dict(
                use_cuda_graph=True,
                qo_indptr=torch.empty(batch + 1, **int32),
                kv_indptr=torch.empty(batch + 1, **int32),
                kv_indices=torch.empty(graph_capacity, **int32),
                kv_len_arr=torch.empty(batch, **int32),
            )
        wrapper = BatchMLAPagedAttentionWrapper(self._workspace, backend=self.kernel, **buffers)
        wrapper.plan(**self._plan_kwargs(problem))
        return FlashInferPlan(wrapper, problem, graph_capacity, buffers.get("kv_indices"))

    def replan(self, plan: FlashInferPlan, problem: AttnProblem) -> None:
        """Re-plan a graph plan in place for a new step; graphs captured over it stay valid."""
        if plan.graph_capacity is None:
            raise HarnessError("replan", "only plans made with graph_capacity can be re-planned in place")
        old = plan.problem
        fixed = ("batch_size", "num_heads", "sm_scale", "kv_dtype", "head_dim_ckv", "head_dim_kpe")
        changed = [name for name in fixed if getattr(old, name) != getattr(problem, name)]
        if changed:
            raise HarnessError("replan", f"a graph plan cannot change {', '.join(changed)}")
        self._check_capacity(problem, plan.graph_capacity)
        if getattr(plan.wrapper, "_cached_module", None) is None:
            plan.wrapper.plan(**self._plan_kwargs(problem))  # no fast path for this kernel
        else:
            self._fast_replan(plan, problem)
        plan.problem = problem

    def _fast_replan(self, plan: FlashInferPlan, problem: AttnProblem) -> None:
        """SGLang's fast_mla_decode_plan: refill kv_indices on the device, re-run the scheduler on host arrays."""
        w = plan.wrapper
        indptr = problem.kv_indptr.to("cpu", torch.int32)
        n = problem.kv_indices.numel()
        plan.kv_indices_buf[:n].copy_(problem.kv_indices, non_blocking=True)
        info = w._cached_module.plan(
            w._float_workspace_buffer, w._int_workspace_buffer, w._pin_memory_int_workspace_buffer,
            torch.arange(problem.batch_size + 1, dtype=torch.int32), indptr, indptr[1:] - indptr[:-1],
            problem.num_heads, problem.head_dim_ckv, False,
        )
        if not _same_plan_info(info, w._plan_info):
            raise HarnessError("replan", "FlashInfer's scheduler changed its plan info; a captured graph cannot follow")

    def run(
        self,
        plan: FlashInferPlan,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv: torch.Tensor,
        kpe: torch.Tensor,
        kv_scale: Optional[float] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        refuse_kv_scale(kv_scale, plan.problem.kv_dtype)
        scales = {}
        if plan.problem.kv_dtype == torch.float8_e4m3fn:
            scale = 1.0 if kv_scale is None else float(kv_scale)
            scales = dict(ckv_scale=scale, kpe_scale=scale)
        return plan.wrapper.run(
            query=(q_nope, q_pe),
            kv_cache=(ckv, kpe),
            return_lse=True,
            return_lse_base_on_e=True,
            **scales,
        )

    @staticmethod
    def _check_capacity(problem: AttnProblem, capacity: int) -> None:
        if problem.kv_indices.numel() > capacity:
            raise HarnessError("graph_capacity", f"{problem.kv_indices.numel()} kv_indices exceed capacity {capacity}")

    def _plan_kwargs(self, problem: AttnProblem) -> dict:
        from flashinfer.mla import MLAPlanMetadata

        kv_indptr = problem.kv_indptr.to("cpu", torch.int32)
        batch = kv_indptr.numel() - 1
        metadata = MLAPlanMetadata.csr(
            qo_indptr=torch.arange(batch + 1, dtype=torch.int32),
            kv_indptr=kv_indptr,
            kv_indices=problem.kv_indices,
            kv_len_arr=kv_indptr[1:] - kv_indptr[:-1],
        )
        found = arch_policy.support(torch.cuda.get_device_capability(self.device), problem.kv_dtype)
        if found.reason:
            raise HarnessError(self.name, found.reason)
        return dict(
            metadata=metadata,
            num_heads=problem.num_heads,
            head_dim_ckv=problem.head_dim_ckv,
            head_dim_kpe=problem.head_dim_kpe,
            page_size=1,
            causal=False,
            sm_scale=float(problem.sm_scale),
            q_data_type=torch.bfloat16,
            kv_data_type=problem.kv_dtype,
            query_layout="split",
            kv_cache_layout="split",
            lse_mode="basee",
            scale_mode=found.scale_mode,
        )


def _same_plan_info(a, b) -> bool:
    """Plan infos (sequences of ints from FlashInfer's scheduler) are equal."""
    as_ints = lambda info: [int(x) for x in (info.tolist() if isinstance(info, torch.Tensor) else info)]  # noqa: E731
    return as_ints(a) == as_ints(b)
