"""sglang_flashinfer's per-step KV writes are SGLang's: its forward_decode (save_kv_cache) stores each layer's new
tokens through the installed pool's set_mla_kv_buffer, handed BF16 K (wrappers.codes_as_bf16) that stores
exactly the harness's codes, NaN codes included. A patched write that corrupts one byte turns the verdict red;
the stock write passes, bit-identical to stock."""

from __future__ import annotations

import pytest
import sgl
import torch

from harness.inputs.cases import load_case
from harness.integrations.sglang.wrappers import codes_as_bf16
from harness.spec.faults import Fault

pytestmark = pytest.mark.sglang

STRATEGY = "sglang_flashinfer"
ALL_CODES = torch.arange(256, dtype=torch.uint8).view(-1, 1).expand(256, 576).contiguous()  # row i: code i everywhere


def stored(as_bf16, dsa: bool) -> torch.Tensor:
    """The bytes SGLang's own set_mla_kv_buffer stores for ALL_CODES handed over as `as_bf16(codes)`."""
    page = 64 if dsa else 1
    pool, slots = sgl.mla_pool(512, page, 1, dsa), torch.arange(page, page + 256)
    k = as_bf16(ALL_CODES).view(-1, 1, 576)
    with sgl.single_rank():
        pool.set_mla_kv_buffer(sgl.layer(0), slots, k[..., :512], k[..., 512:])
    return pool.kv_buffer[0][slots, 0]


@pytest.mark.parametrize("dsa", [False, True], ids=["mla", "dsa"])
def test_every_code_is_stored_as_the_harness_writes_it(dsa):
    sgl.require()
    assert torch.equal(stored(codes_as_bf16, dsa), ALL_CODES)


def test_plain_bf16_cast_would_store_another_nan():
    """Twin: torch's e4m3->BF16 cast drops a NaN's sign, so SGLang would store the code 0xFF as 0x7F."""
    sgl.require()
    theirs = stored(lambda c: c.view(torch.float8_e4m3fn).to(torch.bfloat16), dsa=False)
    differ = (theirs != ALL_CODES).any(-1).nonzero().flatten().tolist()
    assert differ == [0xFF] and int(theirs[0xFF, 0]) == 0x7F


@pytest.fixture
def writes(monkeypatch):
    """set_mla_kv_buffer of the installed MLA pool class (DSATokenToKVPool inherits it) wrapped: the calls are
    counted, and with `corrupt` set one byte of the first new row is flipped after SGLang's own write."""
    from harness.integrations.sglang import runtime

    sgl.require()
    pool_class = runtime.load(runtime.MEMORY_POOL).MLATokenToKVPool
    write, log = pool_class.set_mla_kv_buffer, {"calls": 0, "corrupt": False}

    def patched(self, layer, loc_info, cache_k_nope, cache_k_rope, *args, **kwargs):
        write(self, layer, loc_info, cache_k_nope, cache_k_rope, *args, **kwargs)
        log["calls"] += 1
        if log["corrupt"]:
            self.kv_buffer[layer.layer_id - self.start_layer][loc_info.loc[0], 0, 0] ^= 0x01

    monkeypatch.setattr(pool_class, "set_mla_kv_buffer", patched)
    return log


@pytest.mark.parametrize("case_name", ["glm5-tp8.ci.multistep-reuse", "deepseek-v3-tp8.ci.b1-l500"])
def test_the_writes_are_sglangs_and_bitwise_stock(writes, case_name):
    results = sgl.run_strategies(case_name, ("stock", STRATEGY))
    verdict = results[STRATEGY][1]
    assert verdict.passed, verdict.reason
    case = load_case(case_name)
    assert writes["calls"] == len(case.schedule().steps) * case.geometry.num_layers, "not every layer's write was SGLang's"
    stock, ours = results["stock"][0], results[STRATEGY][0]
    assert stock.keys() == ours.keys() and ours
    for key in stock:
        assert torch.equal(ours[key][0].view(torch.int16), stock[key][0].view(torch.int16)), key
        assert torch.equal(ours[key][1], stock[key][1]), key


@pytest.mark.parametrize("case_name", ["glm5-tp8.ci.multistep-reuse", "deepseek-v3-tp8.ci.b1-l500"])
def test_a_write_that_corrupts_one_byte_fails(writes, case_name):
    """Twin: the same run with SGLang's write patched to flip one bit of one byte per layer's call."""
    writes["corrupt"] = True
    verdict = sgl.run_strategies(case_name, (STRATEGY,))[STRATEGY][1]
    assert not verdict.passed and writes["calls"], verdict.reason


def test_a_planted_nan_code_is_stored_and_reaches_the_output():
    """nan-in-pool's 0x7F, written by SGLang's set_mla_kv_buffer, must be read back as NaN (not a finite error)."""
    sgl.require()
    verdict = sgl.run_strategies("glm5-tp8.ci.b1-l500", (STRATEGY,), faults=frozenset([Fault.NAN_IN_POOL]))[STRATEGY][1]
    assert not verdict.passed and verdict.stats.nonfinite > 0, verdict.reason
