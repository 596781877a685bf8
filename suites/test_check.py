"""The checker's statistics and verdicts on hand-made tensors."""

import math

import torch

from harness.check import Status, Tolerance, check_against_golden, check_bitwise, error_stats, policy

TOL = Tolerance(atol=1e-3, rtol=1e-2, max_norm_rel=5e-3, lse_atol=1e-4)


def _gold():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 8, 512, generator=g), torch.randn(2, 8, generator=g)


def test_exact_output_passes_with_zero_error():
    out, lse = _gold()
    v = check_against_golden(out.to(torch.bfloat16), lse, out, lse, TOL)
    assert v.status == Status.PASS and v.stats.matched_ratio == 1.0 and v.stats.norm_rel < 3e-3


def test_nan_and_inf_always_fail():
    out, lse = _gold()
    for bad in (float("nan"), float("inf")):
        o = out.clone()
        o[1, 3, 7] = bad
        v = check_against_golden(o, lse, out, lse, TOL)
        assert v.status == Status.FAIL and v.stats.nonfinite == 1 and math.isinf(v.stats.norm_rel)
        assert v.stats.worst_index == (1, 3, 7)


def test_single_element_error_is_located():
    out, lse = _gold()
    o = out.clone()
    o[0, 5, 100] += 0.5
    v = check_against_golden(o, lse, out, lse, TOL)
    assert v.status == Status.FAIL and v.stats.mismatches == 1 and v.stats.worst_index == (0, 5, 100)
    assert abs(v.stats.max_abs - 0.5) < 1e-6


def test_uniform_one_percent_scale_fails_on_norm():
    out, lse = _gold()
    v = check_against_golden(out * 1.01, lse, out, lse, Tolerance(atol=1.0, rtol=1.0, max_norm_rel=5e-3, lse_atol=1))
    assert v.status == Status.FAIL and "norm-relative" in v.reason


def test_lse_error_fails():
    out, lse = _gold()
    v = check_against_golden(out, lse + 1e-3, out, lse, TOL)
    assert v.status == Status.FAIL and "LSE" in v.reason


def test_bitwise_detects_one_ulp():
    out, lse = _gold()
    a = out.to(torch.bfloat16)
    b = a.clone()
    b.view(torch.int16)[0, 0, 0] += 1
    assert check_bitwise(a, lse, a.clone(), lse.clone(), "stock").passed
    v = check_bitwise(b, lse, a, lse, "stock")
    assert not v.passed and "1 of" in v.reason


def test_error_stats_matched_ratio():
    e = torch.ones(100)
    a = e.clone()
    a[:10] = 2
    s = error_stats(a, e, atol=0.0, rtol=0.0)
    assert s.mismatches == 10 and s.matched_ratio == 0.9


def test_policy_table_lookup():
    assert policy("native_fp8", "flashinfer-fa3").max_norm_rel >= policy("stock", "flashinfer-fa3").max_norm_rel
    assert policy("stock", "torch") == policy("default", "torch")


def test_combined_verdict_statistics_cover_every_check():
    from harness.check import combine

    out, lse = _gold()
    a = out.clone()
    a[0, 0, 0] += 0.5
    good = check_against_golden(out, lse, out, lse, TOL)
    bad = check_against_golden(a, lse, out, lse, TOL)
    merged = combine([good, bad, good])
    assert merged.status == Status.FAIL
    assert merged.stats.total == 3 * out.numel() and merged.stats.mismatches == 1
    assert abs(merged.stats.max_abs - 0.5) < 1e-6 and merged.stats.worst_index == (0, 0, 0)
    clean = combine([good, good])
    assert clean.passed and clean.stats.total == 2 * out.numel()
