"""One decode step of one TP rank, as SGLang executes it, with attention through a strategy.

Per layer: input RMSNorm; fused q_a/kv_a projection; q_a and kv_a RMSNorms; the new token's
compressed KV (kv_a output, normalized, quantized to e4m3) written into the FP8 pool through the
strategy; q_b; q_nope x W_UK; the strategy's prepare_kv + attend on the pool; x W_UV; o_proj;
all-reduce; residual; post-attention RMSNorm; dense MLP or MoE (router, top-k routed experts, shared
expert); all-reduce; residual. Then the final norm and the lm_head shard.
Not modeled (small elementwise work): RoPE on q_pe / k_pe, the embedding lookup, the logits gather.

`parts` (where the time goes): the same forward with only some components executed, the others
replaced by same-shape stand-ins (zeros, identity), so each component can be captured and timed as
its own CUDA graph over every layer, with the same weight rotation as the whole step:
  gemm       q_a/kv_a, q_b, W_UK, W_UV, o_proj, dense MLP GEMMs, lm_head
  moe        router, routing, routed experts, shared expert (+ their SiLU)
  attention  the new token's KV row (codes), the strategy's write, prepare_kv (casts) and attend
  allreduce  the two all-reduces per layer (model or real)
  other      RMSNorms, dense SiLU, residual adds
"""

from __future__ import annotations

import torch

from harness.execute.decode import attend
from harness.tpot.allreduce import AllReduce
from harness.tpot.config import ModelShape
from harness.tpot.fp8 import FP8_MAX, bind_kernels
from harness.tpot.moe import _silu_mul, route
from harness.tpot.weights import RankWeights

EPS = 1e-6
PARTS = ("gemm", "moe", "attention", "allreduce", "other")


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
        self.parts = frozenset(PARTS)
        self._stubs: dict = {}
        self.kernels["gemm_choice"] = bind_kernels(weights.fp8_linears(), batch_size)
        names = {"qkv_a": weights.attn[0].qkv_a, "o_proj": weights.attn[0].o_proj, "q_b": weights.attn[0].q_b}
        if weights.moe:
            names["shared_gate_up"] = weights.moe[0].shared.gate_up
            names["shared_down"] = weights.moe[0].shared.down
            self.kernels["routed_experts"] = weights.moe[0].experts.kernel
        if weights.dense:
            names["dense_gate_up"] = weights.dense[0].gate_up
            names["dense_down"] = weights.dense[0].down
        self.kernels.update({f"gemm:{k}": w.kernel for k, w in names.items()})
        self.kernels["w_kc/w_vc/router/lm_head"] = "torch bf16 (bmm / matmul)"
        self.last_expert_ids: dict[int, torch.Tensor] = {}  # layer -> routed ids of the last eager run
        self.attn_outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _stub(self, like: torch.Tensor, *shape, dtype=torch.bfloat16) -> torch.Tensor:
        """Zeros standing in for a component left out of `parts` (one tensor per shape, reused)."""
        key = (shape, dtype, like.device)
        if key not in self._stubs:
            self._stubs[key] = torch.zeros(shape, dtype=dtype, device=like.device)
        return self._stubs[key]

    def _gemm(self, w, x: torch.Tensor) -> torch.Tensor:
        return w(x) if "gemm" in self.parts else self._stub(x, x.shape[0], w.q.shape[0])

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight) if "other" in self.parts else x

    def _bmm_heads(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """[B, heads, a] x [heads, a, c] -> [B, heads, c] (the absorbed W_UK / W_UV)."""
        if "gemm" not in self.parts:
            return self._stub(x, x.shape[0], w.shape[0], w.shape[2])
        return torch.bmm(x.transpose(0, 1), w).transpose(0, 1)

    def attention(self, layer: int, a, x: torch.Tensor, plan, batch, slots) -> torch.Tensor:
        s, st = self.shape, self.strategy
        b = x.shape[0]
        qkv = self._gemm(a.qkv_a, self._norm(x, a.input_norm))
        q = self._norm(qkv[:, : s.q_lora_rank], a.q_a_norm)
        qh = self._gemm(a.q_b, q).view(b, s.heads, s.qk_nope_head_dim + s.qk_rope_head_dim)
        q_nope, q_pe = qh[..., : s.qk_nope_head_dim], qh[..., s.qk_nope_head_dim :].contiguous()
        q_abs = self._bmm_heads(q_nope, a.w_kc).contiguous()  # [B, heads, kv_lora]
        if "attention" in self.parts:
            ckv = rms_norm(qkv[:, s.q_lora_rank : s.q_lora_rank + s.kv_lora_rank], a.kv_a_norm)
            kpe = qkv[:, s.q_lora_rank + s.kv_lora_rank :]
            st.write(batch, layer, slots, kv_codes(ckv, kpe))
            out, lse = attend(st, plan, q_abs, q_pe, st.prepare_kv(layer))  # the session's attend: the dtype contract too
            if layer in self.record_layers:
                self.attn_outputs[layer] = (out.cpu(), lse.float().cpu())
        else:
            out = self._stub(x, b, s.heads, s.kv_lora_rank)
        o = self._bmm_heads(out, a.w_vc).reshape(b, s.heads * s.v_head_dim)
        return self._allreduce(self._gemm(a.o_proj, o.contiguous()))

    def _allreduce(self, t: torch.Tensor) -> torch.Tensor:
        return self.allreduce(t) if "allreduce" in self.parts else t

    def ffn(self, layer: int, f, is_moe: bool, x: torch.Tensor) -> torch.Tensor:
        if not is_moe:
            gate_up = self._gemm(f.gate_up, x)
            return self._gemm(f.down, _silu_mul(gate_up) if "other" in self.parts else gate_up[:, : gate_up.shape[1] // 2])
        if "moe" not in self.parts:
            return self._stub(x, x.shape[0], x.shape[1])
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
            x = x + self._allreduce(self.ffn(layer, f, is_moe, self._norm(x, a.post_norm)))
        x = self._norm(x, self.weights.final_norm)
        if "gemm" not in self.parts:
            return self._stub(x, x.shape[0], self.weights.lm_head.shape[0])
        return x @ self.weights.lm_head.t()

    def capture(self, hidden: torch.Tensor, batch, slots, parts=PARTS, plan=None):
        """(plan, graph, logits): the step (or only its `parts`) in one CUDA graph over a re-plannable
        plan (a given `plan` is reused: the strategy's graph buffers are set up once per strategy)."""
        st = self.strategy
        bad = set(parts) - set(PARTS)
        if bad:
            raise ValueError(f"unknown step parts {sorted(bad)}; known: {', '.join(PARTS)}")
        self.parts = frozenset(parts)
        if plan is None:
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
        self.parts = frozenset(PARTS)
        return plan, graph, logits
