"""Byte accounting of one decode step (the roofline's numerator) and the rank's memory footprint."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.tpot.config import BLOCK, ModelShape

L2_BYTES = 50 * 1024**2  # H200 L2: the working set between weight reuses must exceed it several times


def _fp8_bytes(n: int, k: int) -> int:
    return n * k + (-(-n // BLOCK)) * (k // BLOCK) * 4


def attn_weight_bytes(s: ModelShape) -> int:
    qkv_a = _fp8_bytes(s.q_lora_rank + s.kv_a_width, s.hidden_size)
    q_b = _fp8_bytes(s.heads * (s.qk_nope_head_dim + s.qk_rope_head_dim), s.q_lora_rank)
    absorbed = 2 * s.heads * s.kv_lora_rank * (s.qk_nope_head_dim + s.v_head_dim)
    return qkv_a + q_b + absorbed + _fp8_bytes(s.hidden_size, s.heads * s.v_head_dim)


def mlp_bytes(h: int, inter: int) -> int:
    return _fp8_bytes(2 * inter, h) + _fp8_bytes(h, inter)


def expert_bytes(s: ModelShape) -> int:
    return mlp_bytes(s.hidden_size, s.moe_inter)


def moe_fixed_bytes(s: ModelShape) -> int:
    """Router (BF16) + correction bias + shared expert: read whatever the routing."""
    return 2 * s.n_routed_experts * s.hidden_size + 4 * s.n_routed_experts + mlp_bytes(s.hidden_size, s.moe_inter * s.n_shared_experts)


def lm_head_bytes(s: ModelShape) -> int:
    return 2 * s.vocab * s.hidden_size


def full_rank_weight_bytes(s: ModelShape) -> int:
    """Every weight one rank holds when the model is loaded (no rotation), embedding included."""
    n_moe = s.num_layers - s.first_k_dense
    per_moe = moe_fixed_bytes(s) + s.n_routed_experts * expert_bytes(s)
    layers = s.num_layers * attn_weight_bytes(s) + s.first_k_dense * mlp_bytes(s.hidden_size, s.dense_inter) + n_moe * per_moe
    return layers + 2 * lm_head_bytes(s)  # lm_head shard + vocab-parallel embedding shard


@dataclass(frozen=True)
class StepBytes:
    """Bytes one decode step must move: weights read, KV read + written, cast read + written."""

    weights: int
    kv: int
    cast: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.cast


def layer_weight_bytes(s: ModelShape, layer: int, active_experts: int) -> int:
    ffn = moe_fixed_bytes(s) + active_experts * expert_bytes(s) if s.is_moe(layer) else mlp_bytes(s.hidden_size, s.dense_inter)
    return attn_weight_bytes(s) + ffn


def step_bytes(s: ModelShape, expert_ids: dict[int, torch.Tensor], strategy_cls, geometry, batch) -> StepBytes:
    """`expert_ids`: layer -> ids routed in the step (distinct experts are read once each)."""
    weights = lm_head_bytes(s)
    for layer in range(s.num_layers):
        active = int(expert_ids[layer].unique().numel()) if s.is_moe(layer) else 0
        weights += layer_weight_bytes(s, layer, active)
    # the active rows read in the KV dtype, plus what the strategy's KV write stores (shadow: the BF16 copy too)
    per_layer_kv = strategy_cls.kv_read_bytes(geometry, batch) + strategy_cls.write_bytes(geometry, batch)
    cast = strategy_cls.cast_bytes(geometry, batch) * s.num_layers
    return StepBytes(weights, per_layer_kv * s.num_layers, cast)


def reuse_distance_bytes(s: ModelShape, weight_sets: int, active_experts: int) -> int:
    """Smallest number of weight bytes streamed between two reads of the same rotated set."""
    if weight_sets >= s.num_layers:
        return -1  # nothing is reused
    return (weight_sets - 1) * layer_weight_bytes(s, s.first_k_dense, active_experts)
