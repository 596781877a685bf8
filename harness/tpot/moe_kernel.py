"""Triton grouped GEMV for routed experts: out[p, n] = sum_k x[p // div, k] * W[ids[p], n, k] * scale.

One program per (token-expert pair, tile of BLOCK_N outputs); it streams only its expert's FP8
tiles (128-wide K tiles, one block scale each). Fixed grid for a fixed batch: graph-capturable.
Tokens that pick the same expert read its tiles once each from the kernel's view (repeats may hit L2).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 32
BLOCK_K = 128


@triton.jit
def _expert_gemv_kernel(x_ptr, w_ptr, s_ptr, ids_ptr, out_ptr, N, K, row_div,
                        stride_we, stride_se, stride_sn, stride_sk,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    p = tl.program_id(0)
    nb = tl.program_id(1)
    e = tl.load(ids_ptr + p).to(tl.int64)
    row = p // row_div
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    scale_row = (nb * BLOCK_N) // 128
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x_ptr + row * K + offs_k).to(tl.float32)
        w = tl.load(w_ptr + e * stride_we + offs_n[:, None] * K + offs_k[None, :], mask=n_mask[:, None], other=0.0)
        s = tl.load(s_ptr + e * stride_se + scale_row * stride_sn + (k0 // 128) * stride_sk)
        acc += tl.sum(w.to(tl.float32) * xk[None, :], axis=1) * s
    tl.store(out_ptr + p * N + offs_n, acc.to(tl.bfloat16), mask=n_mask)


def expert_gemv(x: torch.Tensor, row_div: int, w: torch.Tensor, s: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """bf16 [P, N] for pairs p with input row p // row_div and expert ids[p]; w fp8 [E, N, K], s fp32 [E, N/128, K/128]."""
    pairs, (_, n, k) = ids.numel(), w.shape
    assert k % BLOCK_K == 0 and x.shape[1] == k and x.is_contiguous() and w.is_contiguous()
    out = torch.empty((pairs, n), dtype=torch.bfloat16, device=x.device)
    grid = (pairs, triton.cdiv(n, BLOCK_N))
    _expert_gemv_kernel[grid](x, w, s, ids, out, n, k, row_div, w.stride(0), s.stride(0), s.stride(1), s.stride(2),
                              BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return out
