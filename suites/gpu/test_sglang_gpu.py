"""The installed SGLang's decode path on the GPU: sglang_flashinfer (SGLang's FlashInferMLAAttnBackend with
the real FlashInfer wrapper, its Triton kv-indices kernel, its graph capture/replay metadata) equals stock
bit for bit; its pool is the harness's; the planted req_to_token fault turns it red; sglang_fa3 says why it
cannot run. Skipped with the reason where SGLang is not installed (ci/build_sglang_bundle.sh)."""

import pytest
import torch

from harness.errors import HarnessError
from harness.inputs.cases import load_case
from harness.inputs.pool import KVPool
from harness.spec.faults import Fault
from harness.strategies import REGISTRY
from suites.helpers import run_strategies

pytestmark = [pytest.mark.gpu]


@pytest.fixture(scope="module")
def sglang(gpu_device):
    from harness.integrations.sglang import runtime

    if reason := runtime.import_reason(runtime.MLA_BACKEND):
        pytest.skip(reason)
    return runtime


def _bitwise(results) -> None:
    assert set(results) == {"stock", "sglang_flashinfer"}, f"ran: {sorted(results)}"
    for name, (_, verdict) in results.items():
        assert verdict.passed, f"{name}: {verdict.reason}"
    stock, ours = results["stock"][0], results["sglang_flashinfer"][0]
    assert ours and stock.keys() == ours.keys()
    for key in stock:
        assert torch.equal(ours[key][0].view(torch.int16), stock[key][0].view(torch.int16)), key
        assert torch.equal(ours[key][1], stock[key][1]), key


@pytest.mark.parametrize("case_name", ["glm5-tp8.ci.multistep-reuse", "glm5-tp8.ci.ragged-mix", "deepseek-v3-tp8.ci.b1-l500"])
def test_sglang_flashinfer_is_stock_bit_for_bit(sglang, gpu_device, case_name):
    _bitwise(run_strategies(case_name, ("stock", "sglang_flashinfer"), device=gpu_device, backend="flashinfer"))


@pytest.mark.prod
def test_sglang_flashinfer_is_stock_bit_for_bit_at_prod_scale(sglang, gpu_device):
    _bitwise(run_strategies("glm5-tp8.prod.b32-l4096", ("stock", "sglang_flashinfer"), device=gpu_device, backend="flashinfer"))


def test_sglang_req_to_token_fault_turns_the_verdict_red(sglang, gpu_device):
    faulty = run_strategies("glm5-tp8.ci.b1-l500", ("sglang_flashinfer",), device=gpu_device, backend="flashinfer",
                            faults=frozenset([Fault.REQ_TO_TOKEN_OFF_BY_ONE]))
    verdict = faulty["sglang_flashinfer"][1]
    assert not verdict.passed and verdict.reason


@pytest.mark.parametrize("preset", ["glm5-tp8", "deepseek-v3-tp8"])
def test_sglang_pool_is_the_harness_pool_on_cuda(sglang, gpu_device, preset):
    from harness.integrations.sglang import wrappers

    case = load_case(f"{preset}.ci.b1-l500")
    pool = KVPool(case.geometry, case.scenario.seed, gpu_device)
    with sglang.single_rank():
        theirs = wrappers.wrap_pool(pool, case.preset)
    assert all(theirs.get_key_buffer(i).data_ptr() == b.data_ptr() for i, b in enumerate(pool.buffers))
    theirs.kv_buffer = [b.clone() for b in theirs.kv_buffer]  # the twin: a copy is refused
    with pytest.raises(HarnessError, match="not the harness's buffer"):
        wrappers.check_zero_copy(theirs, pool)


def test_sglang_fa3_names_sgl_kernel(sglang, gpu_device):
    from harness.backends import make_backend
    from harness.integrations.sglang import stand_in

    reason = REGISTRY["sglang_fa3"].unsupported_reason(gpu_device, make_backend("flashinfer", gpu_device))
    if stand_in.real_available():
        pytest.skip(f"the real sgl_kernel is installed here: {reason}")
    assert "sgl_kernel.flash_attn" in reason and "stand-in" in reason, reason
    import sgl_kernel

    with pytest.raises(stand_in.StandInCalled, match="sgl_kernel.merge_state_v2 was called"):
        sgl_kernel.merge_state_v2()
