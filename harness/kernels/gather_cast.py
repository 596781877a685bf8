"""Fused gather + cast: out[i] = bf16(src[indices[i]]) for the active rows of a step.

CUDA-graph capturable: the grid is fixed by indices.numel() (a shape, known on the
host), and an optional device-side `count` (int32 [1]) limits the rows written, so
a graph captured at capacity can be replayed for any count <= capacity without a
host sync. Rows at or past the count are left untouched. Launch once before
capture so that compilation happens outside the graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness.kernels.cast import e4m3_to_bf16
from harness.kernels.rowtile import check_index, load_rows, rows_2d, split_width, store_rows

BLOCK_R = 8
NUM_WARPS = 4


@triton.jit
def gather_cast_kernel(src, src_stride, indices, count, out, out_stride, n,
                       HAS_COUNT: tl.constexpr, BLOCK_R: tl.constexpr,
                       HEAD: tl.constexpr, TAIL: tl.constexpr, TAIL_P2: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < n
    if HAS_COUNT:
        ok = ok & (rows < tl.load(count))
    idx = tl.load(indices + rows, mask=ok, other=0).to(tl.int64)
    head, tail = load_rows(src, idx * src_stride, ok, HEAD, TAIL, TAIL_P2)
    store_rows(out, rows.to(tl.int64) * out_stride, ok, e4m3_to_bf16(head), e4m3_to_bf16(tail),
               HEAD, TAIL, TAIL_P2)


def gather_cast_(src_u8: torch.Tensor, indices: torch.Tensor, out_bf16: torch.Tensor,
                 count: torch.Tensor | None = None) -> torch.Tensor:
    """out_bf16[i] = bf16(src_u8[indices[i]]) for i < min(indices.numel(), count).

    src_u8: uint8 [rows, 1, width]; indices: int32 or int64 [n], contiguous, on the same
    device; out_bf16: bfloat16 [capacity >= n, 1, width]; count: optional int32 [1].
    """
    if src_u8.dtype != torch.uint8 or out_bf16.dtype != torch.bfloat16:
        raise TypeError(f"expected uint8 -> bfloat16, got {src_u8.dtype} -> {out_bf16.dtype}")
    src, out = rows_2d(src_u8), rows_2d(out_bf16)
    check_index(indices)
    n = indices.numel()
    if src.shape[1] != out.shape[1] or n > out.shape[0]:
        raise ValueError(f"bad shapes: src {tuple(src_u8.shape)}, indices {tuple(indices.shape)}, "
                         f"out {tuple(out_bf16.shape)}")
    if n:
        head, tail, tail_p2 = split_width(src.shape[1])
        gather_cast_kernel[(triton.cdiv(n, BLOCK_R),)](
            src, src.stride(0), indices, indices if count is None else count, out, out.stride(0), n,
            HAS_COUNT=count is not None, BLOCK_R=BLOCK_R, HEAD=head, TAIL=tail, TAIL_P2=tail_p2,
            num_warps=NUM_WARPS)
    return out_bf16


AOT_STAGE = "prepare_kv"  # harness.kernels.sm120_compile


def aot_specs(width: int):
    """(label, kernel, signature, constexprs, num_warps) of every launched variant, for AOT builds."""
    head, tail, tail_p2 = split_width(width)
    rows = dict(HEAD=head, TAIL=tail, TAIL_P2=tail_p2, BLOCK_R=BLOCK_R)
    sig = dict(src="*u8", src_stride="i32", indices="*i32", out="*bf16", out_stride="i32", n="i32", count="*i32")
    return [("gather_cast", gather_cast_kernel, sig, dict(rows, HAS_COUNT=False), NUM_WARPS),
            ("gather_cast_count", gather_cast_kernel, sig, dict(rows, HAS_COUNT=True), NUM_WARPS)]
