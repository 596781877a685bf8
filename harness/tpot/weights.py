"""Random weights of one TP rank in the deployment's precision, with rotation of distinct sets.

FP8 e4m3 with 128 x 128 block scales for every linear layer SGLang loads block-quantized (fused
q_a/kv_a, q_b, o_proj, dense and shared-expert MLPs, routed experts); BF16 for norms, the router,
the absorbed W_UK / W_UV (kv_b split per head) and the lm_head shard.

`weight_sets` distinct sets are made per kind (attention, dense FFN, MoE FFN); layer l uses set
l mod weight_sets of its kind, so weights re-read by a later layer have streamed `weight_sets - 1`
other layers through L2 in between.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.tpot.config import BLOCK, ModelShape
from harness.tpot.fp8 import FP8Weight, quantize_blocks
from harness.tpot.moe import RoutedExperts


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _normal(shape, seed: int, device, fan_in: int) -> torch.Tensor:
    """N(0, 1/fan_in) made in 128-row chunks on the device (keeps host memory small at prod size)."""
    out = torch.empty(shape, dtype=torch.float32, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    flat = out.view(-1, shape[-1])
    for start in range(0, flat.shape[0], 1 << 14):
        flat[start : start + (1 << 14)].normal_(0.0, fan_in ** -0.5, generator=gen)
    return out


def fp8_linear(n: int, k: int, seed: int, device) -> FP8Weight:
    q, scale = quantize_blocks(_normal((n, k), seed, device, k))
    return FP8Weight(q, scale)


@dataclass
class AttnWeights:
    input_norm: torch.Tensor  # bf16 [H]
    qkv_a: FP8Weight  # [q_lora + kv_lora + rope, H]: SGLang's fused_qkv_a_proj_with_mqa (replicated)
    q_a_norm: torch.Tensor
    kv_a_norm: torch.Tensor
    q_b: FP8Weight  # [heads * (nope + rope), q_lora] (column-parallel)
    w_kc: torch.Tensor  # bf16 [heads, nope, kv_lora]: W_UK, absorbed into the query
    w_vc: torch.Tensor  # bf16 [heads, kv_lora, v]: W_UV, absorbed into the output
    o_proj: FP8Weight  # [H, heads * v] (row-parallel)
    post_norm: torch.Tensor


@dataclass
class DenseWeights:
    gate_up: FP8Weight  # [2 * inter, H]
    down: FP8Weight  # [H, inter]


@dataclass
class MoEWeights:
    router: torch.Tensor  # bf16 [E, H]
    bias: torch.Tensor  # fp32 [E]: e_score_correction_bias
    experts: RoutedExperts
    shared: DenseWeights


def _norm(n: int, device) -> torch.Tensor:
    return torch.ones(n, dtype=torch.bfloat16, device=device)


def attn_weights(s: ModelShape, seed: int, device) -> AttnWeights:
    h, heads = s.hidden_size, s.heads
    w_kc = _normal((heads, s.qk_nope_head_dim, s.kv_lora_rank), seed + 4, device, s.qk_nope_head_dim)
    w_vc = _normal((heads, s.kv_lora_rank, s.v_head_dim), seed + 5, device, s.kv_lora_rank)
    return AttnWeights(
        input_norm=_norm(h, device),
        qkv_a=fp8_linear(s.q_lora_rank + s.kv_a_width, h, seed + 1, device),
        q_a_norm=_norm(s.q_lora_rank, device),
        kv_a_norm=_norm(s.kv_lora_rank, device),
        q_b=fp8_linear(heads * (s.qk_nope_head_dim + s.qk_rope_head_dim), s.q_lora_rank, seed + 2, device),
        w_kc=w_kc.to(torch.bfloat16),
        w_vc=w_vc.to(torch.bfloat16),
        o_proj=fp8_linear(h, heads * s.v_head_dim, seed + 3, device),
        post_norm=_norm(h, device),
    )


def dense_weights(h: int, inter: int, seed: int, device) -> DenseWeights:
    return DenseWeights(fp8_linear(2 * inter, h, seed + 1, device), fp8_linear(h, inter, seed + 2, device))


def moe_weights(s: ModelShape, seed: int, device) -> MoEWeights:
    h, inter, e = s.hidden_size, s.moe_inter, s.n_routed_experts
    w13 = torch.empty((e, 2 * inter, h), dtype=torch.float8_e4m3fn, device=device)
    s13 = torch.empty((e, 2 * inter // BLOCK, h // BLOCK), dtype=torch.float32, device=device)
    w2 = torch.empty((e, h, inter), dtype=torch.float8_e4m3fn, device=device)
    s2 = torch.empty((e, h // BLOCK, inter // BLOCK), dtype=torch.float32, device=device)
    for i in range(e):  # one expert at a time: the float32 staging stays small
        w13[i], s13[i] = quantize_blocks(_normal((2 * inter, h), seed + 10 + 2 * i, device, h))
        w2[i], s2[i] = quantize_blocks(_normal((h, inter), seed + 11 + 2 * i, device, inter))
    bias = torch.randn(e, generator=_gen(seed + 3)).mul_(0.01).to(device)
    return MoEWeights(
        router=_normal((e, h), seed + 4, device, h).to(torch.bfloat16),
        bias=bias,
        experts=RoutedExperts(w13, s13, w2, s2),
        shared=dense_weights(h, inter * s.n_shared_experts, seed + 5, device),
    )


@dataclass
class RankWeights:
    attn: list[AttnWeights]
    dense: list[DenseWeights]
    moe: list[MoEWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # bf16 [vocab / tp, H]

    def for_layer(self, shape: ModelShape, layer: int):
        """(attention weights, FFN weights, is_moe) of `layer` under rotation."""
        ffn = self.moe[(layer - shape.first_k_dense) % len(self.moe)] if shape.is_moe(layer) else self.dense[layer % len(self.dense)]
        return self.attn[layer % len(self.attn)], ffn, shape.is_moe(layer)

    def sets_read(self, shape: ModelShape) -> int:
        """Distinct weight sets the step reads over its layers, attention and FFN told apart by where their first FP8
        matrix lives (a set re-read is the same memory): 2 x layers when no layer re-reads another's."""
        where = set()
        for layer in range(shape.num_layers):
            a, f, is_moe = self.for_layer(shape, layer)
            where |= {a.qkv_a.q.data_ptr(), (f.experts.w13 if is_moe else f.gate_up.q).data_ptr()}
        return len(where)

    def fp8_linears(self):
        for a in self.attn:
            yield from (a.qkv_a, a.q_b, a.o_proj)
        for d in self.dense + [m.shared for m in self.moe]:
            yield from (d.gate_up, d.down)


def make_weights(s: ModelShape, weight_sets: int, seed: int, device) -> RankWeights:
    n_moe = s.num_layers - s.first_k_dense
    return RankWeights(
        attn=[attn_weights(s, seed + 100 * i, device) for i in range(min(weight_sets, s.num_layers))],
        dense=[dense_weights(s.hidden_size, s.dense_inter, seed + 10_000 + 100 * i, device) for i in range(min(weight_sets, s.first_k_dense))],
        moe=[moe_weights(s, seed + 1_000_000 * (i + 1), device) for i in range(min(weight_sets, n_moe))],
        final_norm=_norm(s.hidden_size, device),
        lm_head=_normal((s.vocab, s.hidden_size), seed + 7, device, s.hidden_size).to(torch.bfloat16),
    )
