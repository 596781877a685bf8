"""The asv benchmark files on CUDA, without asv: benchmarks.py's setup_cache at production scale over its CUDA default
of every preset the checkout declares (one scenario, a few samples), and each benchmark's setup reading its samples
back, as `asv continuous` on a GPU runner does."""

import json

import pytest
import torch

from harness.spec.presets import PRESETS
from suites.helpers import fresh_asv_module
from suites.plugins.pool_groups import SharedPreparedCase

pytestmark = [pytest.mark.gpu, pytest.mark.prod]
SCENARIO, REPEATS = "b1-l500", 3


def test_setup_cache_times_every_preset_and_strategy_on_cuda(gpu_device, monkeypatch):
    monkeypatch.setattr(SharedPreparedCase, "held", None)  # the suite's last pool: setup_cache builds its own
    torch.cuda.empty_cache()
    bench = fresh_asv_module("benchmarks", monkeypatch, {"MLA_ASV_SCENARIOS": SCENARIO, "MLA_ASV_REPEATS": str(REPEATS)})
    scenarios, strategies, presets = bench.PARAMS
    assert presets == list(PRESETS) and scenarios == [SCENARIO]
    cache = bench.CastUs.setup_cache(None)
    measured = json.loads(cache)
    for preset in presets:
        case = measured[preset][SCENARIO]
        assert case["builds"] == 1, preset
        timed = [s for s in strategies if "skipped" not in case["strategies"][s]]
        assert {"stock", "fused_fp8"} <= set(timed), (preset, case["strategies"])
        for strategy in timed:
            values = case["strategies"][strategy]
            assert values["disturbed"] == {}, (preset, strategy)
            assert len(values["attn_us"]) == len(values["step_device_ms"]) == REPEATS
            assert all(v > 0 for v in values["attn_us"] + values["step_device_ms"]) and values["peak_bytes"] > 0
            clocked, before = bench.StepDeviceMs(), bench.CLOCK.now  # asv's timed calls walk the measured samples
            clocked.setup(cache, SCENARIO, strategy, preset)
            for _ in range(REPEATS):
                clocked.time_step_device(cache, SCENARIO, strategy, preset)
            assert bench.CLOCK.now - before == pytest.approx(sum(values["step_device_ms"]))
            with pytest.raises(RuntimeError, match=f"sample {REPEATS + 1} of {REPEATS}"):
                clocked.time_step_device(cache, SCENARIO, strategy, preset)
