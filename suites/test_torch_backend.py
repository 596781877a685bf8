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
