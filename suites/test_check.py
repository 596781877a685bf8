"""The checker's statistics and verdicts on hand-made tensors."""

import math

import msgspec
import pytest
import torch

from harness.verify.check import Status, Tolerance, check_against_golden, check_bitwise, error_stats, policy

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


def test_a_strategy_without_a_row_takes_its_backends_default():
    """A new strategy with no row of its own (BF16 on FlashInfer, bitwise equal to stock) is held to FlashInfer's row, as
    stock is, not to the CPU-calibrated default; on torch to that default; a strategy's own row still comes first."""
    from harness.verify.check import default_policy

    table = default_policy()
    for backend in ("flashinfer", "flashinfer-fa3", "flashinfer-fa2"):
        assert policy("new_bf16_path", backend) is table["default.flashinfer"] == policy("stock", backend), backend
    assert policy("new_bf16_path", "torch") is table["default"] == policy("stock", "torch")
    assert policy("fused_fp8", "flashinfer-fa3") is table["fused_fp8"] != table["default.flashinfer"]


def test_a_backends_default_row_comes_after_the_strategys_own(monkeypatch):
    """Lookup: the strategy's rows (backend, family, any), then the backend's default (exact name, family), then "default"."""
    from harness.verify import check

    keys = ["default", "default.flashinfer", "default.flashinfer-fa2", "stock", "gather_cast.flashinfer"]
    tol = {k: Tolerance(atol=i, rtol=0.0, max_norm_rel=0.0, lse_atol=0.0) for i, k in enumerate(keys)}
    monkeypatch.setattr(check, "default_policy", lambda: tol)
    assert policy("shadow", "flashinfer-fa2") is tol["default.flashinfer-fa2"]
    assert policy("shadow", "flashinfer-fa3") is tol["default.flashinfer"]
    assert policy("shadow", "torch") is tol["default"]
    assert policy("stock", "flashinfer-fa2") is tol["stock"] and policy("gather_cast", "flashinfer-fa2") is tol["gather_cast.flashinfer"]


def test_combined_verdict_statistics_cover_every_check():
    from harness.verify.check import combine

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


def _boundary(kv_dtype=torch.bfloat16, out_dtype=torch.bfloat16, lse_dtype=torch.float32):
    q = torch.zeros(2, 8, 512, dtype=torch.bfloat16)
    kv = torch.zeros(10, 1, 576).to(kv_dtype)
    return q, kv[..., :512], kv[..., 512:], torch.zeros(2, 8, 512, dtype=out_dtype), torch.zeros(2, 8, dtype=lse_dtype)


def test_dtype_contract_holds_for_the_right_dtypes():
    from harness.verify.check import check_contract

    for name in ("stock", "stock_vectorized", "gather_cast", "shadow"):
        check_contract(name, *_boundary())
    check_contract("native_fp8", *_boundary(kv_dtype=torch.float8_e4m3fn))


@pytest.mark.parametrize("strategy, boundary, fragment", [
    ("stock", dict(kv_dtype=torch.float16), "KV handed"),  # a float16 pool cast: not what SGLang hands FlashInfer
    ("native_fp8", dict(kv_dtype=torch.bfloat16), "KV handed"),
    ("gather_cast", dict(out_dtype=torch.float16), "output"),  # attention output rounded to float16
    ("shadow", dict(lse_dtype=torch.bfloat16), "LSE"),
])
def test_dtype_contract_violations_are_caught(strategy, boundary, fragment):  # negative controls
    from harness.verify.check import ContractViolation, check_contract

    with pytest.raises(ContractViolation, match=fragment):
        check_contract(strategy, *_boundary(**boundary))


def test_nothing_checked_is_a_failure():
    from harness.verify.check import combine

    assert combine([]).status == Status.FAIL
    empty = check_against_golden(torch.zeros(0, 8, 512), torch.zeros(0, 8), torch.zeros(0, 8, 512), torch.zeros(0, 8), TOL)
    assert empty.passed and combine([empty]).status == Status.FAIL and "nothing was checked" in combine([empty]).reason


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("[tolerance.default]", "[tolerance.stock]", 1), "tolerance.default"),
    (lambda t: t.replace("lse_atol", "lse_atl", 1), "needs exactly the numbers"),
    (lambda t: t.replace("atol = ", 'atol = "0.5" #', 1), "needs exactly the numbers"),
    (lambda t: t.replace('"default.flashinfer"', '"defualt.flashinfer"', 1), "unknown strategy 'defualt'"),  # a backend's default, misspelt
    (lambda t: t.replace('"default.flashinfer"', '"default.flashinfr"', 1), "unknown backend 'flashinfr'"),
])
def test_a_malformed_tolerance_table_is_refused(tmp_path, edit, message):
    from harness.errors import HarnessError
    from harness.verify.check import POLICY_FILE, load_policy

    bad = tmp_path / "tolerances.toml"
    bad.write_text(edit(POLICY_FILE.read_text()))
    with pytest.raises(HarnessError, match=message):
        load_policy(bad)


def test_an_output_of_the_wrong_shape_fails_as_a_shape_even_with_a_right_lse():
    out, lse = _gold()
    v = check_against_golden(out[:1], lse, out, lse, TOL)  # one request short: it would broadcast
    assert v.status == Status.FAIL and "shape" in v.reason


def test_an_lse_of_the_wrong_shape_fails_as_a_shape_even_where_it_would_broadcast_to_equal_values():
    out, lse = _gold()
    gold_lse = lse[:, :1].expand(-1, 8).contiguous()  # every head's LSE equal to the one column the run returns
    v = check_against_golden(out, lse[:, :1], out, gold_lse, TOL)
    assert v.status == Status.FAIL and "shape" in v.reason
    assert check_against_golden(out, gold_lse, out, gold_lse, TOL).passed  # its twin: the whole LSE


def test_merged_statistics_keep_the_worst_relative_and_norm_errors():
    from harness.results.schema import ErrorStats
    from harness.verify.check import merge_stats

    a = ErrorStats(max_abs=1.0, max_rel=0.1, norm_rel=0.01, mismatches=0, total=10, matched_ratio=1.0, worst_index=(0,), nonfinite=0)
    b = ErrorStats(max_abs=0.5, max_rel=0.3, norm_rel=0.02, mismatches=1, total=10, matched_ratio=0.9, worst_index=(1,), nonfinite=0)
    m = merge_stats([a, b])
    assert (m.max_abs, m.max_rel, m.norm_rel) == (1.0, 0.3, 0.02)
    assert m.nonfinite == 0
    nan_a, nan_b = msgspec.structs.replace(a, nonfinite=1), msgspec.structs.replace(b, nonfinite=2)
    assert merge_stats([nan_a, nan_b]).nonfinite == 3  # every tensor's non-finite outputs counted, not the worst one's


def test_rounding_toward_zero_fails_on_bias_where_every_other_check_passes():
    """fp32 -> bf16 by truncation (the Triton interpreter's own cast) errs by under one bf16 ulp, inside atol + rtol and
    max_norm_rel, but always toward zero: the signed bias sees it; round-to-nearest passes."""
    import torch

    from harness.verify.check import signed_bias

    out, lse = _gold()
    tol = policy("stock", "torch")
    truncated = (out.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
    assert torch.equal(truncated.float(), (out.view(torch.int32) & -65536).view(torch.float32))
    v = check_against_golden(truncated, lse, out, lse, tol)
    assert v.stats.mismatches == 0 and v.stats.norm_rel <= tol.max_norm_rel  # the other checks pass it
    assert v.status == Status.FAIL and "biased" in v.reason and signed_bias(truncated, out) < -tol.max_bias
    assert check_against_golden(out.to(torch.bfloat16), lse, out, lse, tol).passed
    assert abs(signed_bias(out.to(torch.bfloat16), out)) < tol.max_bias / 5


def test_every_policy_row_bounds_the_bias():
    from harness.verify.check import default_policy

    assert all(t.max_bias <= 1e-3 for t in default_policy().values())


# --- each check at its own boundary (a hand mutation audit: a 10x looser tolerance, a NaN or one-request LSE, the
# bitwise tier's LSE bits and the agreement check all went unnoticed by every test) ---------------------------------

WIDE = Tolerance(atol=1.0, rtol=1.0, max_norm_rel=1.0, lse_atol=1.0)  # every other check passes what one test plants


@pytest.mark.parametrize("scale, status", [(2.0, Status.FAIL), (0.5, Status.PASS)])
@pytest.mark.parametrize("gold_value", [4.0, 0.0])  # rtol's share and atol's alone
def test_one_element_just_outside_its_tolerance_fails_and_just_inside_passes(scale, status, gold_value):
    out, lse = _gold()
    out[1, 2, 3] = gold_value
    o = out.clone()
    o[1, 2, 3] += scale * (TOL.atol + TOL.rtol * abs(gold_value))
    v = check_against_golden(o, lse, out, lse, Tolerance(TOL.atol, TOL.rtol, max_norm_rel=1.0, lse_atol=TOL.lse_atol))
    assert v.status == status and v.stats.mismatches == (status == Status.FAIL), v.reason


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_lse_fails_with_exact_outputs(bad):
    out, lse = _gold()
    bent = lse.clone()
    bent[1, 3] = bad
    v = check_against_golden(out, bent, out, lse, WIDE)
    assert v.status == Status.FAIL and "LSE" in v.reason
    assert check_against_golden(out, lse.clone(), out, lse, WIDE).passed  # twin


@pytest.mark.parametrize("scale, status", [(2.0, Status.FAIL), (0.5, Status.PASS)])
def test_one_requests_lse_beyond_its_tolerance_fails(scale, status):
    out, lse = _gold()
    bent = lse.clone()
    bent[-1, -1] += scale * TOL.lse_atol
    assert check_against_golden(out, bent, out, lse, Tolerance(1.0, 1.0, 1.0, TOL.lse_atol)).status == status


def test_growth_fails_on_bias_as_shrinking_does():
    out, lse = _gold()
    tol = policy("stock", "torch")
    v = check_against_golden(out * (1 + 3 * tol.max_bias), lse, out, lse, Tolerance(1.0, 1.0, 1.0, tol.lse_atol, tol.max_bias))
    assert v.status == Status.FAIL and "biased +" in v.reason


def test_bitwise_sees_one_ulp_of_the_lse():
    out, lse = _gold()
    a, bent = out.to(torch.bfloat16), lse.clone()
    bent.view(torch.int32)[1, 7] += 1
    assert not check_bitwise(a, bent, a.clone(), lse, "stock").passed
    assert check_bitwise(a, lse.clone(), a.clone(), lse, "stock").passed  # twin


def test_agreement_tolerance_is_the_triangle_inequalitys():
    from harness.verify.check import agreement_tolerance

    a, r = Tolerance(1e-3, 1e-2, 5e-3, 1e-4), Tolerance(2e-3, 2e-2, 4e-3, 3e-4)
    t = agreement_tolerance(a, r)
    assert math.isclose(t.atol, 3e-3 + 3e-2 * 2e-3 / 0.98) and math.isclose(t.rtol, 3e-2 / 0.98)
    assert math.isclose(t.max_norm_rel, 9e-3 / 0.996) and math.isclose(t.lse_atol, 4e-4)


@pytest.mark.parametrize("scale, status", [(2.0, Status.FAIL), (0.5, Status.PASS)])
def test_agreement_fails_beyond_each_of_its_bounds_and_passes_within(scale, status):
    """One element, a uniform scale (norm) and one request's LSE, each at twice or half its bound of the reference."""
    from harness.verify.check import check_agreement

    ref, lse = _gold()
    ref[0, 1, 2] = 0.0
    tol = Tolerance(1e-3, 1e-2, 5e-3, 1e-4)
    one = ref.clone()
    one[0, 1, 2] += scale * tol.atol
    scaled = ref * (1 + scale * tol.max_norm_rel)
    bent = lse.clone()
    bent[1, 4] += scale * tol.lse_atol
    for out, l_, t, words in ((one, lse, Tolerance(tol.atol, 0.0, 1.0, 1.0), "elements outside"),
                              (scaled, lse, Tolerance(1.0, 1.0, tol.max_norm_rel, 1.0), "norm-relative"),
                              (ref, bent, Tolerance(1.0, 1.0, 1.0, tol.lse_atol), "(request 1)")):
        v = check_agreement(out, l_, ref, lse, t, "stock")
        assert v.status == status and (status == Status.PASS or words in v.reason), (words, v.reason)
