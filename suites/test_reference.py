"""The float64 oracle against an independent formulation: MLA as plain multi-head attention."""

import numpy as np
import torch

from harness.inputs.reference import StepInputs, mla_decode_f64


def _mha_oracle(q_nope, q_pe, rows, sm_scale):
    """Absorbed MLA == MQA with key [ckv | kpe] and value ckv; via torch SDPA in float64."""
    kv = rows.view(torch.float8_e4m3fn).double()
    q = torch.cat([q_nope.double(), q_pe.double()], dim=-1)[None]  # [1, H, 576]
    out = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None, :], kv[None, None].expand(1, q.shape[1], -1, -1), kv[None, None, :, :512].expand(1, q.shape[1], -1, -1), scale=sm_scale
    )
    return out[0, :, 0]


def test_reference_matches_sdpa_formulation():
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 0x7E, (n, 576), generator=g, dtype=torch.uint8) for n in (1, 3, 300)]
    q = torch.randn(3, 8, 576, generator=g).to(torch.bfloat16)
    inputs = StepInputs(np.arange(3), q[..., :512], q[..., 512:], rows)
    out, lse = mla_decode_f64(inputs, 512, 1 / 16)
    for i, r in enumerate(rows):
        expected = _mha_oracle(q[i, :, :512], q[i, :, 512:], r, 1 / 16)
        torch.testing.assert_close(out[i], expected, rtol=1e-12, atol=1e-12)
        logits = (q[i].double() @ r.view(torch.float8_e4m3fn).double().T) / 16
        torch.testing.assert_close(lse[i], torch.logsumexp(logits, -1), rtol=1e-12, atol=1e-12)


def test_reference_negative_control():
    """Swapping one KV row for another changes the oracle's output."""
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, 0x7E, (5, 576), generator=g, dtype=torch.uint8)
    q = torch.randn(1, 8, 576, generator=g).to(torch.bfloat16)
    a, _ = mla_decode_f64(StepInputs(np.arange(1), q[..., :512], q[..., 512:], [rows]), 512, 1 / 16)
    bad = rows.clone()
    bad[2] = rows[3]
    b, _ = mla_decode_f64(StepInputs(np.arange(1), q[..., :512], q[..., 512:], [bad]), 512, 1 / 16)
    assert not torch.allclose(a, b, rtol=1e-3, atol=1e-3)
