"""The harness pool is byte-identical to SGLang's own MLA/DSA pool written through set_mla_kv_buffer."""

from __future__ import annotations

import numpy as np
import pytest
import sgl
import torch

from harness.inputs.pool import KVPool, PoolGeometry
from harness.spec import synth
from harness.spec.presets import DSA_INDEX_K_BYTES

pytestmark = pytest.mark.sglang

SLOTS, LAYERS, SEED = 256, 2, 5


def sglang_pool_like_harness(page_size: int, dsa: bool):
    """SGLang's pool with every slot written with the harness's generation-0 content."""
    pool = sgl.mla_pool(SLOTS, page_size, LAYERS, dsa)
    slots = torch.arange(page_size, SLOTS + page_size)
    for layer in range(LAYERS):
        sgl.write_rows(pool, layer, slots, synth.kv_codes(SEED, layer, slots.numpy(), 0, 576))
    return pool


def harness_pool(page_size: int, dsa: bool) -> KVPool:
    geometry = PoolGeometry(SLOTS, LAYERS, 576, page_size=page_size, index_k_bytes=DSA_INDEX_K_BYTES if dsa else 0)
    return KVPool(geometry, SEED, torch.device("cpu"))


def assert_same_pool(sgl_pool, pool: KVPool) -> None:
    for layer in range(LAYERS):
        theirs, ours = sgl_pool.kv_buffer[layer], pool.buffers[layer]
        assert theirs.dtype == ours.dtype == torch.uint8
        assert theirs.shape == ours.shape, f"layer {layer}: SGLang {tuple(theirs.shape)} vs harness {tuple(ours.shape)}"
        assert torch.equal(theirs, ours), f"layer {layer}: {int((theirs != ours).any(-1).sum())} rows differ"
        assert torch.equal(sgl_pool.get_key_buffer(layer), pool.fp8(layer).view(torch.uint8).view(torch.float8_e4m3fn))
    if pool.index_k:
        for theirs, ours in zip(sgl_pool.index_k_with_scale_buffer, pool.index_k):
            assert theirs.shape == ours.shape and theirs.dtype == ours.dtype
            assert theirs.nbytes == pool.geometry.index_k_layer_bytes


CASES = [pytest.param(1, False, id="mla-page1-deepseek"), pytest.param(64, True, id="dsa-page64-glm5")]


@pytest.mark.parametrize("page_size, dsa", CASES)
def test_pool_bytes_match_sglang(page_size, dsa):
    sgl.require()
    assert_same_pool(sglang_pool_like_harness(page_size, dsa), harness_pool(page_size, dsa))


@pytest.mark.parametrize("page_size, dsa", CASES)
def test_decode_write_matches_set_mla_kv_buffer(page_size, dsa):
    """A decode step's new tokens written by the harness (KVPool.write) and by SGLang land identically."""
    sgl.require()
    theirs, ours = sglang_pool_like_harness(page_size, dsa), harness_pool(page_size, dsa)
    slots = torch.tensor([page_size, page_size + 7, SLOTS + page_size - 1])
    for layer in range(LAYERS):
        codes = synth.kv_codes(SEED, layer, slots.numpy(), 3, 576)
        sgl.write_rows(theirs, layer, slots, codes)
        ours.write(layer, slots, codes)
    assert_same_pool(theirs, ours)


def faulty_harness_pool(fault: str) -> KVPool:
    if fault == "page1":  # token-granular pool of the same row count: rows 1..63 hold slots instead of zeros
        return KVPool(PoolGeometry(SLOTS + 63, LAYERS, 576), SEED, torch.device("cpu"))
    pool = harness_pool(64, True)
    if fault == "wrong-row":
        pool.write(1, torch.tensor([100]), synth.kv_codes(SEED, 1, np.array([101]), 0, 576))
    if fault == "dummy-page":
        pool.buffers[0][5, 0, 0] = 1
    return pool


@pytest.mark.parametrize("fault", ["page1", "wrong-row", "dummy-page"])
def test_pool_comparison_catches_planted_faults(fault):
    sgl.require()
    with pytest.raises(AssertionError):
        assert_same_pool(sglang_pool_like_harness(64, True), faulty_harness_pool(fault))
