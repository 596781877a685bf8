"""The gate's mutation test: a fault planted in a copy of the source tree (one exact line replaced,
as suites/test_mutations.py does) must make the tests that pin that behaviour fail. Covers the
decision rule, the control, the clock guard, compare's rules, the results schema and ci/asv_gate.py.
"""

from __future__ import annotations

import pytest

from suites.mutation import ROOT, assert_caught

RULE, COMPARE, INPUT, ASV = ("suites/test_decision_rule.py", "suites/test_compare.py", "suites/test_gate_input.py",
                             "suites/test_asv_gate.py")
CASE = "suites/test_results_case.py"

# (id, file, exact original text, mutated text, tests that must fail)
MUTATIONS = [
    # the decision rule
    ("confidence-98", "harness/gate/decision.py", "CONFIDENCE = 0.99", "CONFIDENCE = 0.98",
     [f"{RULE}::test_the_interval_is_two_sided_99_percent"]),
    ("one-sided-tail", "harness/gate/decision.py", "tail = (1 - confidence) / 2 * 100", "tail = (1 - confidence) * 100",
     [f"{RULE}::test_the_interval_is_two_sided_99_percent"]),
    ("equal-medians-judged", "harness/gate/decision.py",
     "if len(base) and len(head) and np.median(base) == np.median(head):", "if False:",
     [f"{RULE}::test_equal_medians_are_unchanged_whatever_the_sample_count"]),
    ("resolution-ignored", "harness/gate/decision.py",
     "if status in (REGRESSED, INCONCLUSIVE) and change < resolution:", "if False:",
     [f"{INPUT}::test_the_below_resolution_note_is_shown"]),
    ("faster-head-slower", "harness/gate/decision.py",
     "if status == SLOWER and not (worse_low > 0 and worse > 0):", "if False:",
     [f"{RULE}::test_a_faster_head_below_the_resolution_is_unchanged_not_slower"]),
    ("ratio-overflows", "harness/gate/decision.py",  # the ratio of medians before its log: 1e400 is inf
     "return np.log(_bootstrap_medians(b, rng, resamples)) - np.log(_bootstrap_medians(a, rng, resamples))",
     "return np.log(_bootstrap_medians(b, rng, resamples) / _bootstrap_medians(a, rng, resamples))",
     [f"{RULE}::test_samples_at_the_ends_of_the_schemas_range_neither_overflow_nor_pass"]),
    ("undersampled-passes", "harness/gate/compare.py", "if self.cannot_judge or self.undersampled or self.disturbed:",
     "if self.cannot_judge or self.disturbed:",
     [f"{COMPARE}::test_too_few_samples_cannot_be_judged"]),
    ("bootstrap-unbounded", "harness/gate/decision.py",  # the old draw: every sample, all resamples at once
     "ordered = _thinned(values)\n    n = ordered.size\n    per_chunk = max(1, CHUNK // n)",
     "ordered = np.sort(values)\n    n = ordered.size\n    per_chunk = resamples",
     [f"{INPUT}::test_a_million_samples_compare_in_bounded_memory"]),
    # the control and the clock guard
    ("control-rise-ignored", "harness/gate/compare.py", "if d.status in (REGRESSED, decision.IMPROVED):",
     "if d.status == REGRESSED:", [f"{COMPARE}::test_a_rise_of_the_control_is_another_environment_as_a_drop_is"]),
    ("control-bytes-halved", "harness/measure/control.py", "tuple(2 * nbytes / (ms * 1e-3) / 1e9", "tuple(nbytes / (ms * 1e-3) / 1e9",
     [f"{COMPARE}::test_the_control_counts_bytes_read_and_written"]),
    ("memory-clock-vs-sm", "harness/measure/clocks.py", "if after.mem_mhz < before.mem_mhz * CLOCK_DROP:",
     "if after.mem_mhz < before.sm_mhz * CLOCK_DROP:", [f"{COMPARE}::test_each_clock_is_compared_with_its_own_before_value"]),
    ("sm-clock-vs-memory", "harness/measure/clocks.py", "if after.sm_mhz < before.sm_mhz * CLOCK_DROP:",
     "if after.sm_mhz < before.mem_mhz * CLOCK_DROP:", [f"{COMPARE}::test_each_clock_is_compared_with_its_own_before_value"]),
    ("standing-throttle-disturbs", "harness/measure/clocks.py", "if started := sorted(set(after.slowdown) - set(before.slowdown)):",
     "if started := sorted(set(after.slowdown)):",
     [f"{COMPARE}::test_only_a_throttle_that_started_during_the_block_disturbs_it"]),
    ("one-sided-control-unchecked", "harness/gate/compare.py", "    if controls[0] != controls[1]:", "    if False:",
     [f"{COMPARE}::test_a_control_in_one_file_only_cannot_judge"]),
    ("unknown-device-is-cpu", "harness/gate/compare.py",
     "if kind is None and any(_gated_timing(r) for r in results.rows):", "if False:",
     [f"{INPUT}::test_an_unknown_device_is_bad_input_when_timings_gate"]),
    ("disturbed-passes", "harness/gate/compare.py", "if self.cannot_judge or self.undersampled or self.disturbed:",
     "if self.cannot_judge or self.undersampled:", [f"{COMPARE}::test_disturbed_row_is_reported_not_compared_and_cannot_be_judged"]),
    ("base-guard-unread", "harness/gate/compare.py", "why = _disturbed(base) or _disturbed(head)", "why = _disturbed(head)",
     [f"{COMPARE}::test_the_base_rows_guard_is_read_as_well_as_the_heads"]),
    ("peak-bytes-informational", "harness/results/metrics.py", '_m("peak_bytes", "B", "lower", CUDA,',
     '_m("peak_bytes", "B", "lower", NOWHERE,', [f"{COMPARE}::test_peak_bytes_gates_on_cuda_only"]),
    # compare's rules
    ("exact-tolerance-ignored", "harness/gate/compare.py",
     'worse, improved = (h > b * (1 + f), h * (1 + f) < b) if better == "lower"',
     'worse, improved = (h > b, h * (1 + f) < b) if better == "lower"',
     [f"{COMPARE}::test_an_exact_metric_within_the_tolerance_is_changed_not_regressed"]),
    ("missing-row-passes", "harness/gate/compare.py", 'return Change(key, base, None, MISSING, note="not in the head")',
     'return Change(key, base, None, "added")', [f"{INPUT}::test_head_without_its_verdict_rows_fails_naming_them"]),
    ("empty-head-accepted", "harness/gate/compare.py", "        if not rows:", "        if False:",
     [f"{INPUT}::test_empty_head_is_bad_input"]),
    ("case-unchecked", "harness/gate/compare.py", "    _same_case(base, head, names)", "    pass",
     [f"{INPUT}::test_another_case_is_bad_input_naming_the_field"]),
    ("command-not-in-the-case", "harness/results/schema.py", 'CASE_FIELDS = ("command", "preset",', 'CASE_FIELDS = ("preset",',
     [f"{INPUT}::test_another_case_is_bad_input_naming_the_field", f"{INPUT}::test_tpot_json_carries_its_case"]),
    ("v2-always-run", "harness/results/schema.py", 'command = "tpot" if any(', 'command = "run" if any(',
     [f"{INPUT}::test_a_v2_file_is_upgraded_with_the_command_that_measured_it"]),
    ("workload-not-in-the-case", "harness/results/schema.py", '"kernel", "workload")', '"kernel")',
     [f"{CASE}::test_a_scenario_file_named_like_a_builtin_is_another_case", f"{CASE}::test_a_shrunk_tpot_model_is_another_case"]),
    ("verdict-status-unchecked", "harness/results/schema.py",
     'if self.metric == "verdict" and detail.status is not None and detail.status != self.value:', "if False:",
     [f"{CASE}::test_a_row_that_contradicts_itself_is_bad_input"]),
    ("value-need-not-be-the-median", "harness/results/schema.py", "if self.samples and not math.isclose(",
     "if False and not math.isclose(", [f"{CASE}::test_a_row_that_contradicts_itself_is_bad_input"]),
    ("tpot-workload-without-its-model", "harness/tpot/cli.py", 'case_record(case, ctx.backend.name, "auto", "tpot", workload)',
     'case_record(case, ctx.backend.name, "auto", "tpot")', [f"{CASE}::test_a_shrunk_tpot_model_is_another_case"]),
    ("unit-change-accepted", "harness/gate/compare.py", "    _same_units(b, h, names[1])", "    pass",
     [f"{INPUT}::test_a_unit_change_is_bad_input"]),
    ("cpu-head-judges-gpu-base", "harness/gate/compare.py",
     'device_differs = None if base_device == device else f"device {base_device} vs {device}"',
     "device_differs = None", [f"{INPUT}::test_gpu_base_against_cpu_head_cannot_judge_both_ways"]),
    ("device-case-sensitive", "harness/gate/compare.py", 'kind = env.device.split(":")[0].strip().lower() if',
     'kind = env.device.split(":")[0].strip() if', [f"{INPUT}::test_device_names_compare_case_insensitively"]),
    ("fail-after-fail-passes", "harness/gate/compare.py", "    if h in BAD_VERDICTS:", '    if h in BAD_VERDICTS and b == "pass":',
     [f"{COMPARE}::test_verdict_transitions"]),
    ("unsupported-always-explained", "harness/gate/compare.py", "    if explained:", "    if True:",
     [f"{INPUT}::test_unsupported_after_pass_is_accepted_when_the_environment_says_why"]),
    ("failing-to-unsupported-passes", "harness/gate/compare.py", "    if explained:", '    if explained or b != "pass":',
     [f"{INPUT}::test_a_failing_strategy_turned_unsupported_in_the_same_environment_fails", f"{COMPARE}::test_verdict_transitions"]),
    ("gpu-named-once-judged", "harness/gate/compare.py", "    if bool(bgpu) != bool(hgpu):", "    if False:",
     [f"{INPUT}::test_a_gpu_named_in_one_file_only_cannot_judge"]),
    ("undersampled-control-passes", "harness/gate/compare.py", "            if d.status == decision.UNDERSAMPLED:", "            if False:",
     [f"{INPUT}::test_a_control_with_too_few_samples_cannot_judge"]),
    ("undeclared-unit-accepted", "harness/gate/compare.py", "    _declared_units(b, names[0])\n    _declared_units(h, names[1])", "    pass",
     [f"{INPUT}::test_a_unit_the_metric_table_does_not_declare_is_bad_input"]),
    ("informational-regressed", "harness/gate/compare.py",
     "status = WORSE if change.status == REGRESSED and not gating else change.status", "status = change.status",
     [f"{INPUT}::test_informational_metrics_never_print_regressed"]),
    ("max-regression-unbounded", "harness/gate/compare.py", "if not 0 < value < 1:", "if not 0 <= value:",
     [f"{COMPARE}::test_parse_factor_rejects"]),
    ("unsupported-strategy-rows-missing", "harness/gate/compare.py",
     "if change.status == MISSING and change.key[:5] in unsupported:", "if False:",
     [f"{INPUT}::test_an_explained_unsupported_strategy_needs_no_other_rows"]),
    ("one-run-twice-compared", "harness/gate/compare.py", "        if base == head:", "        if False:",
     [f"{INPUT}::test_one_run_given_twice_is_bad_input"]),
    ("failing-verdict-the-base-lacks-added", "harness/gate/compare.py",
     'if key[5] == "verdict" and head.value in BAD_VERDICTS:', "if False:",
     [f"{COMPARE}::test_a_failing_verdict_the_base_lacks_fails"]),
    ("other-device-hides-failing-verdict", "harness/gate/compare.py",
     "return [c for c in self.failures if c.status == FAILING]", "return []",
     [f"{COMPARE}::test_a_failing_verdict_decides_on_another_device_too"]),
    ("regression-line-one-wording", "harness/gate/compare.py",
     'why = "; ".join(dict.fromkeys(_why_failed(c, pct) for c in failed))', 'why = f"regressed: whole CI beyond {pct}"',
     [f"{COMPARE}::test_the_regression_line_says_what_failed"]),
    # the results schema
    ("negative-counts-accepted", "harness/results/schema.py", "Count = Annotated[int, msgspec.Meta(ge=0, le=2**62)]",
     "Count = Annotated[int, msgspec.Meta(ge=-(2**62), le=2**62)]",
     [f"{INPUT}::test_negative_counts_in_verdict_statistics_are_bad_input"]),
    ("negative-timings-accepted", "harness/results/schema.py", "if not _number(v) or v < 0 or (declared.timed and v == 0):",
     "if not _number(v):", [f"{INPUT}::test_negative_or_zero_measurements_are_bad_input"]),
    ("any-verdict-accepted", "harness/results/schema.py", 'if self.metric == "verdict" and self.value not in VERDICTS:',
     "if False:", [f"{INPUT}::test_a_verdict_outside_the_four_is_bad_input"]),
    ("rows-of-another-case", "harness/results/schema.py", "if getattr(row, name) != getattr(self.case, name):", "if False:",
     [f"{INPUT}::test_a_row_of_another_case_than_its_file_is_bad_input"]),
    # ci/asv_gate.py
    ("asv-exit-2-ignored", "ci/asv_gate.py", "if failures or returncode == 2:", "if failures:",
     [f"{ASV}::test_asv_exit_2_is_a_failure_whatever_its_output_says"]),
    ("vanished-benchmark-passes", "ci/asv_gate.py", "        if name not in head:\n            out.append(",
     "        if name not in head:\n            continue\n            out.append(",
     [f"{ASV}::test_a_vanished_skipped_or_failed_benchmark_fails_the_gate"]),
    ("asv-unknown-commit-reaches-asv", "ci/asv_gate.py", "        commit_hashes(args.base, args.head, _config(args.config))\n", "",
     [f"{ASV}::test_an_unknown_commit_exits_2_naming_it_before_running_asv"]),
    ("asv-pipe-row-dropped", "ci/asv_gate.py", 'if len(cells) >= 5 and cells[0] in', 'if len(cells) == 5 and cells[0] in',
     [f"{ASV}::test_a_pipe_in_a_parameter_stays_in_the_benchmarks_name"]),
    ("asv-unread-decrease-passes", "ci/asv_gate.py", "    if summary == DECREASED and not regressions:", "    if False:",
     [f"{ASV}::test_a_decrease_in_no_row_the_gate_reads_is_a_failure"]),
    ("asv-incomparable-rows-ignored", "ci/asv_gate.py", 'for r in rows if r[0] == "x"]', 'for r in rows if r[0] == "x!"]',
     [f"{ASV}::test_a_benchmark_asv_cannot_compare_is_a_failure"]),
    ("asv-short-factor-reaches-asv", "ci/asv_gate.py", '    parser.add_argument("-f", "--factor",', '    parser.add_argument("--factor",',
     [f"{ASV}::test_asvs_spellings_of_the_gates_options_are_the_gates"]),
    ("asv-environments-merged", "ci/asv_gate.py", 'named = (lambda name, env: f"{name} [{env}]") if len(envs) > 1 else', 'named = (lambda name, env: name) if True else',
     [f"{ASV}::test_stored_results_are_one_machines_and_one_entry_per_environment"]),
    ("asv-stale-environment-compared", "ci/asv_gate.py", "    envs = sorted(found[0].keys() & found[1].keys())",
     "    envs = sorted(found[0].keys() | found[1].keys())", [f"{ASV}::test_an_earlier_runs_file_of_one_commit_is_not_this_runs"]),
    ("asv-nothing-judged-passes", "ci/asv_gate.py", "    if len(neither) == len(base.keys() & head.keys()):", "    if False:",
     [f"{ASV}::test_nothing_measured_at_both_commits_is_a_failure"]),
    ("asv-na-in-head-kept", "ci/asv_gate.py", "elif _skipped(head[name][0]) and not (name in base and _skipped(base[name][0])):",
     "elif False:", [f"{ASV}::test_na_in_the_head_is_lost_and_na_at_both_commits_is_said"]),
    ("asv-last-bench-only", "ci/asv_gate.py", 'parser.add_argument("-b", "--bench", action="append",', 'parser.add_argument("-b", "--bench",',
     [f"{ASV}::test_every_bench_regex_reaches_asv"]),
    ("asv-every-machine-read", "ci/asv_gate.py", "machine = args.machine or (machines[0] if len(machines) == 1 else None)",
     'machine = args.machine or "*"', [f"{ASV}::test_stored_results_are_one_machines_and_one_entry_per_environment"]),
    ("asv-no-results-nothing-lost", "ci/asv_gate.py", "        if not results:\n            raise HarnessError(what,",
     "        if False:\n            raise HarnessError(what,", [f"{ASV}::test_no_stored_results_for_a_commit_is_a_failure"]),
    ("asv-resolution-float-residue", "ci/asv_gate.py", "return round((after - before) / TIME_UNITS[metric.unit], 9) >=",
     "return ((after - before) / TIME_UNITS[metric.unit]) >=", [f"{ASV}::test_gates_follows_the_metric_table"]),
    ("asv-factor-unbounded", "ci/asv_gate.py", "if not 1.0 < value < 2.0:", "if not 1.0 < value:",
     [f"{ASV}::test_factor_outside_1_2_is_refused"]),
]


def test_every_mutation_names_one_exact_line():
    for name, file, original, _, tests in MUTATIONS:
        assert (ROOT / file).read_text().count(original) == 1, name
        assert all((ROOT / t.split("::")[0]).is_file() for t in tests), name


GROUPS = {"asv": [m[0] for m in MUTATIONS if m[1] == "ci/asv_gate.py"]}
GROUPS["harness"] = [m[0] for m in MUTATIONS if m[0] not in GROUPS["asv"]]


@pytest.mark.slow
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_gate_mutations_are_caught(tmp_path, group):
    assert_caught(__name__, [m for m in MUTATIONS if m[0] in GROUPS[group]], tmp_path)
