"""Scenario files and schedules: every built-in parses; every bad field is one named error."""

import re

import numpy as np
import pytest
import torch

from harness.errors import HarnessError
from harness.inputs.pool import KVPool, PoolGeometry, kv_rows
from harness.inputs.reference import step_inputs
from harness.spec.presets import get_preset
from harness.spec.scenario import builtin_names, load_scenario, load_scenario_file, parse_scenario
from harness.spec.schedule import compile_schedule

REQUIRED = {"b1-l500", "b1-l4096", "b32-l4096", "b128-l2048", "ragged-mix", "edge-kv1", "edge-pool-tail", "multistep-reuse", "wide-ragged"}


def _check_paged(schedule, page_size):
    """SGLang's paged allocator: a request's tokens run consecutively inside a page and
    move on only to the first slot of a page no other request holds."""
    for batch in schedule.steps:
        owner = {}
        for i in range(batch.batch_size):
            slots = batch.kv_indices[batch.rows_of(i)].astype(np.int64)
            for a, b in zip(slots[:-1], slots[1:]):
                assert b == a + 1 or (a % page_size == page_size - 1 and b % page_size == 0), (a, b)
            for page in np.unique(slots // page_size):
                assert owner.setdefault(int(page), i) == i, f"page {page} shared"


@pytest.mark.parametrize("page_size", [1, 64])
def test_builtins_parse_and_compile_at_prod_scale(page_size):
    assert REQUIRED <= set(builtin_names())
    for name in builtin_names():
        if name == "explicit-slots" and page_size == 1:
            continue  # its slots are placed for a 64-token-page pool
        scenario = load_scenario(name)
        schedule = compile_schedule(scenario, 495_552 if name != "explicit-slots" else 16_384, page_size)
        for batch in schedule.steps:
            assert len(np.unique(batch.kv_indices)) == len(batch.kv_indices), "a slot is read twice in one step"
            assert batch.kv_indices.min() >= page_size, "page 0 is the dummy"
            ends = batch.kv_indptr[1:] - 1
            assert np.array_equal(batch.kv_indices[ends], batch.write_slots), "the new token is each request's last row"
        if scenario.layout != "explicit":
            _check_paged(schedule, page_size)


def test_paged_check_catches_a_scattered_token():
    schedule = compile_schedule(load_scenario("b1-l500"), 16_384, 1)  # page-1 schedule seen as 64-token pages
    with pytest.raises(AssertionError):
        _check_paged(schedule, 64)


def test_page_size_one_keeps_token_scatter_and_64_fills_pages():
    one = compile_schedule(load_scenario("b1-l500"), 16_384, 1).steps[0].kv_indices
    paged = compile_schedule(load_scenario("b1-l500"), 16_384, 64).steps[0].kv_indices
    assert len(np.unique(one // 64)) > 100  # single slots scattered over the pool
    assert len(np.unique(paged // 64)) == 8  # 500 tokens in ceil(500 / 64) pages
    assert np.count_nonzero(np.diff(paged) != 1) == 7


def test_ragged_mix_has_the_boundary_lengths():
    lens = load_scenario("ragged-mix").kv_lens
    assert {1, 2, 127, 4097} <= set(lens)


@pytest.mark.parametrize("page_size", [1, 64])
def test_multistep_reuse_really_reuses_slots(page_size):
    schedule = compile_schedule(load_scenario("multistep-reuse"), 16_384, page_size)
    reused = [len(b.reused_slots) for b in schedule.steps]
    assert sum(reused) >= 3
    later = schedule.steps[-1]
    assert later.index_gens.max() == later.write_gen and (later.index_gens > 0).sum() > later.batch_size


@pytest.mark.parametrize("page_size", [1, 64])
def test_tail_layout_uses_the_last_slot(page_size):
    schedule = compile_schedule(load_scenario("edge-pool-tail"), 16_384, page_size)
    assert 16_384 + page_size - 1 in schedule.steps[0].kv_indices


@pytest.mark.parametrize("page_size", [1, 64])
def test_contiguous_layout_is_consecutive(page_size):
    batch = compile_schedule(load_scenario("contiguous-b4"), 16_384, page_size).steps[0]
    first = batch.kv_indices[: batch.kv_indptr[1] - 1]
    assert np.array_equal(first, np.arange(page_size, page_size + len(first)))


def test_explicit_slots_share_a_page_and_extend_within_it():
    batch = compile_schedule(load_scenario("explicit-slots"), 16_384, 64).steps[0]
    assert batch.kv_indices.tolist()[:2] == [64, 16447] and batch.kv_indices.tolist()[3] == 65
    assert batch.write_slots[1] == 66  # request 1's page still has room
    assert batch.write_slots[0] % 64 == 0 and batch.write_slots[0] // 64 not in (1, 256)  # a fresh page


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
        ({"finish": 5}, "finish"),
        ({"finish": True}, "finish"),
        ({"finish": {"after_step": 0, "request": 0}}, "finish"),
        ({"layout": "explicit", "slots": [[1, 2, 3], [4, 5, 0, 6]]}, "slots[1][2]"),
        ({"layout": "explicit", "slots": [[1, 2, 3], [4, 5, 2, 6]]}, "slots[1][2]"),
        ({"slots": [[1, 2, 3], [4, 5, 6, 7]]}, "slots"),
        ({"description": {"a": 1}}, "description"),  # was read as the text "{'a': 1}"
        ({"description": 5}, "description"),
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


@pytest.mark.parametrize("lens, field", [("batch_size = 2\nkv_len = 20000", "batch_size + kv_len"), ("kv_lens = [20000, 20000]", "kv_lens")])
def test_a_pool_too_small_names_the_fields_the_file_has(tmp_path, lens, field):
    path = tmp_path / "s.toml"
    path.write_text(f'name = "x"\n{lens}\n')
    with pytest.raises(HarnessError, match=re.escape(f"{path}: {field}: scenario needs up to 40000 slots")):
        compile_schedule(load_scenario_file(path), 16_384)


def test_explicit_slot_beyond_pool():
    scenario = parse_scenario({**GOOD, "layout": "explicit", "slots": [[1, 2, 99], [4, 5, 6, 7]]}, "s.toml")
    with pytest.raises(HarnessError, match="slot 99 is outside the pool's slots 1..50"):
        compile_schedule(scenario, 50)


def test_explicit_slot_in_the_reserved_page():
    scenario = parse_scenario({**GOOD, "layout": "explicit", "slots": [[1, 64, 65], [66, 67, 68, 69]]}, "s.toml")
    with pytest.raises(HarnessError, match="slot 1 is outside the pool's slots 64..16447"):
        compile_schedule(scenario, 16_384, 64)


def test_pages_not_slots_run_out():
    """9 tokens fit in 100 slots, but two requests need two 64-token pages and 100 slots hold one."""
    with pytest.raises(HarnessError, match=r"needs up to 9 tokens in 2 64-token pages \(128 slots\) but the pool has 100 slots \(1 whole pages\); use a larger scale or --slots 128$"):
        compile_schedule(parse_scenario(GOOD, "s.toml"), 100, 64)
    assert compile_schedule(parse_scenario(GOOD, "s.toml"), 128 + 63, 64).steps[0].kv_indices.max() < 192


def test_malformed_toml_names_the_file(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('name = "x"\nkv_lens = [1, 2\n')
    with pytest.raises(HarnessError) as info:
        load_scenario_file(path)
    assert info.value.where == str(path) and "malformed TOML" in info.value.message


def test_unknown_builtin_lists_choices():
    with pytest.raises(HarnessError, match="b1-l4096"):
        load_scenario("nope")


@pytest.mark.parametrize("name", ["", "../scenarios/b1-l500", "./b1-l500", "b1-l500.toml", "/etc/hostname"])
def test_a_builtin_name_is_never_a_path_or_empty(name):
    """--scenario (and a cases.toml scenario) names a built-in only: an empty name is not the default, a path is
    not a built-in (--scenario-file reads files); the twin, a real built-in name, loads."""
    with pytest.raises(HarnessError, match="unknown scenario") as info:
        load_scenario(name)
    assert info.value.where == "--scenario"
    assert ("--scenario-file" in str(info.value)) == bool(name)  # a path is pointed to --scenario-file
    assert load_scenario("b1-l500").name == "b1-l500"


@pytest.mark.parametrize("slot, ok", [(16, True), (17, False)])  # 16 slots + page 0: rows 0..16
def test_an_explicit_slot_one_past_the_pool_is_refused(slot, ok):
    from harness.errors import HarnessError
    from harness.spec.scenario import parse_scenario
    from harness.spec.schedule import compile_schedule

    scn = parse_scenario({"name": "x", "kv_lens": [2], "layout": "explicit", "slots": [[slot]]}, "x.toml")
    if ok:
        compile_schedule(scn, 16, 1)
    else:
        with pytest.raises(HarnessError, match="outside the pool"):
            compile_schedule(scn, 16, 1)


@pytest.mark.parametrize("slot, ok", [(126, True), (128, False), (163, False)])
def test_an_explicit_slot_past_the_last_whole_page_is_refused(slot, ok):
    """100 slots in 64-token pages: the allocator hands out page 1 only (slots 64..127, as SGLang rounds the pool
    down to whole pages); rows 128..163 exist but a token there (and the new one after it, row 164, past the
    buffer) is outside the pool: one named line, not an index error in every strategy."""
    scn = parse_scenario({"name": "x", "kv_lens": [2], "layout": "explicit", "slots": [[slot]]}, "x.toml")
    if ok:
        assert compile_schedule(scn, 100, 64).steps[0].kv_indices.tolist() == [126, 127]
    else:
        with pytest.raises(HarnessError, match=f"slot {slot} is outside the pool's slots 64..127"):
            compile_schedule(scn, 100, 64)


def _rewritten_reads(schedule) -> int:
    """Reads of a slot whose earlier decoded token (a finished request's) was overwritten by a later step's."""
    held, count = {}, 0
    for batch in schedule.steps:
        count += sum(held.get(s, 0) > 0 for s in batch.write_slots.tolist())
        held.update(dict.fromkeys(batch.write_slots.tolist(), batch.write_gen))
    return count


@pytest.mark.parametrize("page_size", [1, 64])
def test_index_gens_name_what_each_read_row_holds(page_size):
    """The reference and the goldens read row kv_indices[i] as written at generation index_gens[i]: replaying every
    step's writes into a model of the pool (slot -> generation of its last write, 0 for the prefilled pool) gives
    those generations for every built-in. Page 1 multistep-reuse rewrites a slot that held a finished request's
    decoded token (generation 1 -> 4); no golden covers it (its goldens are GLM-5's 64-token pages, whose reused
    slots were prefilled), so a schedule keeping the first write's generation failed nothing."""
    for name in builtin_names():
        if name == "explicit-slots" and page_size == 1:
            continue  # its slots are placed for a 64-token-page pool
        schedule = compile_schedule(load_scenario(name), 495_552 if name != "explicit-slots" else 16_384, page_size)
        pool: dict[int, int] = {}
        for batch in schedule.steps:
            pool.update(dict.fromkeys(batch.write_slots.tolist(), batch.write_gen))
            assert [pool.get(s, 0) for s in batch.kv_indices.tolist()] == batch.index_gens.tolist(), (name, batch.step)
    assert _rewritten_reads(compile_schedule(load_scenario("multistep-reuse"), 16_384, 1)) > 0


def test_a_rewritten_slot_is_read_as_the_pool_holds_it():
    """End to end on the CPU: a KVPool written step by step as the decode loop writes it (the step's new tokens
    before anyone reads) holds, at every row a step attends, the bytes the float64 reference reads, with a slot
    rewritten after a finished request's decoded token in it (page 1 multistep-reuse, one layer)."""
    preset, scenario = get_preset("deepseek-v3-tp8"), load_scenario("multistep-reuse")
    schedule = compile_schedule(scenario, 16_384, preset.page_size)
    assert _rewritten_reads(schedule) > 0
    pool = KVPool(PoolGeometry(16_384, 1, preset.row_width, preset.page_size), scenario.seed, torch.device("cpu"))
    for batch in schedule.steps:
        slots = torch.as_tensor(batch.write_slots)
        pool.write(0, slots, kv_rows(scenario.seed, 0, batch.write_slots, batch.write_gen, preset.row_width, pool.device))
        ref = step_inputs(preset, scenario.seed, batch, 0, range(batch.batch_size))
        for i, rows in enumerate(ref.rows):
            held = pool.buffers[0][torch.as_tensor(batch.kv_indices[batch.rows_of(i)], dtype=torch.int64), 0]
            assert torch.equal(held, rows), (batch.step, i)


def test_a_new_token_never_lands_on_a_slot_another_request_holds():
    """Explicit slots 64 (request 0) and 65 (request 1) share a 64-token page: request 0's next slot, 65, is request
    1's, so its new token goes to a fresh page; request 1's goes to 66, still free in the page."""
    scenario = parse_scenario({"name": "x", "kv_lens": [2, 2], "layout": "explicit", "slots": [[64], [65]]}, "x.toml")
    batch = compile_schedule(scenario, 16_384, 64).steps[0]
    assert batch.write_slots[0] % 64 == 0 and batch.write_slots[0] != 64 and batch.write_slots[1] == 66
    assert len(np.unique(batch.kv_indices)) == len(batch.kv_indices)
