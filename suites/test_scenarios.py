"""Scenario files and schedules: every built-in parses; every bad field is one named error."""

import numpy as np
import pytest

from harness.errors import HarnessError
from harness.scenario import builtin_names, load_scenario, load_scenario_file, parse_scenario
from harness.schedule import compile_schedule

REQUIRED = {"b1-l500", "b1-l4096", "b32-l4096", "b128-l2048", "ragged-mix", "edge-kv1", "edge-pool-tail", "multistep-reuse"}


def test_builtins_parse_and_compile_at_prod_scale():
    assert REQUIRED <= set(builtin_names())
    for name in builtin_names():
        scenario = load_scenario(name)
        schedule = compile_schedule(scenario, 495_552 if name != "explicit-slots" else 16_384)
        for batch in schedule.steps:
            assert len(np.unique(batch.kv_indices)) == len(batch.kv_indices), "a slot is read twice in one step"
            assert batch.kv_indices.min() >= 1, "slot 0 is the dummy"
            ends = batch.kv_indptr[1:] - 1
            assert np.array_equal(batch.kv_indices[ends], batch.write_slots), "the new token is each request's last row"


def test_ragged_mix_has_the_boundary_lengths():
    lens = load_scenario("ragged-mix").kv_lens
    assert {1, 2, 127, 4097} <= set(lens)


def test_multistep_reuse_really_reuses_slots():
    schedule = compile_schedule(load_scenario("multistep-reuse"), 16_384)
    reused = [len(b.reused_slots) for b in schedule.steps]
    assert sum(reused) >= 3
    later = schedule.steps[-1]
    assert later.index_gens.max() == later.write_gen and (later.index_gens > 0).sum() > later.batch_size


def test_tail_layout_uses_the_last_slot():
    schedule = compile_schedule(load_scenario("edge-pool-tail"), 16_384)
    assert 16_384 in schedule.steps[0].kv_indices


def test_contiguous_layout_is_consecutive():
    batch = compile_schedule(load_scenario("contiguous-b4"), 16_384).steps[0]
    first = batch.kv_indices[: batch.kv_indptr[1] - 1]
    assert np.array_equal(first, np.arange(1, len(first) + 1))


GOOD = {"name": "x", "seed": 1, "steps": 1, "kv_lens": [4, 5]}


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"kv_lens": [4, 0]}, "kv_lens[1]"),
        ({"kv_lens": [-3]}, "kv_lens[0]"),
        ({"kv_lens": []}, "kv_lens"),
        ({"steps": 0}, "steps"),
        ({"seed": "one"}, "seed"),
        ({"layout": "random"}, "layout"),
        ({"kv_lenz": [3]}, "kv_lenz"),
        ({"finish": [{"after_step": 0, "request": 0}]}, "finish[0].after_step"),
        ({"layout": "explicit", "slots": [[1, 2, 3], [4, 5, 0, 6]]}, "slots[1][2]"),
        ({"layout": "explicit", "slots": [[1, 2, 3], [4, 5, 2, 6]]}, "slots[1][2]"),
        ({"slots": [[1, 2, 3], [4, 5, 6, 7]]}, "slots"),
    ],
)
def test_bad_fields_name_file_and_field(patch, field):
    with pytest.raises(HarnessError) as info:
        parse_scenario({**GOOD, **patch}, "my.toml")
    assert info.value.where == f"my.toml: {field}"
    assert "\n" not in str(info.value)


def test_slot_zero_and_duplicates_have_specific_messages():
    with pytest.raises(HarnessError, match="reserved dummy"):
        parse_scenario({**GOOD, "layout": "explicit", "slots": [[1, 0, 3], [4, 5, 6, 7]]}, "s.toml")
    with pytest.raises(HarnessError, match="duplicate slot 3"):
        parse_scenario({**GOOD, "layout": "explicit", "slots": [[1, 2, 3], [4, 3, 6, 7]]}, "s.toml")


def test_request_longer_than_pool():
    scenario = parse_scenario({**GOOD, "kv_lens": [20_000]}, "s.toml")
    with pytest.raises(HarnessError, match="needs up to 20000 slots but the pool has 16384"):
        compile_schedule(scenario, 16_384)


def test_explicit_slot_beyond_pool():
    scenario = parse_scenario({**GOOD, "layout": "explicit", "slots": [[1, 2, 99], [4, 5, 6, 7]]}, "s.toml")
    with pytest.raises(HarnessError, match="beyond the pool's last slot 50"):
        compile_schedule(scenario, 50)


def test_malformed_toml_names_the_file(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('name = "x"\nkv_lens = [1, 2\n')
    with pytest.raises(HarnessError) as info:
        load_scenario_file(path)
    assert info.value.where == str(path) and "malformed TOML" in info.value.message


def test_unknown_builtin_lists_choices():
    with pytest.raises(HarnessError, match="b1-l4096"):
        load_scenario("nope")
