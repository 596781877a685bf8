"""KV codes of `harness.spec.synth` generated on the device, bit-identical to `synth.kv_codes`.

Each program owns BLOCK_R rows: the row keys fmix(fmix(base ^ slot) ^ gen) are
computed once per row, then the row is produced in BLOCK_C-channel chunks, each
element one fmix32 in uint32 arithmetic (wrapping multiply) plus one lookup in
the concatenated code table [main | outlier] (128 KiB, cache resident).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

from harness.kernels.rowtile import rows_2d
from harness.spec import synth

BLOCK_R = 32
MAX_BLOCK_C = 64
NUM_WARPS = 4


def block_c(width: int) -> int:
    """Channel chunk: the largest power of two dividing width, at most MAX_BLOCK_C."""
    return min(MAX_BLOCK_C, width & -width)


def as_i32(key: int) -> int:
    """A uint32 key as the int32 with the same bits (kernel arguments stay i32)."""
    return key - (1 << 32) if key >= 1 << 31 else key


@functools.lru_cache(maxsize=None)
def code_table(device: torch.device) -> torch.Tensor:
    """uint8[131072] on `device`: main codes, then outlier codes."""
    table = np.concatenate([synth.main_codes(), synth.outlier_codes()])
    return torch.from_numpy(table).to(device)


@triton.jit
def fmix32(x):
    """MurmurHash3's 32-bit finalizer on uint32 values."""
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def kv_codes_kernel(out, out_stride, slots, gens, n_rows, first_slot, key, table,
                    WIDTH: tl.constexpr, SLOTS_FROM_ROW: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < n_rows
    if SLOTS_FROM_ROW:
        slot = (rows + first_slot).to(tl.uint32)
        gen = tl.zeros([BLOCK_R], tl.uint32)
    else:
        slot = tl.load(slots + rows, mask=ok, other=0).to(tl.uint32)
        gen = tl.load(gens + rows, mask=ok, other=0).to(tl.uint32)
    row_key = fmix32(fmix32(tl.cast(key, tl.uint32, bitcast=True) ^ slot) ^ gen)
    dst = out + rows.to(tl.int64)[:, None] * out_stride
    for c0 in tl.static_range(0, WIDTH, BLOCK_C):
        ch = c0 + tl.arange(0, BLOCK_C)
        h = fmix32(row_key[:, None] ^ ch.to(tl.uint32)[None, :])
        idx = (h >> 16).to(tl.int32) + tl.where((h & 0x3FF) == 0, 65536, 0)
        tl.store(dst + ch[None, :], tl.load(table + idx), mask=ok[:, None])


def _launch(out2d, slots, gens, n, first_slot, seed, layer, slots_from_row):
    width = out2d.shape[1]
    kv_codes_kernel[(triton.cdiv(n, BLOCK_R),)](
        out2d, out2d.stride(0), slots, gens, n, first_slot,
        as_i32(synth.kv_base_key(seed, layer)), code_table(out2d.device),
        WIDTH=width, SLOTS_FROM_ROW=slots_from_row, BLOCK_R=BLOCK_R, BLOCK_C=block_c(width),
        num_warps=NUM_WARPS)


def fill_layer_(buf_u8: torch.Tensor, seed: int, layer: int, page_size: int = 1) -> torch.Tensor:
    """Fill a uint8 [rows, 1, width] (or [rows, width]) pool: the first page_size rows zeros,
    row s the generation-0 codes of slot s, i.e. synth.kv_codes(seed, layer, range(page_size, rows), 0, width)."""
    if buf_u8.dtype != torch.uint8:
        raise TypeError(f"pool must be uint8, got {buf_u8.dtype}")
    flat = rows_2d(buf_u8)
    flat[:page_size].zero_()
    if flat.shape[0] > page_size:
        _launch(flat[page_size:], flat, flat, flat.shape[0] - page_size, page_size, seed, layer, True)
    return buf_u8


def _index(values, n: int | None, device) -> torch.Tensor:
    """An int64 device tensor of `values` (broadcast to n when given)."""
    if isinstance(values, torch.Tensor):
        t = values.to(device=device, dtype=torch.int64)
    else:
        t = torch.from_numpy(np.asarray(values, dtype=np.int64)).to(device)
    return t.reshape(-1) if n is None else t.expand(n).contiguous()


def kv_codes_cuda(seed: int, layer: int, slots, gens, width: int, device="cuda") -> torch.Tensor:
    """uint8 [len(slots), width] on `device`, bit-identical to synth.kv_codes(seed, layer, slots, gens, width)."""
    slots_t = _index(slots, None, device).contiguous()
    n = slots_t.numel()
    gens_t = _index(gens, n, device)
    out = torch.empty((n, width), dtype=torch.uint8, device=device)
    if n:
        _launch(out, slots_t, gens_t, n, 0, seed, layer, False)
    return out


AOT_STAGE = "inputs"  # harness.kernels.sm120_compile: compiled first, with the pool's kernels


def aot_specs(width: int):
    """(label, kernel, signature, constexprs, num_warps) of every launched variant, for AOT builds."""
    fill = dict(out="*u8", out_stride="i32", n_rows="i32", first_slot="i32", key="i32", table="*u8")
    consts = dict(WIDTH=width, BLOCK_R=BLOCK_R, BLOCK_C=block_c(width))
    return [
        ("fill_layer", kv_codes_kernel, dict(fill, slots="*u8", gens="*u8"), dict(consts, SLOTS_FROM_ROW=True), NUM_WARPS),
        ("kv_codes", kv_codes_kernel, dict(fill, slots="*i64", gens="*i64"), dict(consts, SLOTS_FROM_ROW=False), NUM_WARPS),
    ]
