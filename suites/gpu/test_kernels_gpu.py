"""The Triton kernels on a CUDA GPU, bit for bit against harness.spec.synth (CPU) and torch."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from harness.spec import synth

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                       reason="TRITON_INTERPRET=1: these tests need compiled kernels"),
]

WIDTH = 576
PROD_ROWS = 495_552 + 1  # production slots + dummy row 0
SEED, LAYER = 2024, 5
NAN_CODES = (0x7F, 0xFF)


@pytest.fixture(scope="module")
def k():
    pytest.importorskip("triton", reason="triton is not installed")
    from harness.kernels import cast, gather_cast, shadow_write, synth_fill

    return cast, gather_cast, shadow_write, synth_fill


@pytest.fixture(scope="module")
def prod_pool(k):
    """One production-size layer pool, hash-filled on the GPU."""
    *_, synth_fill = k
    pool = torch.empty((PROD_ROWS, 1, WIDTH), dtype=torch.uint8, device="cuda")
    return synth_fill.fill_layer_(pool, SEED, LAYER)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16}[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bits(a).cpu(), bits(b).cpu())


def ref_bf16(codes_u8: torch.Tensor) -> torch.Tensor:
    return codes_u8.view(torch.float8_e4m3fn).to(torch.bfloat16)


def poisoned(rows: int) -> torch.Tensor:
    """bf16 [rows, 1, WIDTH] of a NaN bit pattern no cast produces (0x7FA5)."""
    return torch.full((rows, 1, WIDTH), 0x7FA5, dtype=torch.int16, device="cuda").view(torch.bfloat16)


def sample_rows(rows: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.unique(np.concatenate([[1, 2, rows - 1], rng.integers(1, rows, n)]))


def test_fill_layer_production_pool(k, prod_pool):
    *_, synth_fill = k
    assert int(prod_pool[0].sum()) == 0
    rows = sample_rows(PROD_ROWS, 4096)
    got = prod_pool[torch.from_numpy(rows).cuda(), 0].cpu()
    assert torch.equal(got, synth.kv_codes(SEED, LAYER, rows, 0, WIDTH))
    # negative control: the next layer's codes must not match
    assert not torch.equal(got, synth.kv_codes(SEED, LAYER + 1, rows, 0, WIDTH))
    # kv_codes_cuda agrees with the fill on generation 0
    assert torch.equal(synth_fill.kv_codes_cuda(SEED, LAYER, rows, 0, WIDTH).cpu(), got)


@pytest.mark.parametrize("width", [WIDTH, 70])
def test_kv_codes_cuda_matches_synth(k, width):
    *_, synth_fill = k
    rng = np.random.default_rng(1)
    slots = np.concatenate([[0, 2**31 - 1, 2**31, 2**32 - 1], rng.integers(0, 2**32, 20_000)])
    gens = rng.integers(0, 2**32, slots.size)
    got = synth_fill.kv_codes_cuda(3, 60, slots, gens, width)
    assert got.is_cuda and torch.equal(got.cpu(), synth.kv_codes(3, 60, slots, gens, width))
    shifted = synth_fill.kv_codes_cuda(3, 60, slots + 1, gens, width)
    assert not torch.equal(shifted.cpu(), synth.kv_codes(3, 60, slots, gens, width))


def test_cast_all_codes(k):
    cast, *_ = k
    src = torch.arange(256, dtype=torch.uint8, device="cuda").repeat(41)[:-5]  # partial last block
    out = cast.cast_pool_to_bf16(src, torch.empty(src.shape, dtype=torch.bfloat16, device="cuda"))
    ref = ref_bf16(src)
    nan = torch.isin(src, torch.tensor(NAN_CODES, dtype=torch.uint8, device="cuda"))
    # Finite codes bit for bit; NaN codes must give NaN (their payload is not compared: torch on
    # CPU gives 0x7FC0, the GPU's cvt a canonical NaN).
    assert same_bits(out[~nan], ref[~nan])
    assert bool(out[nan].isnan().all()) and int(nan.sum()) == 2 * 41 - 1
    shifted = cast.cast_pool_to_bf16(src.roll(1), torch.empty_like(out))
    assert not same_bits(shifted[~nan], ref[~nan])


def test_cast_production_pool(k, prod_pool):
    cast, *_ = k
    out = cast.cast_pool_to_bf16(prod_pool, torch.empty(prod_pool.shape, dtype=torch.bfloat16, device="cuda"))
    assert torch.equal(bits(out), bits(ref_bf16(prod_pool)))


@pytest.mark.parametrize("n", [4096, 131_072])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_gather_cast(k, prod_pool, n, index_dtype):
    _, gather_cast, *_ = k
    g = torch.Generator(device="cuda").manual_seed(n)
    idx = torch.randint(0, PROD_ROWS, (n,), generator=g, device="cuda", dtype=index_dtype)
    out = gather_cast.gather_cast_(prod_pool, idx, poisoned(n + 100))
    assert torch.equal(bits(out[:n]), bits(ref_bf16(prod_pool[idx])))
    assert torch.equal(bits(out[n:]), bits(poisoned(100)))
    # negative control: an off-by-one remap must not match
    assert not torch.equal(bits(out[:n]), bits(ref_bf16(prod_pool[(idx + 1) % PROD_ROWS])))


def test_gather_cast_device_count_in_cuda_graph(k, prod_pool):
    _, gather_cast, *_ = k
    capacity = 4096
    idx = torch.randint(1, PROD_ROWS, (capacity,), device="cuda", dtype=torch.int32)
    count = torch.tensor([capacity], dtype=torch.int32, device="cuda")
    out = poisoned(capacity)
    gather_cast.gather_cast_(prod_pool, idx, out, count)  # compile outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gather_cast.gather_cast_(prod_pool, idx, out, count)
    for m in (capacity, 1000, 0):
        idx.copy_(torch.randint(1, PROD_ROWS, (capacity,), device="cuda", dtype=torch.int32))
        count.fill_(m)
        out.copy_(poisoned(capacity))
        graph.replay()
        assert torch.equal(bits(out[:m]), bits(ref_bf16(prod_pool[idx[:m]])))
        assert torch.equal(bits(out[m:]), bits(poisoned(capacity - m)))


def test_write_fp8_and_bf16(k):
    cast, _, shadow_write, synth_fill = k
    rows = 10_001
    pool = synth_fill.fill_layer_(torch.empty((rows, 1, WIDTH), dtype=torch.uint8, device="cuda"), SEED, 0)
    shadow = cast.cast_pool_to_bf16(pool, torch.empty((rows, 1, WIDTH), dtype=torch.bfloat16, device="cuda"))
    rng = np.random.default_rng(2)
    for gen, n, dtype in ((1, 333, torch.int64), (2, 77, torch.int32)):  # gen 2 reuses some gen-1 slots
        slots_np = rng.permutation(np.arange(1, 2000))[:n]
        slots = torch.from_numpy(slots_np).to("cuda", dtype)
        codes = synth_fill.kv_codes_cuda(SEED, 0, slots_np, gen, WIDTH)
        expect = pool.clone()
        expect.view(rows, WIDTH).index_copy_(0, slots.long(), codes)
        shadow_write.write_fp8_and_bf16_(pool, shadow, slots, codes)
        assert torch.equal(pool, expect)
        assert torch.equal(pool[slots.long(), 0].cpu(), synth.kv_codes(SEED, 0, slots_np, gen, WIDTH))
        assert torch.equal(bits(shadow), bits(ref_bf16(pool)))  # fresh rows, all others untouched
    # negative control: a shadow that missed the last write is detected
    stale = shadow.clone()
    stale[slots.long()] = ref_bf16(synth_fill.kv_codes_cuda(SEED, 0, slots_np, 0, WIDTH)).view(-1, 1, WIDTH)
    assert not torch.equal(bits(stale), bits(ref_bf16(pool)))
