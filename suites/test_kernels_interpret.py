"""The Triton kernels on CPU: run under the Triton interpreter and checked bit for bit
against harness.synth and torch, plus ahead-of-time compilation for sm_120.

The kernel modules are imported afresh for these tests (interpreted, or compiled
for the AOT test) and sys.modules is restored afterwards, so the result does not
depend on the order in which test files import harness.kernels.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

import harness  # noqa: E402
from harness import synth  # noqa: E402

PREFIX = "harness.kernels"
WIDTH = 576
ODD_WIDTH = 70  # head 64 + tail 6 (masked to 8), channel chunk 2
NAN_CODES = (0x7F, 0xFF)


@contextlib.contextmanager
def _fresh_kernels(interpret: bool):
    """Yield a fresh import of harness.kernels built with TRITON_INTERPRET=interpret;
    sys.modules, harness.kernels and the environment are restored afterwards."""
    saved = {k: m for k, m in sys.modules.items() if k == PREFIX or k.startswith(PREFIX + ".")}
    saved_env = os.environ.get("TRITON_INTERPRET")
    for k in saved:
        del sys.modules[k]
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    try:
        yield importlib.import_module
    finally:
        for k in [k for k in sys.modules if k == PREFIX or k.startswith(PREFIX + ".")]:
            del sys.modules[k]
        sys.modules.update(saved)
        if PREFIX in saved:
            harness.kernels = saved[PREFIX]
        elif hasattr(harness, "kernels"):
            del harness.kernels
        if saved_env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved_env


@pytest.fixture(scope="module")
def k():
    with _fresh_kernels(interpret=True) as imp:
        names = ("synth_fill", "cast", "gather_cast", "shadow_write")
        return SimpleNamespace(**{n: imp(f"{PREFIX}.{n}") for n in names})


def bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view of t's bits, for bitwise comparison."""
    return t.view({1: torch.uint8, 2: torch.int16}[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def ref_bf16(codes_u8: torch.Tensor) -> torch.Tensor:
    return codes_u8.view(torch.float8_e4m3fn).to(torch.bfloat16)


def poisoned(rows: int, width: int) -> torch.Tensor:
    """bf16 [rows, 1, width] of a NaN bit pattern no cast produces (0x7FA5)."""
    return torch.full((rows, 1, width), 0x7FA5, dtype=torch.int16).view(torch.bfloat16)


def filled_pool(k, rows: int, width: int, seed: int = 7, layer: int = 3) -> torch.Tensor:
    return k.synth_fill.fill_layer_(torch.full((rows, 1, width), 0xAB, dtype=torch.uint8), seed, layer)


@pytest.mark.parametrize("width", [WIDTH, ODD_WIDTH])
def test_fill_layer_matches_synth(k, width):
    rows = 101  # 100 slots: not a multiple of the 32-row block
    pool = filled_pool(k, rows, width)
    assert torch.equal(pool[0], torch.zeros_like(pool[0]))
    assert torch.equal(pool[1:, 0], synth.kv_codes(7, 3, np.arange(1, rows), 0, width))
    # negative control: the neighbouring layer's codes must not match
    assert not torch.equal(pool[1:, 0], synth.kv_codes(7, 4, np.arange(1, rows), 0, width))


def test_fill_layer_2d_buffer(k):
    pool = k.synth_fill.fill_layer_(torch.ones((40, WIDTH), dtype=torch.uint8), 1, 0)
    assert torch.equal(pool[1:], synth.kv_codes(1, 0, np.arange(1, 40), 0, WIDTH))
    assert int(pool[0].sum()) == 0


@pytest.mark.parametrize("width", [WIDTH, ODD_WIDTH])
def test_kv_codes_matches_synth(k, width):
    rng = np.random.default_rng(0)
    slots = np.concatenate([[0, 1, 2**31 - 1, 2**31, 2**32 - 1], rng.integers(0, 2**32, 60)])
    gens = rng.integers(0, 2**32, slots.size)
    got = k.synth_fill.kv_codes_cuda(11, 77, slots, gens, width, device="cpu")
    assert torch.equal(got, synth.kv_codes(11, 77, slots, gens, width))
    assert torch.equal(k.synth_fill.kv_codes_cuda(11, 77, slots, 5, width, device="cpu"),
                       synth.kv_codes(11, 77, slots, 5, width))
    # negative control: shifted slots must not match
    shifted = k.synth_fill.kv_codes_cuda(11, 77, slots + 1, gens, width, device="cpu")
    assert not torch.equal(shifted, synth.kv_codes(11, 77, slots, gens, width))


def test_kv_codes_scalar_path_agrees():
    """The vectorized reference itself agrees with the pure-int path (independent check)."""
    codes = synth.kv_codes(3, 2, [9], [4], 8)
    assert [synth.kv_code_int(3, 2, 9, 4, c) for c in range(8)] == codes[0].tolist()


def test_cast_all_codes(k):
    src = torch.arange(256, dtype=torch.uint8).repeat(17)[: 256 * 17 - 3]  # a partial last block
    out = k.cast.cast_pool_to_bf16(src, torch.empty(src.shape, dtype=torch.bfloat16))
    finite = ~torch.isin(src, torch.tensor(NAN_CODES, dtype=torch.uint8))
    # The interpreter turns the NaN codes into +-480 (hardware gives NaN): finite codes only here.
    assert same_bits(out[finite], ref_bf16(src)[finite])
    assert finite.sum() == src.numel() - 2 * 17 + 1
    # negative control: a shifted input must not match
    shifted = k.cast.cast_pool_to_bf16(src.roll(1), torch.empty(src.shape, dtype=torch.bfloat16))
    assert not same_bits(shifted[finite], ref_bf16(src)[finite])


def test_cast_pool_shape(k):
    pool = filled_pool(k, 9, WIDTH)
    out = k.cast.cast_pool_to_bf16(pool, torch.empty(pool.shape, dtype=torch.bfloat16))
    assert same_bits(out, ref_bf16(pool))


@pytest.mark.parametrize("width", [WIDTH, ODD_WIDTH])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_gather_cast(k, width, index_dtype):
    pool = filled_pool(k, 300, width)
    n, capacity = 37, 45
    idx = torch.from_numpy(np.random.default_rng(1).integers(0, 300, n)).to(index_dtype)
    idx[:3] = torch.tensor([0, 299, 299])
    out = k.gather_cast.gather_cast_(pool, idx, poisoned(capacity, width))
    assert same_bits(out[:n], ref_bf16(pool[idx.long()]))
    assert same_bits(out[n:], poisoned(capacity - n, width))
    # negative control: an off-by-one remap must not match
    assert not same_bits(out[:n], ref_bf16(pool[idx.long() + 1]))


def test_gather_cast_device_count(k):
    pool = filled_pool(k, 300, WIDTH)
    idx = torch.arange(5, 45, dtype=torch.int32)
    for count in (0, 13, 40, 99):
        out = k.gather_cast.gather_cast_(pool, idx, poisoned(48, WIDTH), torch.tensor([count], dtype=torch.int32))
        m = min(count, idx.numel())
        assert same_bits(out[:m], ref_bf16(pool[idx[:m].long()]))
        assert same_bits(out[m:], poisoned(48 - m, WIDTH))


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_write_fp8_and_bf16(k, slot_dtype):
    pool = filled_pool(k, 200, WIDTH)
    before = pool.clone()
    shadow = ref_bf16(pool)
    slots = torch.from_numpy(np.random.default_rng(2).permutation(np.arange(1, 200))[:13]).to(slot_dtype)
    codes = synth.kv_codes(7, 3, slots.numpy(), 1, WIDTH)
    expect = pool.clone()
    expect[slots.long(), 0] = codes
    k.shadow_write.write_fp8_and_bf16_(pool, shadow, slots, codes)
    assert torch.equal(pool, expect)
    assert same_bits(shadow, ref_bf16(expect))  # written rows fresh, all others untouched
    # negative controls: a dropped token in the pool and a stale shadow row are detected
    s = slots[5].item()
    dropped, stale = pool.clone(), shadow.clone()
    dropped[s], stale[s] = before[s], ref_bf16(before[s])
    assert not torch.equal(dropped, expect)
    assert not same_bits(stale, ref_bf16(expect))


def test_write_fp8(k):
    pool = filled_pool(k, 50, WIDTH)
    slots = torch.tensor([4, 49, 1], dtype=torch.int32)
    codes = synth.kv_codes(7, 3, [4, 49, 1], 2, WIDTH).view(3, 1, WIDTH)
    expect = pool.clone()
    for i, s in enumerate(slots.tolist()):
        expect[s] = codes[i]
    assert torch.equal(k.shadow_write.write_fp8_(pool, slots, codes), expect)


def test_aot_compile_sm120():
    """Every kernel compiles ahead of time for sm_120 (and sm_90) with no GPU present."""
    with _fresh_kernels(interpret=False) as imp:
        aot = imp(f"{PREFIX}.sm120_compile")
        for cap in (120, 90):
            assert aot.compile_all_for(cap) == [
                "fill_layer", "kv_codes", "cast", "gather_cast", "gather_cast_count", "write_fp8_and_bf16"]
