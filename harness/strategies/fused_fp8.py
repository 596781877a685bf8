"""fused_fp8: one split-KV decode kernel that attends on the FP8 pool directly.

No cast, no extra copy of the pool: the kernel reads each active e4m3 row once through the
token-level kv_indices and dequantizes it in registers. The launch table
(harness/kernels/fused_tuning.toml) picks the kernel per shape: on sm_89+ the CUDA kernel
(harness/kernels/fused_mla_cuda.cu, one launch, NVRTC-compiled), elsewhere the Triton kernel
(harness.kernels.fused_mla_decode; Triton's e4m3 type needs sm_89+ too, so an older GPU is unsupported). It is its own attention kernel, so it runs beside any backend.
On the CPU it runs only under the Triton interpreter (TRITON_INTERPRET=1), which the CPU suites use
at small sizes. The plan holds device copies of kv_indptr / kv_indices (and the split buffers); a
graph plan's are refilled in place by `replan_step`, so a captured step stays valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from harness.backends.base import AttnProblem
from harness.errors import HarnessError
from harness.spec.faults import Fault
from harness.spec.schedule import NEW_TOKENS
from harness.strategies.base import Strategy, register, triton_e4m3_reason

KV_SCALE = 1.0  # SGLang's pool holds unscaled e4m3 bits


@dataclass
class FusedPlan:
    problem: AttnProblem
    config: object  # harness.kernels.fused_mla_decode.Config
    kv_indptr: torch.Tensor  # int32 [B+1] on the device
    kv_indices: torch.Tensor  # int32 [capacity] on the device
    partials: tuple[torch.Tensor, torch.Tensor]
    graph_capacity: Optional[int] = None


def _cuda_kernel_smem(device: torch.device) -> int:
    """Shared memory per block the CUDA kernel may use here; 0 where it cannot run (CPU, the Triton
    interpreter, a GPU older than sm_89)."""
    from harness.kernels.fused_mla_cuda import MIN_ARCH
    from harness.kernels.fused_mla_decode import INTERPRETED

    if device.type != "cuda" or INTERPRETED or torch.cuda.get_device_capability(device) < MIN_ARCH:
        return 0
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def _clusters(device: torch.device) -> bool:
    """Whether the CUDA kernel may merge splits in a thread-block cluster here (sm_90+)."""
    from harness.kernels.fused_mla_cuda import dependent_launches

    return device.type == "cuda" and dependent_launches(device.index if device.index is not None else torch.cuda.current_device())


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


@register("fused_fp8", order=60, devices=("cpu", "cuda"), kv_dtype=torch.float8_e4m3fn, tier="tolerance",
          faults=(Fault.SCALE_ERROR, Fault.LAST_REQUEST_MISREAD))
class FusedFP8(Strategy):
    @classmethod
    def unsupported_reason(cls, device: torch.device, backend) -> Optional[str]:
        try:
            from harness.kernels import fused_mla_decode
        except ImportError as exc:
            return f"fused_fp8 needs triton: {exc}"
        if device.type == "cpu" and not fused_mla_decode.INTERPRETED:
            return "fused_fp8 is a Triton kernel: on the CPU it runs only under TRITON_INTERPRET=1"
        if device.type not in cls.devices:
            return f"fused_fp8 runs on {', '.join(cls.devices)} only"
        return triton_e4m3_reason(cls.name, device)  # the CUDA kernel needs sm_89 too (fused_mla_cuda.MIN_ARCH)

    def setup(self, schedule):
        self.kv_scale = KV_SCALE * (1.01 if Fault.SCALE_ERROR in self.faults else 1.0)

    def begin_step(self, batch, graph_capacity=None) -> FusedPlan:
        from harness.kernels import fused_tuning
        from harness.kernels.fused_mla_decode import partial_buffers

        problem = self.problem(batch, self.step_indices(batch))
        lens = problem.kv_lens
        max_len = int(lens.max()) if lens.numel() else 0
        config = fused_tuning.choose(problem.batch_size, max_len, problem.num_heads, _sm_count(self.device),
                                     cuda_smem=_cuda_kernel_smem(self.device), clusters=_clusters(self.device),
                                     gpu=torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None)
        capacity = problem.kv_indices.numel() if graph_capacity is None else graph_capacity
        indices = torch.empty(max(capacity, 1), dtype=torch.int32, device=self.device)
        plan = FusedPlan(problem, config, problem.kv_indptr.to(self.device), indices,
                         partial_buffers(problem.batch_size, problem.num_heads, config, problem.head_dim_ckv,
                                         self.device), graph_capacity)
        self._fill(plan, problem)
        return plan

    def replan_step(self, plan: FusedPlan, batch) -> None:
        """Refill a graph plan's buffers in place (same batch size; indices within capacity)."""
        if plan.graph_capacity is None:
            raise HarnessError("replan", "only plans made with graph_capacity can be re-planned in place")
        problem = self.problem(batch, self.step_indices(batch))
        if problem.batch_size != plan.problem.batch_size:
            raise HarnessError("replan", "a graph plan cannot change batch_size")
        self._fill(plan, problem)
        plan.kv_indptr.copy_(problem.kv_indptr)
        plan.problem = problem

    @staticmethod
    def _fill(plan: FusedPlan, problem: AttnProblem) -> None:
        n = problem.kv_indices.numel()
        if n > plan.kv_indices.numel():
            raise HarnessError("graph_capacity", f"{n} kv_indices exceed capacity {plan.kv_indices.numel()}")
        plan.kv_indices[:n].copy_(problem.kv_indices)

    def cast_call(self, layer):
        return _pool_rows, (self.pool.buffers[layer],)

    def prepare_kv(self, layer):
        """The pool's rows as e4m3 views (the KV dtype attention is handed); the kernel reads their bytes."""
        ckv, kpe = super().prepare_kv(layer)
        return ckv.view(torch.float8_e4m3fn), kpe.view(torch.float8_e4m3fn)

    def attend(self, plan: FusedPlan, q_nope, q_pe, kv):
        from harness.kernels.fused_mla_decode import fused_mla_decode

        ckv, kpe = (t.view(torch.uint8) for t in kv)  # e4m3 views or the raw bytes: the kernel reads uint8
        p = plan.problem
        # the plan's index buffers are filled by copies before the step's kernels (begin_step, replan_step); the
        # step writes each request's last NEW_TOKENS rows right before this layer's attention
        return fused_mla_decode(q_nope, q_pe, ckv, kpe, plan.kv_indptr, plan.kv_indices, p.sm_scale, plan.config,
                                kv_scale=self.kv_scale, partials=plan.partials, indices_ready=True, new_tokens=NEW_TOKENS)


def _pool_rows(pool_u8: torch.Tensor) -> torch.Tensor:
    """The uint8 pool itself: the kernel dequantizes as it reads."""
    return pool_u8
