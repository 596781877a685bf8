"""Reference-grade attention in plain torch (CPU and CUDA): BF16 or FP8 KV, float64 math.

Each request's rows are gathered in plan order, upcast to float64 (times the
per-tensor scale for FP8 KV), and attended with float64 matmuls; the output is
rounded to bf16 once, the LSE to fp32. Identical KV values give identical bits
however BLAS splits the sums: in fp32, MKL's thread split (fewer threads on a
loaded machine) changed a few bf16 outputs between two runs of one request, so
a bitwise-tier strategy failed against stock at random (stock's first call in
a process on a loaded 2-core CI machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from harness.backends.base import AttnProblem, refuse_kv_scale

MATH = torch.float64  # the dtype of every sum (module docstring: why not fp32)


@dataclass(frozen=True)
class TorchPlan:
    problem: AttnProblem
    spans: tuple[tuple[int, int], ...]
    indices: torch.Tensor  # int64


class TorchBackend:
    name = "torch"

    def __init__(self, device: torch.device):
        self.device = device

    def unsupported_reason(self, device: torch.device, kv_dtype: torch.dtype) -> Optional[str]:
        if kv_dtype not in (torch.bfloat16, torch.float8_e4m3fn):
            return f"torch backend takes bf16 or float8_e4m3fn KV, not {kv_dtype}"
        return None

    def plan(self, problem: AttnProblem, graph_capacity: Optional[int] = None) -> TorchPlan:
        """A host-side plan; `graph_capacity` is accepted for interface parity and unused."""
        bounds = problem.kv_indptr.tolist()
        spans = tuple(zip(bounds[:-1], bounds[1:]))
        return TorchPlan(problem, spans, problem.kv_indices.to(torch.int64))

    def replan(self, plan: TorchPlan, problem: AttnProblem) -> None:
        raise NotImplementedError("the torch backend plans on the host (.tolist()); it is not graph-capturable")

    def run(self, plan, q_nope, q_pe, ckv, kpe, kv_scale: Optional[float] = None):
        problem = plan.problem
        refuse_kv_scale(kv_scale, ckv.dtype)
        ckv2, kpe2 = ckv.reshape(ckv.shape[0], -1), kpe.reshape(kpe.shape[0], -1)
        scale = 1.0 if kv_scale is None else kv_scale
        outs, lses = [], []
        for b, (start, stop) in enumerate(plan.spans):
            idx = plan.indices[start:stop]
            c = ckv2.index_select(0, idx).to(MATH)
            k = kpe2.index_select(0, idx).to(MATH)
            if ckv.dtype == torch.float8_e4m3fn:  # the KV handed (SGLang's stand-in wrapper: whatever a patch hands)
                c, k = c * scale, k * scale
            logits = (q_nope[b].to(MATH) @ c.T + q_pe[b].to(MATH) @ k.T) * problem.sm_scale
            lse = torch.logsumexp(logits, dim=-1)
            outs.append((torch.exp(logits - lse[:, None]) @ c).to(torch.bfloat16))
            lses.append(lse.float())
        return torch.stack(outs), torch.stack(lses)
