"""Mutation smoke test: realistic faults planted in a copy of the source tree must make the
targeted suites fail. A check that silently stops failing is noticed here.

Each mutation replaces one exact source line (the test fails if the line is gone, so a
refactor must update it) and runs the tests that should catch it (suites/mutation.py).
"""

from __future__ import annotations

import pytest

from suites.mutation import assert_caught

NAN_TEST = "suites/test_negative_controls.py::test_nan_code_propagates_to_the_output"
ALL_PASS = "suites/test_strategies_cpu.py::test_all_strategies_pass_golden[glm5-tp8.ci.b1-l500]"

# (id, file, exact original text, mutated text, tests that must fail)
MUTATIONS = [
    ("output-rounded-to-float16", "harness/backends/torch_backend.py",
     "outs.append((torch.exp(logits - lse[:, None]) @ c).to(torch.bfloat16))",
     "outs.append((torch.exp(logits - lse[:, None]) @ c).to(torch.float16))", [ALL_PASS]),
    ("stock-casts-pool-to-float16", "harness/strategies/stock.py",
     "return pool_u8.view(torch.float8_e4m3fn).to(torch.bfloat16)",
     "return pool_u8.view(torch.float8_e4m3fn).to(torch.float16)", [ALL_PASS]),
    ("nan-code-decoded-as-480", "harness/backends/torch_backend.py",
     "c = ckv2.index_select(0, idx).to(MATH)",
     "c = ckv2.index_select(0, idx).to(MATH).nan_to_num(480.0)", [NAN_TEST]),
    ("manifest-hash-not-checked", "harness/verify/golden.py",
     'if manifest_digest(manifest) != manifest.get("manifest_sha256"):', "if False:",
     ["suites/test_golden.py::test_manifest_fields_are_hashed_and_typed"]),
    ("element-tolerance-ignored", "harness/verify/check.py",
     "bad = ~(diff <= atol + rtol * e.abs())", "bad = diff != diff",
     ["suites/test_check.py"]),
    ("unfirable-fault-accepted", "harness/verify/negative_controls.py",
     "if targets and not any(t in strategies for t in targets):", "if False:",
     ["suites/test_cli.py::test_unfirable_faults_exit_2"]),
    ("session-skips-dtype-contract", "harness/execute/decode.py",
     "check_boundary(strategy.name, strategy.kv_dtype, q_nope, *kv, out, lse)", "pass",
     ["suites/test_extending.py::test_toy_strategy_gets_the_session_dtype_contract"]),
    # audit: realistic output bugs that passed every check before max_bias and the tighter torch lse_atol
    ("output-truncated-to-bf16", "harness/backends/torch_backend.py",
     "outs.append((torch.exp(logits - lse[:, None]) @ c).to(torch.bfloat16))",
     "outs.append(((torch.exp(logits - lse[:, None]) @ c).float().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16))",
     [ALL_PASS]),
    ("bias-check-skipped", "harness/verify/check.py",
     "if abs(bias := signed_bias(out, gold_out)) > tol.max_bias:", "if False:",
     ["suites/test_check.py::test_rounding_toward_zero_fails_on_bias_where_every_other_check_passes"]),
    ("lse-tolerance-widened-to-1e-4", "harness/verify/tolerances.toml", "lse_atol = 5e-5", "lse_atol = 1e-4",
     ["suites/test_negative_controls.py::test_lse_tolerance_sees_a_dropped_token_at_4096"]),
    ("fused-fp8-scale-fault-unclaimed", "harness/strategies/fused_fp8.py",
     "faults=(Fault.SCALE_ERROR, Fault.LAST_REQUEST_MISREAD))", "faults=(Fault.LAST_REQUEST_MISREAD,))",
     ["suites/test_negative_controls.py::test_a_fault_claimed_by_two_strategies_reaches_each_and_no_other"]),
    # every request against stock: the golden stores 8 (wide-ragged's last request is in none)
    ("tolerance-tier-unanchored", "harness/api.py", "check_agreement(out, lse, *baseline[(step, layer)], agree, BASELINE)",
     "Verdict(Status.PASS)", ["suites/test_negative_controls.py::test_fault_fails_the_checker"]),
    ("baseline-only-for-the-bitwise-tier", "harness/api.py", "    if BASELINE not in wanted:",
     '    if BASELINE not in wanted and any(REGISTRY[n].tier == "bitwise" for n in wanted):',
     ["suites/test_negative_controls.py::test_fault_fails_the_checker"]),
    # the mutation audit's survivors, now each held by a test
    ("lse-shape-not-checked", "harness/verify/check.py",
     "if out.shape != gold_out.shape or lse.shape != gold_lse.shape:", "if out.shape != gold_out.shape:",
     ["suites/test_check.py::test_an_lse_of_the_wrong_shape_fails_as_a_shape_even_where_it_would_broadcast_to_equal_values"]),
    ("merged-nonfinite-of-the-worst-only", "harness/verify/check.py",
     "nonfinite=sum(s.nonfinite for s in all_stats),", "nonfinite=worst.nonfinite,",
     ["suites/test_check.py::test_merged_statistics_keep_the_worst_relative_and_norm_errors"]),
    ("nan-in-pool-on-an-unchecked-request-accepted", "harness/verify/negative_controls.py",
     "if first not in case.checked_request_ids():", "if False:",
     ["suites/test_negative_controls.py::test_a_nan_in_a_pool_row_no_golden_checks_is_refused_before_the_run"]),
]


@pytest.mark.slow
def test_mutations_are_caught(tmp_path):
    assert_caught(__name__, MUTATIONS, tmp_path, timeout=600)
