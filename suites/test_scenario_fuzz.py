"""User scenarios beyond the built-ins: seeded random valid scenarios at tiny sizes run every CPU strategy against the
live float64 reference, and the defects such scenarios found stay fixed."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from harness.cli import main
from harness.errors import HarnessError
from harness.execute.prepared import PreparedCase
from harness.inputs.cases import Case
from harness.spec import presets
from harness.spec.presets import PRESETS, get_preset, get_scale
from harness.spec.scenario import parse_scenario
from harness.spec.schedule import least_pool

# two of four one-token requests leave after step 0: step 0 attends 4 rows, step 1 2 x 2 (equal row counts)
EQUAL_ROWS = {"name": "equal-rows", "steps": 2, "kv_lens": [1, 1, 1, 1],
              "finish": [{"after_step": 0, "request": 0}, {"after_step": 0, "request": 1}]}


def _toml(data: dict) -> str:
    lines = [f"{k} = {v!r}".replace("'", '"') for k, v in data.items() if k != "finish"]
    for f in data.get("finish", []):
        lines += ["[[finish]]", f"after_step = {f['after_step']}", f"request = {f['request']}"]
    return "\n".join(lines) + "\n"


def test_gather_cast_leaves_the_schedules_indices_alone():
    """On the CPU gather_cast's index buffer was a view of the schedule's step-0 kv_indices, and its in-place refill
    for the next step of as many rows wrote step 1's rows into step 0: every strategy run after it (shadow, native_fp8)
    attended the wrong rows at step 0 and failed against the reference, while stock and gather_cast passed."""
    case = Case(get_preset("deepseek-v3-tp8"), get_scale("ci", 64, 1), parse_scenario(EQUAL_ROWS, "x.toml"))
    prep = PreparedCase(case, torch.device("cpu"), "torch").build()
    before = [b.kv_indices.copy() for b in prep.schedule.steps]
    with prep.session("gather_cast") as session:
        session.run_all([0])
    assert all(np.array_equal(b.kv_indices, old) for b, old in zip(prep.schedule.steps, before))


def _random_scenario(rng: random.Random, page: int) -> dict:
    batch = rng.choice([1, 2, 3, 5])
    kv_lens = [rng.choice([1, 2, page, page + 1, rng.randint(1, 80)]) for _ in range(batch)]
    steps = rng.choice([1, 2, 3])
    data = {"name": "fuzz", "seed": rng.randint(0, 2**32 - 1), "steps": steps, "kv_lens": kv_lens,
            "layout": rng.choice(["scattered", "contiguous", "tail"])}
    if steps > 1 and batch > 1:
        data["finish"] = [{"after_step": rng.randint(0, steps - 2), "request": r}
                          for r in rng.sample(range(batch), rng.randint(0, batch - 1))]
    return data


@pytest.mark.parametrize("example", range(6))
def test_random_valid_scenarios_pass_every_cpu_strategy(example, tmp_path, capsys):
    """Seeded random scenarios (ragged, length 1, not page multiples, finishes listed in any order, slot reuse) in a
    pool of exactly the pages they need, one layer: every CPU strategy passes against the live float64 reference."""
    rng = random.Random(example)
    preset = sorted(PRESETS)[example % len(PRESETS)]
    page = PRESETS[preset].page_size
    data = _random_scenario(rng, page)
    slots = least_pool(parse_scenario(data, "s.toml"), page)[1]
    path = tmp_path / "s.toml"
    path.write_text(_toml(data))
    argv = ["run", "--device", "cpu", "--scenario-file", str(path), "--preset", preset, "--slots", str(slots),
            "--layers", "1", "--repeats", "0"]
    assert main(argv) == 0, f"{data}\n{capsys.readouterr().out[-2000:]}"
    assert "0 fail, " in capsys.readouterr().out


@pytest.mark.parametrize("lens, field", [("batch_size = 4096\nkv_len = 1024", "batch_size + kv_len"),
                                         (f"kv_lens = {[1024] * 4096}", "kv_lens")])
def test_a_scenario_too_big_for_memory_is_named_by_its_file_and_field(tmp_path, capsys, monkeypatch, lens, field):
    """On the CPU the pool grows to fit the scenario; when that pool does not fit memory the error named no file or
    field ('memory plan: ...') and offered the largest pool that fits as --slots, a pool the scenario does not fit in;
    then it named kv_lens for a file that gave batch_size + kv_len: the field is the one the file has."""
    from harness.inputs import memory

    monkeypatch.setattr(memory, "free_bytes", lambda device: 4 * memory.GIB)
    path = tmp_path / "big.toml"
    path.write_text(f'name = "big"\n{lens}\n')  # 4,194,304 slots: 4.75 GiB of pool in host memory
    out = tmp_path / "out.json"
    assert main(["run", "--device", "cpu", "--scenario-file", str(path), "--repeats", "0", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: {field}: needs ") and "--slots" not in err, err
    assert "fewer than the 4,194,304 it needs" in err and not out.exists()


def test_a_model_of_fewer_layers_than_the_scale_runs_all_of_them(tmp_path, capsys, monkeypatch):
    """A one-layer model on the CPU's ci scale (2 layers) was refused with '--layers: must be <= 1 ..., got 2' although
    no --layers was given; now it runs its one layer (an explicit --layers 2 is still refused)."""
    one = presets.ModelPreset("one-layer", num_layers=1, num_heads_total=16, tp=1, qk_nope_head_dim=128, page_size=16)
    monkeypatch.setitem(presets.PRESETS, one.name, one)
    path = tmp_path / "s.toml"
    path.write_text(_toml({"name": "tiny", "kv_lens": [1, 17, 5]}))
    argv = ["run", "--device", "cpu", "--scenario-file", str(path), "--preset", one.name, "--repeats", "0"]
    assert main(argv) == 0, capsys.readouterr().err
    assert "(16,384 slots, 1 layers)" in capsys.readouterr().out
    assert main([*argv, "--layers", "2"]) == 2 and "--layers: must be <= 1" in capsys.readouterr().err


@pytest.mark.parametrize("rank", [256, 128])
def test_a_preset_of_another_kv_lora_rank_is_refused_where_it_is_declared(rank):
    """Every strategy, the output contract and FlashInfer's MLA decode take 512 channels: a preset of another rank
    is one error naming the preset and field when declared (before: every strategy's verdict an error at run time)."""
    fields = dict(num_layers=2, num_heads_total=16, tp=1, qk_nope_head_dim=128, page_size=16)
    with pytest.raises(HarnessError, match=rf"^preset narrow: kv_lora_rank: must be 512 .*got {rank}$"):
        presets.ModelPreset("narrow", kv_lora_rank=rank, **fields)
    assert presets.ModelPreset("wide", kv_lora_rank=512, **fields).row_width == 576  # twin
