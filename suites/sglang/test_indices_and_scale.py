"""SGLang's own kv-indices kernel and its own softmax-scale computation agree with the harness."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import sgl
import torch

from harness.spec.presets import PRESETS
from harness.spec.scenario import builtin_names, load_scenario
from harness.spec.schedule import compile_schedule

pytestmark = pytest.mark.sglang

SLOTS = 16_384


def sglang_kv_indices(batch) -> np.ndarray:
    """create_flashinfer_kv_indices_triton over the req_to_token table of the batch's requests."""
    create_flashinfer_kv_indices_triton = sgl.kv_indices_kernel()
    lens = torch.as_tensor(batch.kv_indptr[1:] - batch.kv_indptr[:-1], dtype=torch.int32)
    width = int(lens.max())
    # SGLang's ReqToTokenPool row of request r: slot of each token position, in order; rows in a shuffled table
    rows = torch.randperm(batch.batch_size + 3, generator=torch.Generator().manual_seed(0))[: batch.batch_size]
    req_to_token = torch.zeros((batch.batch_size + 3, width + 5), dtype=torch.int32)
    for i in range(batch.batch_size):
        req_to_token[rows[i], : lens[i]] = torch.as_tensor(batch.kv_indices[batch.rows_of(i)])
    indptr = torch.zeros(batch.batch_size + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lens, 0)
    out = torch.full((int(indptr[-1]),), -1, dtype=torch.int32)
    create_flashinfer_kv_indices_triton[(batch.batch_size,)](
        req_to_token, rows, lens, indptr, None, out, req_to_token.stride(0))
    return out.numpy()


SCHEDULES = [pytest.param(name, preset, id=f"{preset}-{name}") for preset in PRESETS for name in builtin_names()
             if not (name == "explicit-slots" and PRESETS[preset].page_size == 1)]


@pytest.mark.parametrize("scenario, preset", SCHEDULES)
def test_kv_indices_kernel_matches_every_schedule(scenario, preset):
    sgl.require()
    page_size = PRESETS[preset].page_size
    slots = SLOTS if scenario == "explicit-slots" else 495_552  # the production pool (explicit slots are placed for ci's)
    for batch in compile_schedule(load_scenario(scenario), slots, page_size).steps:
        np.testing.assert_array_equal(sglang_kv_indices(batch), batch.kv_indices)


def test_kv_indices_comparison_catches_a_dropped_token():
    sgl.require()
    batch = compile_schedule(load_scenario("ragged-mix"), SLOTS, 64).steps[0]
    lens = batch.kv_indptr[1:] - batch.kv_indptr[:-1]
    keep = np.concatenate([np.arange(s, s + n - 1) for s, n in zip(batch.kv_indptr[:-1], lens) if n > 1] + [[]]).astype(int)
    dropped = replace(batch, kv_indices=batch.kv_indices[keep], kv_indptr=np.concatenate([[0], np.cumsum(np.maximum(lens - 1, 0))]).astype(np.int32))
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(sglang_kv_indices(dropped), batch.kv_indices)


def sglang_scaling(preset) -> float:
    from sglang.srt.configs.model_config import ModelConfig

    config = object.__new__(ModelConfig)
    config.qk_nope_head_dim, config.qk_rope_head_dim = preset.qk_nope_head_dim, preset.qk_rope_head_dim
    config._init_mla_scaling(sgl.rope_scaling(preset))
    return config.scaling


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_sm_scale_is_sglangs(name):
    sgl.require()
    preset = PRESETS[name]
    assert preset.sm_scale == pytest.approx(sglang_scaling(preset), rel=1e-14)


def test_deepseek_v3_scale_is_the_yarn_one():
    """The figures SGLang's own code gives: GLM-5 1/16, DeepSeek-V3 192**-0.5 * (0.1 ln 40 + 1)**2."""
    sgl.require()
    assert sglang_scaling(PRESETS["glm5-tp8"]) == pytest.approx(1 / 16, rel=1e-14)
    assert sglang_scaling(PRESETS["deepseek-v3-tp8"]) == pytest.approx(0.135234, abs=1e-6)


def test_sm_scale_check_catches_the_unscaled_formula():
    sgl.require()
    unscaled = replace(PRESETS["deepseek-v3-tp8"], yarn_factor=1.0)
    with pytest.raises(AssertionError):
        assert unscaled.sm_scale == pytest.approx(sglang_scaling(PRESETS["deepseek-v3-tp8"]), rel=1e-14)


def sglang_decode_slots(batch, page_size: int) -> np.ndarray:
    """SGLang's paged allocator (PagedTokenToKVPoolAllocator.alloc_decode) placing the step's new tokens, given each
    request's previous last slot and the fresh pages in the order the harness's free list gives them."""
    seq_lens = torch.as_tensor(batch.kv_indptr[1:] - batch.kv_indptr[:-1], dtype=torch.int64)
    last_loc = torch.tensor([int(batch.kv_indices[e - 2]) if n > 1 else -1 for e, n in zip(batch.kv_indptr[1:], seq_lens)])
    fresh = [int(s) // page_size for s, n in zip(batch.write_slots, seq_lens) if s % page_size == 0]
    return sgl.alloc_decode(seq_lens, last_loc, fresh, page_size).numpy()


PAGED = [name for name in builtin_names() if load_scenario(name).layout != "explicit"]


@pytest.mark.parametrize("scenario", PAGED)
def test_new_tokens_go_where_sglangs_paged_allocator_puts_them(scenario):
    sgl.require()
    for batch in compile_schedule(load_scenario(scenario), 495_552, 64).steps:
        np.testing.assert_array_equal(sglang_decode_slots(batch, 64), batch.write_slots)


def test_allocator_check_catches_token_scatter():
    """A page-1 schedule (every token on its own scattered slot) read as a 64-token-page pool."""
    sgl.require()
    batch = compile_schedule(load_scenario("multistep-reuse"), 16_384, 1).steps[1]
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(sglang_decode_slots(batch, 64), batch.write_slots)
