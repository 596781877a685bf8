"""The routed-expert Triton GEMV on CPU under the Triton interpreter, against the dequantized product.

Like test_kernels_interpret.py, this file reruns itself in a TRITON_INTERPRET=1 child process.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from harness.tpot.fp8 import dequantize_blocks, quantize_blocks  # noqa: E402
from suites.helpers import INTERPRETED, run_under_interpreter  # noqa: E402

interpreted = pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child of test_under_interpreter")


@pytest.mark.skipif(INTERPRETED, reason="this is the TRITON_INTERPRET=1 child run")
def test_under_interpreter():
    proc = run_under_interpreter(__file__)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-5000:] + proc.stderr[-2000:]


def _problem():
    gen = torch.Generator().manual_seed(0)
    blocks = [quantize_blocks(torch.randn(256, 256, generator=gen) / 16) for _ in range(3)]
    w, s = torch.stack([q for q, _ in blocks]), torch.stack([sc for _, sc in blocks])
    s[:, 1, 0] *= 2  # distinct scales per block: a kernel reading the wrong block is visible
    x = torch.randn(2, 256, generator=gen).to(torch.bfloat16)
    return x, w, s, torch.tensor([2, 0, 1, 1])


def _close(out, x, w, s, ids, row_div):
    ref = torch.stack([x[p // row_div].float() @ dequantize_blocks(w[e], s[e]).t() for p, e in enumerate(ids.tolist())])
    return bool(((out.float() - ref).abs() <= ref.abs() / 128 + 1e-3).all())


@interpreted
def test_expert_gemv_matches_dequantized_product():
    from harness.tpot.moe_kernel import expert_gemv

    x, w, s, ids = _problem()
    assert _close(expert_gemv(x, 2, w, s, ids), x, w, s, ids, 2)


@interpreted
def test_expert_gemv_with_wrong_ids_is_caught():
    from harness.tpot.moe_kernel import expert_gemv

    x, w, s, ids = _problem()
    assert not _close(expert_gemv(x, 2, w, s, ids.flip(0)), x, w, s, ids, 2)
