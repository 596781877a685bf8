"""Pool layout and the memory plan."""

import math

import pytest
import torch

from harness.errors import HarnessError
from harness.inputs.memory import GIB, MemoryPlan
from harness.inputs.pool import KVPool, PoolGeometry, geometry_for
from harness.spec import synth
from harness.spec.presets import get_preset, get_scale


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


def test_paged_layout_first_page_zero():
    pool = KVPool(PoolGeometry(128, 1, 576, page_size=64, index_k_bytes=132), seed=2, device=torch.device("cpu"))
    buf = pool.buffers[0].view(192, 576)
    assert buf.shape[0] == 128 + 64 and not buf[:64].any()
    assert torch.equal(buf[64:], synth.kv_codes(2, 0, range(64, 192), 0, 576))
    assert pool.index_k[0].shape == ((128 + 64 + 1) // 64, 64 * 132) and not pool.index_k[0].any()


def test_partial_last_page_is_rows_but_never_handed_out():
    g = PoolGeometry(100, 1, 576, page_size=64, index_k_bytes=132)
    assert g.rows == 164 and g.index_k_pages == (100 + 64 + 1) // 64


def test_prod_geometry_matches_sglang():
    preset, scale = get_preset("glm5-tp8"), get_scale("prod")
    g = geometry_for(preset, scale.slots, scale.layers_for(preset))
    assert g.rows == 495_552 + 64 and g.num_layers == 78 and g.index_k_pages == 7_744
    assert abs(g.kv_bytes / 1e9 - 22.27) < 0.005  # 22.3 GB of FP8 KV rows (20.74 GiB)
    assert round(g.total_bytes / GIB, 2) == 25.49  # plus the DSA index-K cache: SGLang's (and the articles') pool size
    assert abs(g.kv_bytes * 2 / 1e9 - 44.5) < 0.1  # the shadow's BF16 copy
    assert preset.heads_per_rank == 8 and abs(preset.sm_scale - 1 / 16) < 1e-12
    ds = get_preset("deepseek-v3-tp8")
    assert ds.heads_per_rank == 16 and ds.num_layers == 61 and ds.page_size == 1 and ds.index_k_bytes == 0
    mscale = 0.1 * math.log(40) + 1
    assert abs(ds.sm_scale - 192**-0.5 * mscale**2) < 1e-15 and abs(ds.sm_scale - 0.135234) < 1e-6


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


def test_memory_plan_counts_the_step_inputs_and_the_outputs_each_strategy_keeps():
    """65,536 one-token DeepSeek-V3 requests (16 heads): a 0.07 GiB pool, but every step's queries (2.3 GiB over 2
    layers) and the checked outputs each strategy's result keeps (2.0 GiB a strategy) are what fill memory: the
    run peaked at 15.2 GB of host memory on a plan of 0.21 GiB. The plan counts them, so a case like it on a smaller
    machine is one line before any work, not a memory kill."""
    from harness.execute.prepared import PreparedCase
    from harness.inputs.cases import Case
    from harness.spec.scenario import parse_scenario

    scenario = parse_scenario({"name": "x", "batch_size": 65_536, "kv_len": 1}, "x.toml")
    case = Case(get_preset("deepseek-v3-tp8"), get_scale("ci", 65_536), scenario)
    plan = PreparedCase(case, torch.device("cpu"), "torch").memory_plan(["stock", "native_fp8"])
    with pytest.raises(HarnessError, match="step inputs"):
        plan.check(torch.device("cpu"), available=4 * GIB)
    items = dict(plan.items)
    assert items["step inputs"] == 65_536 * (2 * (16 * 576 * 2 + 576) + 8)  # 2 layers' queries and new rows, the slots
    assert items["checked outputs kept"] == 2 * 2 * 65_536 * 16 * (512 * 2 + 4)  # 2 strategies x 2 layers: bf16 out, fp32 lse
    with pytest.raises(HarnessError) as info:
        plan.check(torch.device("cpu"), available=4 * GIB)
    assert "4.00 GiB free (95% of it usable)" in str(info.value) and "fewer requests, steps or --layers" in str(info.value)


def test_cuda_free_memory_counts_what_this_processs_allocator_holds_unused(monkeypatch):
    """mem_get_info says what no process holds; torch's cache of freed blocks is this process's to reuse (on an H100
    a second GLM-5 prod case in one pytest process was refused with 51.9 GiB 'free' while ~27 GiB sat in the cache)."""
    import torch

    from harness.inputs.memory import free_bytes

    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (52 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 30 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 3 * gib)
    assert free_bytes(torch.device("cuda", 0)) == 79 * gib


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_free_memory_is_measured_after_unreachable_cycles_are_collected(monkeypatch, device):
    """A pool kept only by a reference cycle (an earlier run's frames, kept by an import) is free once collected: the
    plan collects before it measures, or the next case is refused for memory nothing can reach."""
    import gc
    import weakref

    import torch

    from harness.inputs.memory import free_bytes

    if device == "cuda":  # measured through the same calls on a CPU-only machine
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (0, 0))
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 0)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 0)

    class Run:  # a run's frame stand-in: it holds the pool and is held by its own cycle
        pass

    run = Run()
    run.pool, run.self = torch.empty(1), run
    pool = weakref.ref(run.pool)
    del run
    gc.disable()  # no collection but the one under test
    try:
        free_bytes(torch.device(device))
        assert pool() is None, "free_bytes measured while an unreachable pool still held its memory"
    finally:
        gc.enable()
