"""Row tiles of a [rows, width] buffer, shared by the row-wise kernels.

A row of `width` channels is moved as two power-of-two tiles, HEAD (the largest
power of two below width) and TAIL (the rest, masked up to TAIL_P2), so a whole
row is loaded before anything is stored: 576 = 512 + 64 with no masked lanes.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


def split_width(width: int) -> tuple[int, int, int]:
    """(HEAD, TAIL, TAIL_P2) for a row of `width` >= 2 channels."""
    if width < 2:
        raise ValueError(f"row width must be >= 2, got {width}")
    head = 1 << ((width - 1).bit_length() - 1)
    tail = width - head
    return head, tail, 1 << (tail - 1).bit_length()


def rows_2d(t: torch.Tensor) -> torch.Tensor:
    """`t` viewed as [t.shape[0], width] with unit channel stride (no copy)."""
    flat = t.view(t.shape[0], math.prod(t.shape[1:]))
    if flat.stride(1) != 1:
        raise ValueError(f"channels of a {tuple(t.shape)} tensor must be contiguous")
    return flat


def check_index(t: torch.Tensor) -> None:
    """Row indices must be a contiguous int32 or int64 vector."""
    if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1 or not t.is_contiguous():
        raise ValueError(f"indices must be contiguous int32/int64 [n], got {t.dtype} {tuple(t.shape)}")


@triton.jit
def load_rows(base, row_off, ok, HEAD: tl.constexpr, TAIL: tl.constexpr, TAIL_P2: tl.constexpr):
    """Load rows `base + row_off` (masked by `ok`) as (head [R, HEAD], tail [R, TAIL_P2])."""
    rows = base + row_off[:, None]
    ch = tl.arange(0, TAIL_P2)
    head = tl.load(rows + tl.arange(0, HEAD)[None, :], mask=ok[:, None])
    tail = tl.load(rows + HEAD + ch[None, :], mask=ok[:, None] & (ch < TAIL)[None, :])
    return head, tail


@triton.jit
def store_rows(base, row_off, ok, head, tail, HEAD: tl.constexpr, TAIL: tl.constexpr, TAIL_P2: tl.constexpr):
    """Store (head, tail) tiles from `load_rows` into rows `base + row_off` (masked by `ok`)."""
    rows = base + row_off[:, None]
    ch = tl.arange(0, TAIL_P2)
    tl.store(rows + tl.arange(0, HEAD)[None, :], head, mask=ok[:, None])
    tl.store(rows + HEAD + ch[None, :], tail, mask=ok[:, None] & (ch < TAIL)[None, :])
