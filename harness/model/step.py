"""One decode step of one TP rank, as SGLang executes it, with attention through a strategy.

Per layer: input RMSNorm; fused q_a/kv_a projection; q_a and kv_a RMSNorms; the new token's
compressed KV (kv_a output, normalized, quantized to e4m3) written into the FP8 pool through the
strategy; q_b; q_nope x W_UK; the strategy's prepare_kv + attend on the pool; x W_UV; o_proj;
all-reduce; residual; post-attention RMSNorm; dense MLP or MoE (router, top-k routed experts, shared
expert); all-reduce; residual. Then the final norm and the lm_head shard.
Not modeled (small elementwise work): RoPE on q_pe / k_pe, the embedding lookup, the logits gather.
"""

from __future__ import annotations

import torch

from harness.model.allreduce import AllReduce
from harness.model.config import ModelShape
from harness.model.fp8 import FP8_MAX, bind_kernel
from harness.model.moe import _silu_mul, route
from harness.model.weights import RankWeights

EPS = 1e-6


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(torch.bfloat16) * weight


def kv_codes(ckv: torch.Tensor, kpe: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 576]: the token's KV row as unscaled e4m3 bits (SGLang's fp8_e4m3 KV cache)."""
    row = torch.cat([ckv, kpe], dim=-1).float().clamp(-FP8_MAX, FP8_MAX)
    return row.to(torch.float8_e4m3fn).view(torch.uint8)


class ModelStep:
    """The rank's forward for one decode batch; `strategy` supplies write / prepare_kv / attend."""

    def __init__(self, shape: ModelShape, weights: RankWeights, strategy, allreduce: AllReduce, batch_size: int):
        self.shape, self.weights, self.strategy, self.allreduce = shape, weights, strategy, allreduce
        self.kernels: dict[str, str] = {}
        cache: dict = {}
        for w in weights.fp8_linears():
            bind_kernel(w, batch_size, cache)
        names = {"qkv_a": weights.attn[0].qkv_a, "o_proj": weights.attn[0].o_proj, "q_b": weights.attn[0].q_b}
        if weights.moe:
            names["shared_gate_up"] = weights.moe[0].shared.gate_up
            self.kernels["routed_experts"] = weights.moe[0].experts.kernel
        if weights.dense:
            names["dense_gate_up"] = weights.dense[0].gate_up
        self.kernels.update({f"gemm:{k}": w.kernel for k, w in names.items()})
        self.kernels["w_kc/w_vc/router/lm_head"] = "torch bf16 (bmm / matmul)"
        self.last_expert_ids: dict[int, torch.Tensor] = {}  # layer -> routed ids of the last eager run
        self.attn_outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def attention(self, layer: int, a, x: torch.Tensor, plan, batch, slots) -> torch.Tensor:
        s, st = self.shape, self.strategy
        b = x.shape[0]
        qkv = a.qkv_a(rms_norm(x, a.input_norm))
        q = rms_norm(qkv[:, : s.q_lora_rank], a.q_a_norm)
        ckv = rms_norm(qkv[:, s.q_lora_rank : s.q_lora_rank + s.kv_lora_rank], a.kv_a_norm)
        kpe = qkv[:, s.q_lora_rank + s.kv_lora_rank :]
        st.write(batch, layer, slots, kv_codes(ckv, kpe))
        qh = a.q_b(q).view(b, s.heads, s.qk_nope_head_dim + s.qk_rope_head_dim)
        q_nope, q_pe = qh[..., : s.qk_nope_head_dim], qh[..., s.qk_nope_head_dim :].contiguous()
        q_abs = torch.bmm(q_nope.transpose(0, 1), a.w_kc).transpose(0, 1).contiguous()  # [B, heads, kv_lora]
        out, lse = st.attend(plan, q_abs, q_pe, st.prepare_kv(layer))
        if layer in self.record_layers:
            self.attn_outputs[layer] = (out.cpu(), lse.float().cpu())
        o = torch.bmm(out.transpose(0, 1), a.w_vc).transpose(0, 1).reshape(b, s.heads * s.v_head_dim)
        return self.allreduce(a.o_proj(o.contiguous()))

    def ffn(self, layer: int, f, is_moe: bool, x: torch.Tensor) -> torch.Tensor:
        if not is_moe:
            return f.down(_silu_mul(f.gate_up(x)))
        s = self.shape
        logits = x @ f.router.t()
        weights, ids = route(logits, f.bias, s.num_experts_per_tok, s.n_group, s.topk_group, s.routed_scaling_factor)
        if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.last_expert_ids[layer] = ids
        routed = f.experts(x, weights, ids)
        return routed + f.shared.down(_silu_mul(f.shared.gate_up(x)))

    def forward(self, hidden: torch.Tensor, plan, batch, slots, record_layers=()) -> torch.Tensor:
        """logits [B, vocab / tp] of one decode step from the hidden states [B, H] of the new tokens."""
        self.record_layers = set(record_layers)
        x = hidden
        for layer in range(self.shape.num_layers):
            a, f, is_moe = self.weights.for_layer(self.shape, layer)
            x = x + self.attention(layer, a, x, plan, batch, slots)
            x = x + self.allreduce(self.ffn(layer, f, is_moe, rms_norm(x, a.post_norm)))
        return rms_norm(x, self.weights.final_norm) @ self.weights.lm_head.t()

    def capture(self, hidden: torch.Tensor, batch, slots):
        """(plan, graph, logits): the whole step in one CUDA graph over a re-plannable plan."""
        st = self.strategy
        st.use_graph_capacity(len(batch.kv_indices))  # buffers the graph reads, refilled in place by replan_step
        plan = st.begin_step(batch, graph_capacity=len(batch.kv_indices))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.forward(hidden, plan, batch, slots)  # warm-up: Triton compiles, cuBLAS picks, outside capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # NCCL's watchdog thread polls events while we capture: only this thread's calls must be capture-safe
        mode = "thread_local" if self.allreduce.mode == "nccl" else "global"
        with torch.cuda.graph(graph, capture_error_mode=mode):
            logits = self.forward(hidden, plan, batch, slots)
        return plan, graph, logits
