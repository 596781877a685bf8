"""The DSA index-K page count as SGLang sizes it: the harness's PoolGeometry.index_k_pages against
the buffer SGLang's own DSATokenToKVPool allocates, at slot counts where the plausible formulas
((slots + page + 1) // page, (slots + page) // page, slots // page + 1) disagree."""

from __future__ import annotations

import pytest
import sgl
import torch

from harness.inputs.pool import PoolGeometry
from harness.spec.presets import DSA_INDEX_K_BYTES, get_preset

pytestmark = pytest.mark.sglang

PAGE = get_preset("glm5-tp8").page_size
SLOTS = [PAGE * 4 - 1, PAGE * 4, PAGE * 4 + 1, PAGE * 5 - 2, 1000, 16_384]


@pytest.mark.parametrize("slots", SLOTS)
def test_index_k_pages_match_sglang(slots):
    sgl.require()
    pool = sgl.mla_pool(slots, PAGE, 1, dsa=True)
    theirs = pool.index_k_with_scale_buffer[0]
    ours = PoolGeometry(slots, 1, 576, page_size=PAGE, index_k_bytes=DSA_INDEX_K_BYTES)
    assert theirs.dtype == torch.uint8
    assert tuple(theirs.shape) == (ours.index_k_pages, PAGE * DSA_INDEX_K_BYTES), (slots, tuple(theirs.shape), ours.index_k_pages)
    assert theirs.nbytes == ours.index_k_layer_bytes


def test_the_slot_counts_tell_the_formulas_apart():
    """Negative control of the choice of SLOTS: each wrong formula misses at least one of them."""
    right = [(s + PAGE + 1) // PAGE for s in SLOTS]
    for wrong in (lambda s: (s + PAGE) // PAGE, lambda s: s // PAGE + 1, lambda s: -(-s // PAGE) + 1):
        assert [wrong(s) for s in SLOTS] != right
