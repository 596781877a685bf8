"""The torch backend's bits do not depend on the order of its sums: the bitwise tier compares strategies through it,
and BLAS splits a sum differently with the threads it gets (MKL takes fewer on a loaded machine)."""

from __future__ import annotations

import pytest
import torch

from harness.backends import torch_backend
from harness.backends.base import AttnProblem
from harness.strategies import REGISTRY
from suites.helpers import run_strategies

ROWS, HEADS = 4096, 8


def _attend(order: torch.Tensor, kv_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One request over the same 4096 rows, listed in `order` (attention does not depend on it)."""
    g = torch.Generator().manual_seed(1)
    kv = torch.randn(ROWS, 1, 576, generator=g).to(kv_dtype)
    q = torch.randn(1, HEADS, 576, generator=g).to(torch.bfloat16)
    problem = AttnProblem(torch.tensor([0, ROWS], dtype=torch.int32), order.to(torch.int32), HEADS, 576 ** -0.5, kv_dtype)
    backend = torch_backend.TorchBackend(torch.device("cpu"))
    scale = 0.5 if kv_dtype == torch.float8_e4m3fn else None
    return backend.run(backend.plan(problem), q[..., :512], q[..., 512:], kv[..., :512], kv[..., 512:], scale)


def _order_changes_bits() -> bool:
    shuffled = torch.randperm(ROWS, generator=torch.Generator().manual_seed(2))
    (out, lse), (out_p, lse_p) = _attend(torch.arange(ROWS), torch.float8_e4m3fn), _attend(shuffled, torch.float8_e4m3fn)
    return not (torch.equal(out, out_p) and torch.equal(lse, lse_p))


def test_bits_do_not_depend_on_the_order_of_the_sums():
    assert not _order_changes_bits()


def test_negative_control_fp32_sums_change_bits_with_their_order(monkeypatch):
    """The check above can fail: with the fp32 math the backend had, reordering the rows changes output bits."""
    monkeypatch.setattr(torch_backend, "MATH", torch.float32)
    assert _order_changes_bits()


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_outputs_are_bf16_and_lse_fp32(kv_dtype):
    out, lse = _attend(torch.arange(ROWS), kv_dtype)
    assert (out.dtype, tuple(out.shape), lse.dtype, tuple(lse.shape)) == (torch.bfloat16, (1, HEADS, 512), torch.float32, (1, HEADS))


def test_a_scale_on_bf16_kv_is_an_error(monkeypatch):
    """Only FP8 KV takes a scale, as on the FlashInfer backend: a stock planting kv_scale 2.0 (SGLang applies none)
    errors naming it; the backend dropped the scale and every CPU check passed."""
    monkeypatch.setattr(REGISTRY["stock"], "setup", lambda self, schedule: setattr(self, "kv_scale", 2.0))
    with pytest.raises(AssertionError, match=r"^stock did not run \(error: .*kv_scale: only FP8 KV takes a scale; the KV handed is torch\.bfloat16"):
        run_strategies("glm5-tp8.ci.b1-l500", ("stock",), require=True)


def test_both_backends_refuse_a_kv_scale_on_bf16_kv_in_the_declared_words():
    """The torch backend said "the KV handed is torch.bfloat16", FlashInfer's "this plan's KV is torch.bfloat16": one
    refusal worded twice. Both now raise harness.backends.base.refuse_kv_scale's (no GPU: FlashInfer refuses before
    it touches its wrapper)."""
    from harness.backends.flashinfer import FlashInferBackend, FlashInferPlan
    from harness.errors import HarnessError

    problem = AttnProblem(torch.tensor([0, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32), num_heads=1,
                          sm_scale=0.1, kv_dtype=torch.bfloat16)
    q_nope, q_pe = torch.zeros(1, 1, 512, dtype=torch.bfloat16), torch.zeros(1, 1, 64, dtype=torch.bfloat16)
    ckv, kpe = torch.zeros(2, 1, 512, dtype=torch.bfloat16), torch.zeros(2, 1, 64, dtype=torch.bfloat16)
    torch_ = torch_backend.TorchBackend(torch.device("cpu"))
    flashinfer = FlashInferBackend("cpu", "fa2")
    said = []
    for backend, plan in ((torch_, torch_.plan(problem)), (flashinfer, FlashInferPlan(None, problem))):
        with pytest.raises(HarnessError) as refused:
            backend.run(plan, q_nope, q_pe, ckv, kpe, kv_scale=2.0)
        said.append(str(refused.value))
    assert said[0] == said[1], said
    from harness.backends.base import refuse_kv_scale  # declared once (imported here: absent on the old code)

    with pytest.raises(HarnessError) as declared:
        refuse_kv_scale(2.0, torch.bfloat16)
    assert said == [str(declared.value)] * 2
    refuse_kv_scale(2.0, torch.float8_e4m3fn)  # FP8 KV takes one
    refuse_kv_scale(None, torch.bfloat16)  # and no scale is no error
