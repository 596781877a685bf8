"""The attention-backend contract: plan once per decode step, run once per layer.

A backend computes absorbed-MLA decode attention (one query token per request)
over a paged KV cache with page_size 1, split into a compressed part `ckv`
[rows, 1, 512] and a RoPE part `kpe` [rows, 1, 64] (views of one pool row).
It knows nothing of strategies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch

from harness.errors import HarnessError


@dataclass(frozen=True)
class AttnProblem:
    """What a plan depends on: the batch's KV index lists and the head layout."""

    kv_indptr: torch.Tensor  # int32 [B+1], on the host (planning is host work)
    kv_indices: torch.Tensor  # int32 [nnz], rows of the KV buffer the run will get
    num_heads: int
    sm_scale: float
    kv_dtype: torch.dtype  # torch.bfloat16 or torch.float8_e4m3fn
    head_dim_ckv: int = 512
    head_dim_kpe: int = 64

    @property
    def batch_size(self) -> int:
        return self.kv_indptr.numel() - 1

    @property
    def kv_lens(self) -> torch.Tensor:
        return self.kv_indptr[1:] - self.kv_indptr[:-1]


def refuse_kv_scale(kv_scale: Optional[float], kv_dtype: torch.dtype) -> None:
    """Only FP8 KV takes a per-tensor scale: every backend's `run` refuses one handed with KV of another dtype, in
    these words (SGLang's BF16 pool takes none)."""
    if kv_scale is not None and kv_dtype != torch.float8_e4m3fn:
        raise HarnessError("kv_scale", f"only FP8 KV takes a scale; the KV handed is {kv_dtype}")


class Backend(Protocol):
    name: str

    def unsupported_reason(self, device: torch.device, kv_dtype: torch.dtype) -> Optional[str]:
        """None when this backend can attend on `kv_dtype` KV on `device`, else why not."""

    def plan(self, problem: AttnProblem, graph_capacity: Optional[int] = None) -> Any:
        """Host-side planning for one decode step; the result is reused for every layer.
        With `graph_capacity` (max kv_indices) the plan can be captured and `replan`ned in place."""

    def replan(self, plan: Any, problem: AttnProblem) -> None:
        """Re-plan a graph-capturable plan in place for a new step (raises if the backend cannot)."""

    def run(
        self,
        plan: Any,
        q_nope: torch.Tensor,  # bf16 [B, H, 512]
        q_pe: torch.Tensor,  # bf16 [B, H, 64]
        ckv: torch.Tensor,  # [rows, 1, 512], bf16 or fp8 (kv_dtype of the plan)
        kpe: torch.Tensor,  # [rows, 1, 64]
        kv_scale: Optional[float] = None,  # per-tensor scale, FP8 KV only
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(out bf16 [B, H, 512], lse fp32 [B, H] in natural log) for one layer."""
