"""Writes of new tokens' KV codes into a pool (and, for the shadow strategy, its BF16 shadow)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness.kernels.cast import e4m3_to_bf16
from harness.kernels.rowtile import check_index, load_rows, rows_2d, split_width, store_rows

BLOCK_R = 8
NUM_WARPS = 4


@triton.jit
def write_fp8_and_bf16_kernel(pool, pool_stride, shadow, shadow_stride, slots, codes, codes_stride, n,
                              BLOCK_R: tl.constexpr, HEAD: tl.constexpr, TAIL: tl.constexpr,
                              TAIL_P2: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < n
    slot = tl.load(slots + rows, mask=ok, other=0).to(tl.int64)
    head, tail = load_rows(codes, rows.to(tl.int64) * codes_stride, ok, HEAD, TAIL, TAIL_P2)
    store_rows(pool, slot * pool_stride, ok, head, tail, HEAD, TAIL, TAIL_P2)
    store_rows(shadow, slot * shadow_stride, ok, e4m3_to_bf16(head), e4m3_to_bf16(tail),
               HEAD, TAIL, TAIL_P2)


def _check(pool_u8, slots, codes_u8):
    pool, codes = rows_2d(pool_u8), rows_2d(codes_u8)
    check_index(slots)
    if pool_u8.dtype != torch.uint8 or codes_u8.dtype != torch.uint8:
        raise TypeError(f"pool and codes must be uint8, got {pool_u8.dtype}, {codes_u8.dtype}")
    if codes.shape != (slots.numel(), pool.shape[1]):
        raise ValueError(f"bad shapes: pool {tuple(pool_u8.shape)}, slots {tuple(slots.shape)}, "
                         f"codes {tuple(codes_u8.shape)}")
    return pool, codes


def write_fp8_and_bf16_(pool_u8: torch.Tensor, shadow_bf16: torch.Tensor, slots: torch.Tensor,
                        codes_u8: torch.Tensor) -> torch.Tensor:
    """pool_u8[slots[i]] = codes_u8[i] and shadow_bf16[slots[i]] = bf16(codes_u8[i]), one kernel.

    pool_u8: uint8 [rows, 1, width]; shadow_bf16: bfloat16 of the same row count and width;
    slots: int32 or int64 [n], contiguous; codes_u8: uint8 [n, width] or [n, 1, width].
    """
    pool, codes = _check(pool_u8, slots, codes_u8)
    shadow = rows_2d(shadow_bf16)
    if shadow_bf16.dtype != torch.bfloat16 or shadow.shape != pool.shape:
        raise ValueError(f"shadow must be bfloat16 {tuple(pool.shape)}, got {shadow_bf16.dtype} "
                         f"{tuple(shadow.shape)}")
    n = slots.numel()
    if n:
        head, tail, tail_p2 = split_width(pool.shape[1])
        write_fp8_and_bf16_kernel[(triton.cdiv(n, BLOCK_R),)](
            pool, pool.stride(0), shadow, shadow.stride(0), slots, codes, codes.stride(0), n,
            BLOCK_R=BLOCK_R, HEAD=head, TAIL=tail, TAIL_P2=tail_p2, num_warps=NUM_WARPS)
    return pool_u8


AOT_STAGE = "write"  # harness.kernels.sm120_compile


def aot_specs(width: int):
    """(label, kernel, signature, constexprs, num_warps) of every launched variant, for AOT builds."""
    head, tail, tail_p2 = split_width(width)
    sig = dict(pool="*u8", pool_stride="i32", shadow="*bf16", shadow_stride="i32", slots="*i64",
               codes="*u8", codes_stride="i32", n="i32")
    return [("write_fp8_and_bf16", write_fp8_and_bf16_kernel, sig,
             dict(HEAD=head, TAIL=tail, TAIL_P2=tail_p2, BLOCK_R=BLOCK_R), NUM_WARPS)]
