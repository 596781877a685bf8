"""MoE layer of one TP rank: sigmoid router with grouped top-k (DeepSeek-V3's noaux_tc), routed
experts at the rank's shard width, one shared expert.

Routed experts run as one grouped GEMV per (token, expert) pair and output tile, reading only the
selected experts' FP8 blocks: a Triton kernel on CUDA (fixed shapes, capturable in a CUDA graph),
dequantize-and-multiply per pair on CPU.
"""

from __future__ import annotations

import math

import torch

from harness.tpot.fp8 import dequantize_blocks


def route(logits: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int, scaling: float):
    """(weights fp32 [B, k], ids int64 [B, k]): sigmoid scores, choice by score + bias within the best
    `topk_group` of `n_group` groups (a group scores by its top-2 sum), weights renormalized and scaled."""
    scores = logits.float().sigmoid()
    choice = scores + bias
    b, e = choice.shape
    grouped = choice.view(b, n_group, e // n_group)
    group_score = grouped.topk(min(2, e // n_group), dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_score).scatter_(1, group_score.topk(topk_group, dim=-1).indices, 1.0)
    masked = choice.masked_fill(~keep.bool().repeat_interleave(e // n_group, dim=1), float("-inf"))
    ids = masked.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    weights = weights / weights.sum(-1, keepdim=True) * scaling
    return weights, ids


class RoutedExperts:
    """Every routed expert's gate_up [2I, H] and down [H, I] at the rank's width I, FP8 with block scales."""

    def __init__(self, w13, s13, w2, s2):
        self.w13, self.s13, self.w2, self.s2 = w13, s13, w2, s2
        self.kernel = "triton_moe_gemv" if w13.is_cuda else "torch_per_pair_bf16"

    @property
    def bytes_per_expert(self) -> int:
        return (self.w13[0].numel() + self.w2[0].numel()) + (self.s13[0].numel() + self.s2[0].numel()) * 4

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        b, k = ids.shape
        flat_ids = ids.reshape(-1)
        if x.is_cuda:
            from harness.tpot.moe_kernel import expert_gemv

            gate_up = expert_gemv(x, k, self.w13, self.s13, flat_ids)
            h = _silu_mul(gate_up)
            down = expert_gemv(h, 1, self.w2, self.s2, flat_ids)
        else:
            down = torch.stack([self._pair_cpu(x[p // k], int(e)) for p, e in enumerate(flat_ids.tolist())])
        out = (down.float().view(b, k, -1) * weights[..., None]).sum(1)
        return out.to(torch.bfloat16)

    def _pair_cpu(self, x_row: torch.Tensor, e: int) -> torch.Tensor:
        w13 = dequantize_blocks(self.w13[e], self.s13[e]).to(torch.bfloat16)
        w2 = dequantize_blocks(self.w2[e], self.s2[e]).to(torch.bfloat16)
        h = _silu_mul((x_row[None] @ w13.t()))
        return (h @ w2.t())[0]


def _silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(torch.bfloat16)


def naive_route(logits, bias, top_k, n_group, topk_group, scaling):
    """Per-token reference of `route` in plain Python (for tests)."""
    out_w, out_ids = [], []
    for row_logits in logits.float().tolist():
        scores = [1 / (1 + math.exp(-v)) for v in row_logits]
        choice = [s + float(c) for s, c in zip(scores, bias.tolist())]
        size = len(choice) // n_group
        group_scores = [sum(sorted(choice[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(n_group)]
        groups = sorted(range(n_group), key=lambda g: -group_scores[g])[:topk_group]
        allowed = [i for g in groups for i in range(g * size, (g + 1) * size)]
        ids = sorted(allowed, key=lambda i: -choice[i])[:top_k]
        w = [scores[i] for i in ids]
        out_ids.append(ids)
        out_w.append([v / sum(w) * scaling for v in w])
    return torch.tensor(out_w), torch.tensor(out_ids)
