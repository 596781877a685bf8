"""The model-shaped step on a CUDA GPU: FP8 GEMM dispatch, the routed-expert kernel, graph replay
equal to the eager step, stock == gather_cast inside the model, the all-reduce stand-in's latency."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="TRITON_INTERPRET=1: these tests need compiled kernels"),
]


def test_fp8_gemm_dispatch_picks_an_fp8_kernel_that_matches_emulation():
    from harness.tpot.fp8 import CANDIDATES, FP8Weight, _probe_ok, bind_kernel, quantize_blocks

    q, scale = quantize_blocks(torch.randn(2048 + 576, 6144, device="cuda") / 80)
    w = FP8Weight(q, scale)
    bind_kernel(w, 32, {})
    print(f"fused q_a/kv_a GEMM at batch 32 runs on: {w.kernel}")
    assert _probe_ok(w, CANDIDATES[w.kernel], 32)
    wrong = lambda x: CANDIDATES[w.kernel](FP8Weight(x.q, x.scale * 1.5))  # noqa: E731
    assert not _probe_ok(w, wrong, 32)  # the probe catches a wrongly scaled kernel
    if w.kernel == "bf16":
        pytest.xfail("no FP8 scaled_mm variant passed on this GPU/torch: BF16 fallback (2x weight bytes)")


def test_expert_kernel_matches_cpu_path():
    from harness.tpot.fp8 import quantize_blocks
    from harness.tpot.moe import RoutedExperts

    gen = torch.Generator().manual_seed(0)
    blocks = [quantize_blocks(torch.randn(512, 1024, generator=gen) / 32) for _ in range(8)]
    downs = [quantize_blocks(torch.randn(1024, 256, generator=gen) / 16) for _ in range(8)]
    ex = RoutedExperts(torch.stack([b[0] for b in blocks]), torch.stack([b[1] for b in blocks]),
                       torch.stack([d[0] for d in downs]), torch.stack([d[1] for d in downs]))
    x = torch.randn(4, 1024, generator=gen).to(torch.bfloat16)
    ids = torch.tensor([[0, 3], [7, 7], [1, 2], [5, 0]])
    w = torch.rand(4, 2, generator=gen)
    cpu = ex(x, w, ids)
    gpu_ex = RoutedExperts(ex.w13.cuda(), ex.s13.cuda(), ex.w2.cuda(), ex.s2.cuda())
    got = gpu_ex(x.cuda(), w.cuda(), ids.cuda()).cpu()
    assert gpu_ex.kernel == "triton_moe_gemv"
    assert ((got.float() - cpu.float()).abs() <= cpu.float().abs() / 32 + 2e-2).all()
    wrong = gpu_ex(x.cuda(), w.cuda(), ids.flip(0).cuda()).cpu()
    assert not ((wrong.float() - cpu.float()).abs() <= cpu.float().abs() / 32 + 2e-2).all()


@pytest.fixture(scope="module")
def ctx():
    from harness.inputs.cases import Case
    from harness.spec.presets import get_preset, get_scale
    from harness.spec.scenario import load_scenario
    from harness.tpot.allreduce import AllReduce
    from harness.tpot.config import load_shape
    from harness.tpot.tpot import build_context

    case = Case(get_preset("glm5-tp8"), get_scale("prod", slots=262_144, num_layers=3), load_scenario("b32-l4096"))
    return build_context(case, load_shape("glm5-tp8", shrink=True), torch.device("cuda"), "auto", 2, AllReduce())


def _run(ctx, name, graph: bool):
    from harness.execute.decode import DecodeSession
    from harness.strategies import REGISTRY
    from harness.tpot.step import ModelStep
    from harness.tpot.tpot import hidden_states

    s = REGISTRY[name](ctx.pool, ctx.backend, ctx.case.preset)
    last = ctx.schedule.steps[-1]
    slots = ctx.data.steps[last.step].slots
    hidden = hidden_states(ctx.shape, last.batch_size, 0, ctx.device)
    with DecodeSession(s, ctx.schedule, ctx.data):
        model = ModelStep(ctx.shape, ctx.weights, s, ctx.allreduce, last.batch_size)
        eager = model.forward(hidden, s.begin_step(last), last, slots, record_layers={0}).cpu()
        if not graph:
            return model, eager, None
        plan, g, logits = model.capture(hidden, last, slots)
        s.replan_step(plan, last)
        g.replay()
        replayed = logits.cpu()
        same_plan_eager = model.forward(hidden, plan, last, slots).cpu()  # the graph's plan, launched eagerly
        return model, same_plan_eager, replayed


def test_graph_replay_equals_eager_step(ctx):
    _, eager, replayed = _run(ctx, "gather_cast", graph=True)
    assert torch.isfinite(eager.float()).all()
    assert torch.equal(eager, replayed)


def test_stock_and_gather_cast_attention_bitwise_in_the_model(ctx):
    stock, logits_s, _ = _run(ctx, "stock", graph=False)
    gather, logits_g, _ = _run(ctx, "gather_cast", graph=False)
    assert torch.equal(stock.attn_outputs[0][0], gather.attn_outputs[0][0])
    assert torch.equal(logits_s, logits_g)


def test_latency_stand_in_lasts_the_table_latency():
    from harness.measure.timing import event_time_ms
    from harness.tpot.allreduce import LatencyAllReduce, LatencyTable

    table = LatencyTable("test", (1024, 1 << 20), (20.0, 60.0))
    ar = LatencyAllReduce(table, torch.device("cuda"))
    t = torch.ones(512, dtype=torch.bfloat16, device="cuda")  # 1 KiB: 20 µs
    ms = sorted(event_time_ms(lambda: [ar(t) for _ in range(50)], 10))[5]
    assert 0.8 * 50 * 20e-3 < ms < 1.3 * 50 * 20e-3, ms


def test_kernel_breakdown_sees_the_steps_kernels(ctx):
    from harness.execute.decode import DecodeSession
    from harness.strategies import REGISTRY
    from harness.tpot.step import ModelStep
    from harness.tpot.tpot import hidden_states, kernel_breakdown

    s = REGISTRY["native_fp8"](ctx.pool, ctx.backend, ctx.case.preset)
    last = ctx.schedule.steps[-1]
    with DecodeSession(s, ctx.schedule, ctx.data):
        model = ModelStep(ctx.shape, ctx.weights, s, ctx.allreduce, last.batch_size)
        plan = s.begin_step(last)
        hidden = hidden_states(ctx.shape, last.batch_size, 0, ctx.device)
        prof = kernel_breakdown(lambda: model.forward(hidden, plan, last, ctx.data.steps[last.step].slots))
    assert prof["kernel_ms"] > 0 and prof["launches"] >= 10 * ctx.shape.num_layers, prof


@pytest.mark.parametrize("batch", [1, 32])
def test_fp8_kernels_chosen_in_a_child_include_the_unaligned_shared_down(batch, monkeypatch):
    """GLM-5 TP8's shared-expert down_proj (K = 256: 2 K-blocks, padded to 4 for cuBLAS) and q_a/kv_a:
    kernels are probed in a child process (no probe kernel in this one) and match emulation here."""
    from harness.tpot import fp8

    monkeypatch.setattr(fp8, "_probe_ok", lambda *a: pytest.fail("probe ran in the measuring process"))
    ws = [fp8.FP8Weight(*fp8.quantize_blocks(torch.randn(n, k, device="cuda") * k ** -0.5)) for n, k in ((6144, 256), (2624, 6144))]
    note = fp8.bind_kernels(ws, batch)
    print(f"batch {batch}: {[(tuple(w.q.shape), w.kernel) for w in ws]} ({note})")
    monkeypatch.undo()
    for w in ws:
        x = torch.randn(batch, w.q.shape[1], device="cuda").to(torch.bfloat16)
        got = w(x).float()
        torch.cuda.synchronize()
        want = x.float() @ fp8.dequantize_blocks(w.q, w.scale).t()
        assert got.shape == want.shape and ((got - want).norm() / want.norm()) < 0.08 or w.kernel == "scaled_mm_rowwise"
