"""Counter-based integer hash that generates pool bytes and queries.

Every value is a pure function of integers (seed, layer, slot, generation,
channel) through MurmurHash3's 32-bit finalizer in unsigned 32-bit arithmetic
(wrap-around is defined in numpy, Python ints masked to 32 bits, and Triton's
uint32), so CPU and every GPU produce identical bytes and any subset of rows can
be produced alone.

KV codes are e4m3 bit patterns drawn by an integer inverse-CDF of a normal
distribution (sigma 1) with rare outliers (1 in 1024, sigma 24), clamped to the
finite e4m3 range: no NaN codes are ever produced.
"""

from __future__ import annotations

import functools
from statistics import NormalDist

import numpy as np
import torch

GENERATOR_VERSION = "synth-v1"
M32 = 0xFFFFFFFF
C1, C2 = 0x85EBCA6B, 0xC2B2AE35
CHAIN_START = 0x9E3779B9
KV_DOMAIN = 0x4B56
Q_DOMAIN = 0x5152
SLOT_ORDER_DOMAIN = 0x534C
OUTLIER_MASK = 0x3FF
MAIN_SIGMA = 1.0
OUTLIER_SIGMA = 24.0
E4M3_MAX = 448.0


def fmix32_int(x: int) -> int:
    """MurmurHash3's 32-bit finalizer on a Python int (the scalar reference)."""
    x &= M32
    x ^= x >> 16
    x = (x * C1) & M32
    x ^= x >> 13
    x = (x * C2) & M32
    return x ^ (x >> 16)


def fmix32(x: np.ndarray) -> np.ndarray:
    """The same finalizer, vectorized over a uint32 array (wraps mod 2**32)."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(C1)
    x ^= x >> np.uint32(13)
    x = x * np.uint32(C2)
    x ^= x >> np.uint32(16)
    return x


def chain(*values: int) -> int:
    """Fold integers into one 32-bit key: chain(a, b) = fmix(fmix(start ^ a) ^ b). Each must be a
    uint32: a larger one (a seed of 2**32) would alias its low 32 bits' bytes."""
    key = CHAIN_START
    for v in values:
        if not 0 <= v <= M32:
            raise ValueError(f"synth key {v} is outside 0..{M32} (seeds, layers and steps are 32-bit)")
        key = fmix32_int(key ^ v)
    return key


def kv_base_key(seed: int, layer: int) -> int:
    return chain(KV_DOMAIN, seed, layer)


def kv_code_int(seed: int, layer: int, slot: int, gen: int, channel: int) -> int:
    """One KV code computed with Python ints only: an independent path for tests."""
    row = fmix32_int(fmix32_int(kv_base_key(seed, layer) ^ slot) ^ gen)
    h = fmix32_int(row ^ channel)
    table = main_codes() if h & OUTLIER_MASK else outlier_codes()
    return int(table[h >> 16])


@functools.lru_cache(maxsize=None)
def _normal_quantiles(sigma: float) -> np.ndarray:
    dist = NormalDist(0.0, sigma)
    return np.array([dist.inv_cdf((u + 0.5) / 65536.0) for u in range(65536)])


@functools.lru_cache(maxsize=None)
def _code_table(sigma: float) -> np.ndarray:
    values = torch.from_numpy(np.clip(_normal_quantiles(sigma), -E4M3_MAX, E4M3_MAX))
    return values.to(torch.float32).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def main_codes() -> np.ndarray:
    """uint8[65536]: e4m3 codes of the main (sigma 1) distribution."""
    return _code_table(MAIN_SIGMA)


def outlier_codes() -> np.ndarray:
    """uint8[65536]: e4m3 codes of the outlier (sigma 24) distribution."""
    return _code_table(OUTLIER_SIGMA)


@functools.lru_cache(maxsize=None)
def _query_table() -> torch.Tensor:
    return torch.from_numpy(_normal_quantiles(1.0)).to(torch.float32).to(torch.bfloat16)


CHUNK_ELEMENTS = 1 << 22  # values hashed at once: bounds the generators' temporaries (about 20 B a value) to ~80 MB


def _chunk(values_per_item: int) -> int:
    """Items (rows, requests) of `values_per_item` values each hashed at once."""
    return max(1, CHUNK_ELEMENTS // values_per_item)


def _codes_from_hash(h: np.ndarray) -> np.ndarray:
    u = h >> np.uint32(16)
    return np.where((h & np.uint32(OUTLIER_MASK)) == 0, outlier_codes()[u], main_codes()[u])


def kv_codes(seed: int, layer: int, slots, gens, row_width: int) -> torch.Tensor:
    """uint8 codes [len(slots), row_width] (CPU) of `slots` as written at generation `gens`."""
    slots = np.asarray(slots, dtype=np.int64).astype(np.uint32)
    gens = np.broadcast_to(np.asarray(gens, dtype=np.int64), slots.shape).astype(np.uint32)
    row = fmix32(fmix32(np.uint32(kv_base_key(seed, layer)) ^ slots) ^ gens)
    channels = np.arange(row_width, dtype=np.uint32)
    out = np.empty((len(row), row_width), dtype=np.uint8)
    for start in range(0, len(row), _chunk(row_width)):  # the hash's uint32 temporaries stay a chunk's size
        part = row[start : start + _chunk(row_width)]
        out[start : start + len(part)] = _codes_from_hash(fmix32(part[:, None] ^ channels[None, :]))
    return torch.from_numpy(out)


def queries(seed: int, step: int, layer: int, request_ids, num_heads: int, width: int) -> torch.Tensor:
    """BF16 queries [len(request_ids), num_heads, width] (CPU) for one (step, layer)."""
    rid = np.asarray(request_ids, dtype=np.int64).astype(np.uint32)
    base = np.uint32(chain(Q_DOMAIN, seed, step, layer))
    heads = np.arange(num_heads, dtype=np.uint32)
    head_key = fmix32(fmix32(base ^ rid)[:, None] ^ heads[None, :])
    channels = np.arange(width, dtype=np.uint32)
    out = torch.empty((len(rid), num_heads, width), dtype=torch.bfloat16)
    for start in range(0, len(rid), _chunk(num_heads * width)):  # temporaries (uint32, int64) stay a chunk's size
        h = fmix32(head_key[start : start + _chunk(num_heads * width), :, None] ^ channels[None, None, :])
        out[start : start + len(h)] = _query_table()[torch.from_numpy((h >> np.uint32(16)).astype(np.int64))]
    return out


def slot_order_keys(seed: int, slots: np.ndarray) -> np.ndarray:
    """Sort keys that scatter slots like a churned allocator's free list."""
    return fmix32(np.uint32(chain(SLOT_ORDER_DOMAIN, seed)) ^ slots.astype(np.uint32))
