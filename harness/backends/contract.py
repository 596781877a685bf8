"""The attention boundary's dtype contract, asserted by the decode session after every attend.

Queries bf16, KV of the strategy's declared `kv_dtype` (ckv and kpe alike; register(kv_dtype=...)),
output bf16 [B, H, 512], LSE fp32 [B, H]. It knows nothing of the registry: the session passes the
strategy's declared dtype (harness.execute.decode.attend), so no strategy's own `attend` can skip it.
"""

from __future__ import annotations

import torch

from harness.spec.presets import KV_LORA_RANK as OUT_WIDTH  # the absorbed-MLA output per head (a preset's only kv_lora_rank)


class ContractViolation(AssertionError):
    """A strategy or backend handed over or returned tensors of the wrong dtype or shape."""


def check_boundary(strategy: str, kv_dtype: torch.dtype | None, q_nope, ckv, kpe, out, lse) -> None:
    """Raise ContractViolation naming `strategy` and every broken term (kv_dtype None: KV dtype unchecked)."""
    problems = []
    if q_nope.dtype != torch.bfloat16:
        problems.append(f"queries are {q_nope.dtype}, not bfloat16")
    if kv_dtype is not None and (ckv.dtype != kv_dtype or kpe.dtype != kv_dtype):
        problems.append(f"KV handed to the backend is {ckv.dtype}/{kpe.dtype}, not {kv_dtype}")
    batch, heads = q_nope.shape[0], q_nope.shape[1]
    if out.dtype != torch.bfloat16 or tuple(out.shape) != (batch, heads, OUT_WIDTH):
        problems.append(f"output is {out.dtype} {tuple(out.shape)}, not bfloat16 {(batch, heads, OUT_WIDTH)}")
    if lse.dtype != torch.float32 or tuple(lse.shape) != (batch, heads):
        problems.append(f"LSE is {lse.dtype} {tuple(lse.shape)}, not float32 {(batch, heads)}")
    if problems:
        raise ContractViolation(f"{strategy} dtype contract: {'; '.join(problems)}")
