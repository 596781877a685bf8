"""Planted twins of issue 25's bounds, validation and pins (as suites/test_mutations.py does): each
mutation replaces one exact source text in a fresh copy of the tree and runs the tests that must
catch it; one child process runs them all. A mutation whose tests still pass is a check that
cannot fail. (The DSA index-K oracle needs SGLang: its planted run is in suites/sglang.)
"""

from __future__ import annotations

import pytest

from suites.mutation import assert_caught

B, P, E, S = "suites/test_bounds.py", "suites/test_pins.py", "suites/test_envvars.py", "suites/test_shard_plan.py"
OUTPUTS = "suites/test_outputs_and_goldens.py"
REFRESH = "suites/test_golden_refresh_safety.py"
STEP, ROTATION = "suites/test_model_step.py", "test_rotation_check_fails_when_rotated_and_distinct_are_one_workload"

# (id, file, exact original text, mutated text, tests that must fail)
MUTATIONS = [
    # bounds and validation (items 9, 11, 13, 14 and the LOW items)
    ("pool-grows-by-slots-not-pages", "harness/spec/schedule.py",
     "max(slots_needed(scenario), pages_needed(scenario, page_size) * page_size)",
     "slots_needed(scenario)", [f"{B}::test_cpu_pool_grows_in_whole_pages"]),
    ("layers-uncapped", "harness/cli/common.py", "    if scale.layers_for(preset) > preset.num_layers:", "    if False:",
     [f"{B}::test_layers_are_at_most_the_models"]),
    ("steps-uncapped", "harness/spec/scenario.py", 'data.get("steps", 1), 1, MAX_STEPS)', 'data.get("steps", 1), 1)',
     [f"{B}::test_impossible_scenarios_are_one_line"]),
    ("schedule-rows-uncapped", "harness/spec/scenario.py", "    if rows > MAX_SCHEDULE_ROWS:", "    if False:",
     [f"{B}::test_impossible_scenarios_are_one_line"]),
    ("kv-len-uncapped", "harness/spec/scenario.py", '(_int(f"{source}: kv_len", data["kv_len"], 1, MAX_KV_LEN),)',
     '(_int(f"{source}: kv_len", data["kv_len"], 1),)', [f"{B}::test_impossible_scenarios_are_one_line"]),
    ("seed-uncapped", "harness/spec/scenario.py", 'data.get("seed", 0), 0, MAX_SEED)', 'data.get("seed", 0), 0)',
     [f"{B}::test_seeds_past_32_bits_do_not_alias_seed_0"]),
    ("synth-key-truncated", "harness/spec/synth.py", "        if not 0 <= v <= M32:", "        if False:",
     [f"{B}::test_seeds_past_32_bits_do_not_alias_seed_0"]),
    ("repeats-uncapped", "harness/spec/scenario.py", "return _int(where, repeats, minimum, MAX_REPEATS)",
     "return _int(where, repeats, minimum)", [f"{B}::test_repeats_are_bounded"]),
    ("allreduce-nan-accepted", "harness/tpot/allreduce.py", "us: Annotated[float, msgspec.Meta(gt=0, le=MAX_US)]", "us: float",
     [f"{B}::test_allreduce_table_refuses_bad_latencies"]),
    ("progress-silent-until-the-end", "harness/progress.py", 'if now - state["said"] >= LINE_EVERY_S and', "if False and",
     [f"{B}::test_long_phases_print_progress_lines"]),
    ("utf16-not-named", "harness/datafiles.py", "    if raw[:2] in UTF16_BOMS or", "    if False and",
     [f"{B}::test_utf16_inputs_are_named_utf16"]),
    ("shard-plan-negative-gpus", "ci/shard_plan.py", "    if not 0 <= gpus <= MAX_GPUS:", "    if False:",
     [f"{S}::test_bad_arguments_and_models_are_one_line"]),
    ("shard-plan-model-unchecked", "ci/shard_plan.py", "model = load_model(args.model)",
     "model = json.loads(args.model.read_text())", [f"{S}::test_bad_arguments_and_models_are_one_line"]),
    ("envvar-bounds-ignored", "harness/envvars.py", "        if not var.minimum <= value <= var.maximum:", "        if False:",
     [f"{E}::test_a_bad_value_is_one_line_naming_the_variable"]),
    ("envvar-names-unchecked", "harness/envvars.py", "        if unknown := [n for n in names if n not in allowed]:",
     "        if unknown := []:", [f"{E}::test_a_bad_value_is_one_line_naming_the_variable"]),
    ("asv-setup-loses-the-variable", "suites/asv/benchmarks.py", 'raise ValueError(f"bad asv environment: {BAD_ENV[0]}")',
     'raise ValueError("bad asv environment")', [f"{E}::test_asv_benchmarks_import_and_setup_names_the_variable"]),
    ("gpu-count-unchecked", "suites/plugins/gpu_binding.py", "count = envvars.read(ENV_NUM_GPUS)",
     "count = int(os.environ[ENV_NUM_GPUS]) if os.environ.get(ENV_NUM_GPUS) else None",
     [f"{E}::test_gpu_binding_refuses_a_bad_gpu_count"]),
    ("cuda-kernel-spills", "harness/kernels/fused_mla_cuda.cu", "__launch_bounds__(32 * W, (W == 8 && STAGES == 2) ? 2 : 1)",
     "__launch_bounds__(32 * W, (W == 8 && STAGES == 2) ? 4 : 1)", ["suites/test_fused_cuda_build.py::test_every_instance_builds_and_spills_only_where_pinned"]),
    ("existing-output-replaced", "harness/fsio.py", "if path.exists() and not force:", "if False:",
     [f"{OUTPUTS}::test_an_existing_file_is_replaced_only_with_force"]),
    ("refresh-takes-a-folder-without-manifest-for-new", "harness/cli/golden.py",
     "if not os.path.lexists(golden.case_dir(case.name)):", "if not (golden.case_dir(case.name) / golden.MANIFEST).exists():",
     [f"{REFRESH}::test_refresh_keeps_a_case_folder_without_a_manifest"]),
    ("refresh-force-deletes-the-users-files", "harness/verify/golden.py", "        if foreign := _not_the_goldens(folder):",
     "        if foreign := []:", [f"{REFRESH}::test_refresh_keeps_a_case_folder_without_a_manifest"]),
    ("verify-ignores-the-seed", "harness/verify/golden.py", 'if f not in ("inputs_sha256", "versions")]',
     'if f not in ("inputs_sha256", "versions", "seed", "reference_precision")]',
     [f"{REFRESH}::test_verify_sees_a_resigned_case_spec_and_refresh_force_repairs_it"]),
    ("golden-dtypes-unchecked", "harness/verify/golden.py", "if tensors[name].dtype != dtype or tensors[name].dim() != rank:",
     "if tensors[name].dim() != rank:", [f"{REFRESH}::test_a_resigned_golden_of_other_dtypes_is_one_line"]),
    ("golden-ranks-unchecked", "harness/verify/golden.py", "if tensors[name].dtype != dtype or tensors[name].dim() != rank:",
     "if tensors[name].dtype != dtype:", [f"{REFRESH}::test_a_resigned_golden_of_other_dtypes_is_one_line"]),
    ("empty-old-folders-kept", "harness/verify/golden.py", "    for empty in _emptied(case_name, _root(root)):",
     "    for empty in []:", [f"{REFRESH}::test_empty_old_folders_of_a_killed_refresh_are_removed"]),
    ("empty-case-list-accepted", "harness/inputs/cases.py", "if not isinstance(cases, list) or not cases or not all(",
     "if not isinstance(cases, list) or not all(", [f"{REFRESH}::test_an_empty_case_list_is_bad_input"]),
    ("refresh-replaces-a-linked-folder", "harness/verify/golden.py",
     "        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):", "        if False:",
     [f"{REFRESH}::test_refresh_force_refuses_a_linked_case_folder"]),
    ("free-path-renamed-over", "harness/fsio.py", "    if given in _FOUND_FREE:", "    if False:",
     [f"{OUTPUTS}::test_several_files_are_written_all_or_nothing"]),
    ("link-made-meanwhile-written-through", "harness/fsio.py",
     "and (Path(os.path.abspath(target)) != _FOUND_FREE[given]", "and (False",
     [f"{OUTPUTS}::test_a_link_made_at_the_path_while_the_run_works_is_not_written_through"]),
    ("dangling-link-folder-passes", "harness/fsio.py", "    if existing.is_symlink() and not existing.exists():",
     "    if False:", [f"{OUTPUTS}::test_an_output_under_a_dangling_link_is_refused_before_any_work"]),
    ("report-files-written-one-by-one", "harness/render/report.py", "        write_files({out_dir / name: data for name, data in files.items()}, \"--out\")",
     "        [write_files({out_dir / name: data}, \"--out\") for name, data in files.items()]",
     [f"{OUTPUTS}::test_a_report_that_fails_midway_leaves_the_earlier_one_whole"]),
    ("report-writes-through-links", "harness/fsio.py", "    if path.is_symlink():", "    if False:",
     [f"{OUTPUTS}::test_report_force_never_writes_through_a_link_in_out"]),
    ("tpot-json-checked-after-timing", "harness/tpot/cli.py", 'check_writable(args.json, "--json", args.force)  # before the timing run',
     "pass  # before the timing run", [f"{OUTPUTS}::test_tpot_json_folder_is_refused_before_the_timing_run"]),
    ("tpot-sglang-preflight-skipped", "harness/tpot/cli.py", "        software = _require_sglang(args.sglang_python)", "        software = {}",
     [f"{OUTPUTS}::test_tpot_engine_sglang_without_sglang_leaves_nothing"]),
    # the rotation check compares two workloads: a run where they are one is refused or fails
    ("rotation-distinct-made-as-rotated", "harness/tpot/tpot.py", "weights=make_weights(ctx.shape, layers, seed + 1, ctx.device)",
     "weights=make_weights(ctx.shape, ctx.weight_sets, seed + 1, ctx.device)", [f"{STEP}::{ROTATION}"]),
    ("rotation-one-workload-passes", "harness/tpot/tpot.py", 'if not sets_read["rotated"] < sets_read["distinct"] == 2 * layers:',
     "if False:", [f"{STEP}::{ROTATION}"]),
    ("rotation-one-workload-not-refused", "harness/tpot/cli.py", "        refuse_one_workload_rotation(shape.num_layers, args.weight_sets)",
     "        pass", ["suites/test_model_cli.py::test_tpot_check_rotation_that_would_time_one_workload_twice_is_refused"]),
    # behaviours no test pinned
    ("coverage-skips-step-0", "harness/verify/golden.py", "if not np.array_equal(gold.positions(batch.step), checked_positions(batch, ids)):",
     "if batch.step and not np.array_equal(gold.positions(batch.step), checked_positions(batch, ids)):",
     [f"{P}::test_coverage_covers_every_step_and_step_0"]),
    ("coverage-skips-last-step", "harness/verify/golden.py", "if not np.array_equal(gold.positions(batch.step), checked_positions(batch, ids)):",
     "if batch is not schedule.steps[-1] and not np.array_equal(gold.positions(batch.step), checked_positions(batch, ids)):",
     [f"{P}::test_coverage_covers_every_step_and_step_0"]),
    ("contract-checks-ckv-only", "harness/backends/contract.py", "(ckv.dtype != kv_dtype or kpe.dtype != kv_dtype)", "ckv.dtype != kv_dtype",
     [f"{P}::test_contract_flags_ckv_and_kpe_each_alone"]),
    ("contract-checks-kpe-only", "harness/backends/contract.py", "(ckv.dtype != kv_dtype or kpe.dtype != kv_dtype)", "kpe.dtype != kv_dtype",
     [f"{P}::test_contract_flags_ckv_and_kpe_each_alone"]),
    ("tolerance-family-only", "harness/verify/check.py", 'for key in (f"{strategy}.{backend}", f"{strategy}.{family}", strategy):',
     'for key in (f"{strategy}.{family}", strategy):', [f"{P}::test_tolerance_lookup_by_exact_backend_key"]),
    ("tolerance-by-suffix", "harness/verify/check.py", 'for key in (f"{strategy}.{backend}", f"{strategy}.{family}", strategy):',
     'for key in [k for k in table if k.startswith(strategy + ".") and k.endswith(backend)] + [f"{strategy}.{family}", strategy]:',
     [f"{P}::test_tolerance_lookup_by_exact_backend_key"]),
    ("extra-bytes-gather-cast-short", "harness/strategies/gather_cast.py", "return (schedule.max_active_rows + 1) * geometry.row_width * 2",
     "return schedule.max_active_rows * geometry.row_width * 2", [f"{P}::test_extra_bytes_is_what_each_strategy_allocates"]),
    ("extra-bytes-shadow-as-fp8", "harness/strategies/shadow.py", "return geometry.kv_bytes * 2", "return geometry.kv_bytes",
     [f"{P}::test_extra_bytes_is_what_each_strategy_allocates"]),
    ("extra-bytes-stock-whole-pool", "harness/strategies/stock.py", "return geometry.layer_bytes * 2  # the BF16 temporary",
     "return geometry.kv_bytes * 2  # the BF16 temporary", [f"{P}::test_extra_bytes_is_what_each_strategy_allocates"]),
    ("strict-skip-guard-off", "conftest.py", 'STRICT = bool(envvars.read("MLA_HARNESS_STRICT_SKIPS"))', "STRICT = False",
     [f"{P}::test_strict_skip_guard_fails_a_session_with_an_unexplained_skip"]),
    ("strict-skip-guard-only-reports", "conftest.py", "        session.exitstatus = pytest.ExitCode.TESTS_FAILED", "        pass",
     [f"{P}::test_strict_skip_guard_fails_a_session_with_an_unexplained_skip"]),
    ("triton-shim-not-installed", "suites/plugins/triton_interpreter.py", 'os.environ.get(CHILD) == "1":\n        install()',
     'os.environ.get(CHILD) == "1":\n        pass', [f"{P}::test_triton_shim_is_installed_in_the_interpreter_child"]),
    ("gather-cast-capacity-unchecked", "harness/kernels/gather_cast.py", "if src.shape[1] != out.shape[1] or n > out.shape[0]:",
     "if src.shape[1] != out.shape[1]:", [f"{P}::test_kernel_launchers_validate_before_launching"]),
    ("index-dtype-unchecked", "harness/kernels/rowtile.py",
     "if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1 or not t.is_contiguous():", "if t.dim() != 1:",
     [f"{P}::test_kernel_launchers_validate_before_launching"]),
    ("fused-kpe-dtype-unchecked", "harness/kernels/fused_mla_decode.py", "if ckv.dtype != torch.uint8 or kpe.dtype != torch.uint8:",
     "if ckv.dtype != torch.uint8:", [f"{P}::test_fused_launcher_checks_and_buffers"]),
    ("fused-arrivals-floor", "harness/kernels/fused_mla_cuda.py", "return batch * -(-num_heads // 8)", "return batch * (num_heads // 8)",
     [f"{P}::test_fused_launcher_checks_and_buffers"]),
    ("fused-prefetch-with-reload", "harness/kernels/fused_mla_decode.py", "if self.prefetch and self.reload_v:", "if False:",
     [f"{P}::test_fused_launcher_checks_and_buffers"]),
    ("asv-clock-repeats-a-sample", "suites/asv/benchmarks.py", "self.now += self.samples[self.next]", "self.now += self.samples[0]",
     [f"{P}::test_asv_sample_clock_hands_each_sample_once"]),
    ("asv-us-as-ms", "suites/asv/benchmarks.py", 'TO_SECONDS = {"ms": 1e-3, "us": 1e-6}', 'TO_SECONDS = {"ms": 1e-3, "us": 1e-3}',
     [f"{P}::test_asv_benchmarks_report_seconds_for_every_timed_metric"]),
    ("asv-samples-not-in-seconds", "suites/asv/benchmarks.py", "[v * TO_SECONDS[s.unit] for v in s.values]", "[v for v in s.values]",
     [f"{P}::test_asv_setup_cache_hands_asv_seconds"]),
    ("asv-two-rounds", "suites/asv/benchmarks.py", "    rounds = 1  # the samples", "    rounds = 2  # the samples",
     [f"{P}::test_asv_benchmarks_report_seconds_for_every_timed_metric"]),
    # issue 28's session: a run's repro pins its resolved defaults; the tuning table names a misspelt field
    ("repro-defaults-unpinned", "harness/cli/run.py", "repro_command(pinned)", "repro_command(args.argv)",
     ["suites/test_cli.py::test_repro_pins_the_defaults_this_machine_resolved"]),
    ("tuning-entry-unknown-field-read", "harness/kernels/fused_tuning.py", "        if unknown:", "        if False:",
     ["suites/test_fused_fp8.py::test_tuning_table_and_default"]),
    ("explicit-top-slot-ignored", "harness/spec/schedule.py", "if explicit > need else", "if False else",
     [f"{B}::test_cpu_pool_grows_to_an_explicit_layouts_highest_slot"]),
    # the fused kernel's early tile loads: fused_fp8 names the rows its step writes (the GPU race test pins the kernel)
    ("fused-new-tokens-none-left", "harness/strategies/fused_fp8.py", "indices_ready=True, new_tokens=NEW_TOKENS)",
     "indices_ready=True, new_tokens=0)", ["suites/test_fused_fp8.py::test_fused_fp8_tells_the_kernel_which_rows_the_step_writes"]),
    ("fused-new-tokens-negative-taken", "harness/kernels/fused_mla_decode.py", "if new_tokens is not None and new_tokens < 0:",
     "if False:", [f"{P}::test_fused_launcher_checks_and_buffers"]),
]


def test_mutation_ids_are_unique():
    assert len({m[0] for m in MUTATIONS}) == len(MUTATIONS)


@pytest.mark.slow
def test_pins_mutations_are_caught(tmp_path):
    assert_caught(__name__, MUTATIONS, tmp_path)
