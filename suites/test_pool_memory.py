"""Pool layout and the memory plan."""

import pytest
import torch

from harness.errors import HarnessError
from harness.memory import GIB, MemoryPlan
from harness.pool import KVPool, PoolGeometry
from harness.presets import get_preset, get_scale


def test_sglang_layout_and_restore():
    pool = KVPool(PoolGeometry(100, 2, 576), seed=1, device=torch.device("cpu"))
    buf = pool.buffers[0]
    assert buf.shape == (101, 1, 576) and buf.dtype == torch.uint8
    assert pool.fp8(1).dtype == torch.float8_e4m3fn and pool.fp8(1).shape == (101, 1, 576)
    before = buf.clone()
    pool.write(0, torch.tensor([5, 100]), torch.zeros(2, 576, dtype=torch.uint8))
    assert not torch.equal(buf, before)
    pool.restore([5, 100])
    assert torch.equal(buf, before)


def test_prod_geometry_matches_design():
    preset, scale = get_preset("glm5-tp8"), get_scale("prod")
    g = PoolGeometry(scale.slots, scale.layers_for(preset), preset.row_width)
    assert g.rows == 495_553 and g.num_layers == 78
    assert abs(g.total_bytes / 1e9 - 22.3) < 0.05  # 22.3 GB of FP8
    assert abs(g.total_bytes * 2 / 1e9 - 44.6) < 0.1  # the shadow's BF16 copy
    assert preset.heads_per_rank == 8 and abs(preset.sm_scale - 1 / 16) < 1e-12
    ds = get_preset("deepseek-v3-tp8")
    assert ds.heads_per_rank == 16 and ds.num_layers == 61 and abs(ds.sm_scale - 192**-0.5) < 1e-12


def test_memory_plan_refuses_with_required_available_and_largest_fit():
    plan = MemoryPlan((("fp8 pool", 20 * GIB), ("shadow", 40 * GIB)), bytes_per_slot=130_000, slots=495_552)
    with pytest.raises(HarnessError) as info:
        plan.check(torch.device("cuda"), available=30 * GIB)
    msg = str(info.value)
    assert "needs 60.00 GiB" in msg and "30.00 GiB free" in msg and "largest pool that fits" in msg
    assert 0 < plan.largest_slots(30 * GIB) < 495_552
    plan.check(torch.device("cpu"), available=100 * GIB)


def test_bad_overrides():
    with pytest.raises(HarnessError, match="--slots"):
        get_scale("ci", slots=0)
    with pytest.raises(HarnessError, match="--layers"):
        get_scale("ci", num_layers=-1)
