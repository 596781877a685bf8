"""The model-shaped decode step on CPU: shapes as data, FP8 blocks, routing, experts, strategies' attention."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.errors import CheckFailed, HarnessError
from harness.execute.decode import DecodeSession
from harness.inputs.cases import Case
from harness.spec.faults import Fault
from harness.spec.presets import get_preset, get_scale
from harness.spec.scenario import load_scenario
from harness.strategies import REGISTRY
from harness.tpot import bytes as nbytes
from harness.tpot.allreduce import AllReduce
from harness.tpot.config import load_shape
from harness.tpot.fp8 import FP8Weight, _bf16, _probe_ok, bind_kernel, dequantize_blocks, quantize_blocks
from harness.tpot.moe import RoutedExperts, _silu_mul, naive_route, route
from harness.tpot.step import ModelStep
from harness.tpot.tpot import build_context, hidden_states

# ---- shapes as data -------------------------------------------------------------------------


def test_glm5_rank_shapes_from_toml():
    s = load_shape("glm5-tp8")
    assert (s.hidden_size, s.num_layers, s.first_k_dense, s.heads, s.q_lora_rank) == (6144, 78, 3, 8, 2048)
    assert (s.moe_inter, s.dense_inter, s.vocab, s.n_routed_experts, s.num_experts_per_tok) == (256, 1536, 19360, 256, 8)
    d = load_shape("deepseek-v3-tp8")
    assert (d.hidden_size, d.num_layers, d.heads, d.q_lora_rank, d.v_head_dim, d.vocab) == (7168, 61, 16, 1536, 128, 16160)
    for name in ("glm5-tp8", "deepseek-v3-tp8"):  # the attention shape is the preset's own, never a copy
        shape, preset = load_shape(name), get_preset(name)
        assert (shape.preset, shape.heads, shape.kv_a_width, shape.num_layers) == (preset, preset.heads_per_rank, preset.row_width, preset.num_layers)
    assert load_shape("glm5-tp8", shrink=True).num_layers == 3


def test_glm5_full_rank_weights_are_about_93_gb():
    full = nbytes.full_rank_weight_bytes(load_shape("glm5-tp8"))
    assert 90e9 < full < 97e9, full  # ~744B params / 8 ranks in FP8, plus BF16 embedding/lm_head shards


@pytest.mark.parametrize("bad, field", [("hidden_size = 6000", "hidden_size"), ("tp = 3", "declared by preset"),
                                        ("num_heads = 64", "num_heads"), ("num_layers = 78", "declared by preset"), ("bogus = 1", "bogus"),
                                        ("moe_inter = 5", "moe_inter: unknown field")])
def test_bad_model_toml_names_file_and_field(tmp_path, bad, field):
    text = (nbytes.__file__.rsplit("/", 1)[0] + "/models.toml")
    src = open(text).read().split("[deepseek-v3-tp8]")[0]
    key = bad.split(" = ")[0]
    lines = [l for l in src.splitlines() if not l.startswith(f"{key} =")] + [bad]
    path = tmp_path / "m.toml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(HarnessError) as err:
        load_shape("glm5-tp8", path=path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_unchanged_model_toml_copy_loads(tmp_path):  # twin of the test above: the mutation is what fails
    path = tmp_path / "m.toml"
    path.write_text(open(nbytes.__file__.rsplit("/", 1)[0] + "/models.toml").read())
    assert load_shape("glm5-tp8", path=path) == load_shape("glm5-tp8")


def _models_toml(tmp_path, table: str, line: str):
    """A copy of models.toml with `line` (key = value) set in [table]."""
    from harness.tpot.config import MODELS_FILE

    head, header, rest = MODELS_FILE.read_text().partition(f"[{table}]\n")
    body, after, tail = rest.partition("\n[")
    key = line.split(" = ")[0]
    body = "\n".join([x for x in body.splitlines() if not x.startswith(f"{key} =")] + [line])
    path = tmp_path / "m.toml"
    path.write_text(head + header + body + after + tail + "\n")
    return path


@pytest.mark.parametrize("table, line, message", [
    ("glm5-tp8", 'routed_scaling_factor = "x"', "Expected `float`, got `str`"),  # was ValueError from float()
    ("glm5-tp8", "routed_scaling_factor = nan", "Expected `float` > 0.0"),
    ("glm5-tp8", "routed_scaling_factor = inf", "Expected `float` <= 1e+300"),
    ("glm5-tp8", "architecture = 5", "Expected `str`, got `int`"),
    ("glm5-tp8", 'hidden_size = "6144"', "Expected `int`, got `str`"),  # was taken under --shrink ([shrink] replaced it)
    ("glm5-tp8", "topk_group = 0", "Expected `int` >= 1"),
    ("shrink", "hidden_size = 200", "must divide by 128"),  # was named [glm5-tp8].hidden_size
    ("shrink", 'num_layers = "3"', "Expected `int`, got `str`"),
    ("shrink", "n_routed_experts = true", "Expected `int`, got `bool`"),
])
@pytest.mark.parametrize("shrink", [False, True])
def test_model_toml_fields_are_checked_each_named_in_its_own_table(tmp_path, table, line, message, shrink):
    """Each field of both tables is type- and bound-checked, with --shrink or not: one error naming the file and
    [table].field (before: a traceback, NaN or an int architecture taken, a [shrink] value's error named the preset's
    table, a preset's value [shrink] replaces never checked). Twin: an integer routed_scaling_factor is a float."""
    path = _models_toml(tmp_path, table, line)
    with pytest.raises(HarnessError) as err:
        load_shape("glm5-tp8", shrink=shrink, path=path)
    assert str(err.value) == f"{path}: [{table}].{line.split(' = ')[0]}: {message}"
    shape = load_shape("glm5-tp8", shrink=shrink, path=_models_toml(tmp_path, "glm5-tp8", "routed_scaling_factor = 2"))
    assert shape.routed_scaling_factor == 2.0 and isinstance(shape.routed_scaling_factor, float)


# ---- FP8 block weights ----------------------------------------------------------------------


def test_block_quantization_round_trip_and_cpu_gemm():
    w = torch.randn(384, 256, generator=torch.Generator().manual_seed(1)) * 0.05
    q, scale = quantize_blocks(w)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (3, 2)
    assert (dequantize_blocks(q, scale) - w).abs().max() < 0.05 * w.abs().max()
    weight = FP8Weight(q, scale)
    bind_kernel(weight, 2, {})
    assert weight.kernel == "bf16" and weight.nbytes_read == 384 * 256 * 2
    assert _probe_ok(weight, _bf16, 2)


def test_probe_rejects_a_kernel_with_wrong_scales():
    q, scale = quantize_blocks(torch.randn(256, 256, generator=torch.Generator().manual_seed(2)))
    wrong = lambda w: _bf16(FP8Weight(w.q, w.scale * 1.5))  # noqa: E731
    assert not _probe_ok(FP8Weight(q, scale), wrong, 2)


# ---- MoE ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_group, topk_group", [(1, 1), (8, 4)])
def test_routing_matches_naive_reference(n_group, topk_group):
    gen = torch.Generator().manual_seed(3)
    logits, bias = torch.randn(16, 64, generator=gen), torch.randn(64, generator=gen) * 0.1
    w, ids = route(logits, bias, 8, n_group, topk_group, 2.5)
    w_ref, ids_ref = naive_route(logits, bias, 8, n_group, topk_group, 2.5)
    assert torch.equal(ids.sort(-1).values, ids_ref.sort(-1).values)
    assert torch.allclose(w.gather(1, ids.argsort(-1)), w_ref.gather(1, ids_ref.argsort(-1)).float(), rtol=1e-5)


def test_routing_without_correction_bias_is_caught():
    gen = torch.Generator().manual_seed(3)
    logits, bias = torch.randn(16, 64, generator=gen), torch.randn(64, generator=gen) * 0.5
    _, ids = route(logits, torch.zeros(64), 8, 8, 4, 2.5)  # planted fault: the bias is dropped
    _, ids_ref = naive_route(logits, bias, 8, 8, 4, 2.5)
    assert not torch.equal(ids.sort(-1).values, ids_ref.sort(-1).values)


def _experts(seed=4, e=6, h=256, inter=128):
    gen = torch.Generator().manual_seed(seed)
    blocks = [quantize_blocks(torch.randn(2 * inter, h, generator=gen) / 16) for _ in range(e)]
    downs = [quantize_blocks(torch.randn(h, inter, generator=gen) / 11) for _ in range(e)]
    return RoutedExperts(torch.stack([b[0] for b in blocks]), torch.stack([b[1] for b in blocks]),
                         torch.stack([d[0] for d in downs]), torch.stack([d[1] for d in downs]))


def _dense_moe_reference(ex, x, weights, ids):
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            w13 = dequantize_blocks(ex.w13[e], ex.s13[e]).to(torch.bfloat16)
            w2 = dequantize_blocks(ex.w2[e], ex.s2[e]).to(torch.bfloat16)
            out[t] += weights[t, j] * (_silu_mul(x[t : t + 1] @ w13.t()) @ w2.t())[0].float()
    return out.to(torch.bfloat16)


def test_routed_experts_match_dense_reference():
    ex = _experts()
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    ids, weights = torch.tensor([[0, 5], [2, 2], [4, 1]]), torch.tensor([[0.7, 0.3], [0.5, 0.5], [0.9, 0.1]])
    assert torch.equal(ex(x, weights, ids), _dense_moe_reference(ex, x, weights, ids))
    assert ex.bytes_per_expert == 3 * 128 * 256 + (2 * 2 + 2 * 1) * 4


def test_routed_experts_with_wrong_expert_are_caught():
    ex = _experts()
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    ids, weights = torch.tensor([[0, 5], [2, 2], [4, 1]]), torch.tensor([[0.7, 0.3], [0.5, 0.5], [0.9, 0.1]])
    wrong = ids.clone()
    wrong[2, 1] = 3  # planted fault: one pair reads the wrong expert
    assert not torch.equal(ex(x, weights, wrong), _dense_moe_reference(ex, x, weights, ids))


# ---- the step with the strategies' attention ------------------------------------------------


@pytest.fixture(scope="module")
def tiny_ctx():
    case = Case(get_preset("glm5-tp8"), get_scale("ci", slots=2048, num_layers=2), load_scenario("b1-l500"))
    return build_context(case, load_shape("glm5-tp8", shrink=True), torch.device("cpu"), "torch", 2, AllReduce())


def test_a_shape_of_another_preset_is_refused():
    case = Case(get_preset("deepseek-v3-tp8"), get_scale("ci", slots=2048, num_layers=2), load_scenario("b1-l500"))
    with pytest.raises(HarnessError, match=r"^--preset: the model shape is glm5-tp8's, the case is deepseek-v3-tp8's"):
        build_context(case, load_shape("glm5-tp8", shrink=True), torch.device("cpu"), "torch", 2, AllReduce())


def test_rotation_check_fails_when_rotated_and_distinct_are_one_workload(monkeypatch):
    """The check times the rotated step against one whose every layer reads its own weights. Negative control: a
    planted fault that makes the distinct weights with the rotated count (the cap that made both one workload) fails
    it, CheckFailed, before anything is timed. Twin: unplanted, the distinct step reads 2 x layers sets, the rotated fewer."""
    from harness.tpot import tpot

    case = Case(get_preset("glm5-tp8"), get_scale("ci", slots=2048, num_layers=2), load_scenario("b1-l500"))
    ctx = build_context(case, load_shape("glm5-tp8", shrink=True), torch.device("cpu"), "torch", 1, AllReduce())
    out = tpot.rotation_check(ctx, "stock", 1)
    assert out["sets_read"] == {"rotated": 3, "distinct": 4} and out["distinct_ms"] > 0
    make = tpot.make_weights
    monkeypatch.setattr(tpot, "make_weights", lambda shape, sets, seed, device: make(shape, min(sets, ctx.weight_sets), seed, device))
    monkeypatch.setattr(tpot, "time_strategy", lambda *a, **k: pytest.fail("timed a check that cannot fail"))
    with pytest.raises(CheckFailed, match="reads 3 weight sets and the distinct one 3 .*one workload timed twice"):
        tpot.rotation_check(ctx, "stock", 1)


def _layer0_attention(ctx, name, faults=frozenset()):
    strategy = REGISTRY[name](ctx.pool, ctx.backend, ctx.case.preset, faults)
    last = ctx.schedule.steps[-1]
    hidden = hidden_states(ctx.shape, last.batch_size, 0, ctx.device)
    with DecodeSession(strategy, ctx.schedule, ctx.data):
        model = ModelStep(ctx.shape, ctx.weights, strategy, ctx.allreduce, last.batch_size)
        logits = model.forward(hidden, strategy.begin_step(last), last, ctx.data.steps[last.step].slots, record_layers={0})
    return model, logits


def test_model_step_layer0_attention_gather_cast_equals_stock_bitwise(tiny_ctx):
    stock, logits = _layer0_attention(tiny_ctx, "stock")
    gather, logits_g = _layer0_attention(tiny_ctx, "gather_cast")
    assert logits.shape == (1, tiny_ctx.shape.vocab) and torch.isfinite(logits.float()).all()
    for a, b in zip(stock.attn_outputs[0], gather.attn_outputs[0]):
        assert torch.equal(a, b)
    assert torch.equal(logits, logits_g)
    assert stock.kernels["routed_experts"] == "torch_per_pair_bf16" and stock.kernels["gemm:qkv_a"] == "bf16"
    assert len(stock.last_expert_ids[1].unique()) == tiny_ctx.shape.num_experts_per_tok


def test_model_step_gather_cast_off_by_one_differs_from_stock(tiny_ctx):
    stock, _ = _layer0_attention(tiny_ctx, "stock")
    broken, _ = _layer0_attention(tiny_ctx, "gather_cast", frozenset({Fault.REMAP_OFF_BY_ONE}))
    assert not torch.equal(stock.attn_outputs[0][0], broken.attn_outputs[0][0])


def test_pool_holds_the_models_kv_row_after_the_step(tiny_ctx):
    """The KV written is the model's kv_a output in e4m3 (not the harness's synthetic row)."""
    strategy = REGISTRY["stock"](tiny_ctx.pool, tiny_ctx.backend, tiny_ctx.case.preset)
    last = tiny_ctx.schedule.steps[-1]
    slots = tiny_ctx.data.steps[last.step].slots
    with DecodeSession(strategy, tiny_ctx.schedule, tiny_ctx.data):
        model = ModelStep(tiny_ctx.shape, tiny_ctx.weights, strategy, tiny_ctx.allreduce, last.batch_size)
        model.forward(hidden_states(tiny_ctx.shape, last.batch_size, 0, tiny_ctx.device), strategy.begin_step(last), last, slots)
        written = tiny_ctx.pool.buffers[0].view(tiny_ctx.pool.geometry.rows, -1)[slots]
        synthetic = tiny_ctx.data.new_rows[(last.step, 0)]
        assert not torch.equal(written, synthetic)
        ckv = written[:, :512].view(torch.float8_e4m3fn).float()
        assert 0.5 < ckv.pow(2).mean().sqrt() < 2.0  # an RMS-normed compressed KV


def test_step_bytes_count_active_experts_once(tiny_ctx):
    s = tiny_ctx.shape
    last = tiny_ctx.schedule.steps[-1]
    ids = {1: torch.tensor([[0, 1, 2, 3]])}
    twice = {1: torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]])}
    one = nbytes.step_bytes(s, ids, REGISTRY["native_fp8"], tiny_ctx.pool.geometry, last)
    assert one.weights == nbytes.step_bytes(s, twice, REGISTRY["native_fp8"], tiny_ctx.pool.geometry, last).weights
    expected = nbytes.lm_head_bytes(s) + 2 * nbytes.attn_weight_bytes(s) + nbytes.mlp_bytes(s.hidden_size, s.dense_inter) \
        + nbytes.moe_fixed_bytes(s) + 4 * nbytes.expert_bytes(s)
    assert one.weights == expected and one.cast == 0
    stock = nbytes.step_bytes(s, ids, REGISTRY["stock"], tiny_ctx.pool.geometry, last)
    writes = 2 * last.batch_size * 576  # the new token's FP8 row, both layers
    assert stock.cast == 2 * tiny_ctx.pool.geometry.layer_bytes * 3 and stock.kv - writes == 2 * (one.kv - writes)


def test_reuse_distance_glm5_prod_exceeds_l2_several_times():
    s = load_shape("glm5-tp8")
    assert nbytes.reuse_distance_bytes(s, 4, 8) > 3 * nbytes.L2_BYTES
    assert nbytes.reuse_distance_bytes(s, 1, 8) == 0  # one set: every layer re-reads the same weights
    assert dataclasses.replace(s).with_layers(2).first_k_dense == 2


# ---- FP8 block-scaled GEMM: cuBLAS's scale layout (the H200 rotation-check crash) ----------


def _cublas_rule(a, scale_a, b, scale_b) -> str | None:
    """cuBLASLt's layout for 1x128 x 128x128 block scaling, restated from its docs (independent of
    fp8.block_layout_error): A [M, K] scales [M, K/128] stride (1, M); B [K, N] scales
    [round_up(K/128, 4), N/128] stride (1, round_up(K/128, 4)). Anything else is read out of bounds."""
    m, k = a.shape
    n = b.shape[1]
    kb, nb = -(-k // 128), -(-n // 128)
    kb4 = -(-kb // 4) * 4
    if tuple(scale_a.shape) != (m, kb) or (kb > 1 and scale_a.stride() != (1, m)):
        return f"scale_a {tuple(scale_a.shape)} {scale_a.stride()}"
    if tuple(scale_b.shape) != (kb4, nb) or (nb > 1 and scale_b.stride() != (1, kb4)):
        return f"scale_b {tuple(scale_b.shape)} {scale_b.stride()} for K = {k}"
    return None


@pytest.fixture
def fake_cublas(monkeypatch):
    """torch's two blockwise entry points replaced by a recorder that checks cuBLAS's layout."""
    import torch.nn.functional as F

    calls = []

    def record(a, b, scale_a, scale_b):
        calls.append((tuple(a.shape), tuple(b.shape), _cublas_rule(a, scale_a, b, scale_b)))
        return torch.zeros((a.shape[0], b.shape[1]), dtype=torch.bfloat16)

    monkeypatch.setattr(F, "scaled_mm", lambda a, b, sa, _ra, sb, _rb, output_dtype=None: record(a, b, sa, sb))
    monkeypatch.setattr(torch, "_scaled_mm", lambda a, b, scale_a, scale_b, out_dtype=None: record(a, b, scale_a, scale_b))
    return calls


def _launch_blockwise(n: int, k: int, batch: int, calls) -> list:
    """Each blockwise candidate on an [n, k] weight: the launches it made (refusals launch nothing)."""
    from harness.tpot.fp8 import CANDIDATES

    w = FP8Weight(torch.zeros((n, k), dtype=torch.float8_e4m3fn), torch.ones((-(-n // 128), k // 128)))
    x = torch.randn(batch, k).to(torch.bfloat16)
    launched = []
    for name in ("scaled_mm_blockwise_t", "_scaled_mm_blockwise"):
        before = len(calls)
        try:
            out = CANDIDATES[name](w)(x)
            assert out.shape == (batch, n)
        except ValueError:
            pass
        launched += [(name, *c) for c in calls[before:]]
    return launched


@pytest.mark.parametrize("model", ["glm5-tp8", "deepseek-v3-tp8"])
@pytest.mark.parametrize("batch", [1, 32])
def test_blockwise_gemm_never_launches_a_layout_cublas_reads_out_of_bounds(fake_cublas, model, batch):
    """Every FP8 linear of the model's TP8 rank: a blockwise launch always has cuBLAS's layout.
    GLM-5's shared-expert down_proj (K = 256: 2 K-blocks) was launched with unpadded scales."""
    s = load_shape(model)
    shapes = {(s.q_lora_rank + s.kv_a_width, s.hidden_size), (s.heads * (s.qk_nope_head_dim + s.qk_rope_head_dim), s.q_lora_rank),
              (s.hidden_size, s.heads * s.v_head_dim), (2 * s.dense_inter, s.hidden_size), (s.hidden_size, s.dense_inter),
              (2 * s.moe_inter, s.hidden_size), (s.hidden_size, s.moe_inter)}
    launched = [c for n, k in sorted(shapes) for c in _launch_blockwise(n, k, batch, fake_cublas)]
    assert launched and not [c for c in launched if c[-1]], launched
    shared_down = [c for c in launched if c[2][0] == s.moe_inter]
    assert [c[0] for c in shared_down] == ["scaled_mm_blockwise_t"]  # padded: the v2 entry runs it, legacy refuses


def test_unpadded_block_scales_are_caught(fake_cublas, monkeypatch):
    """Negative control: the old layout (K-blocks not padded to 4) is refused by the guard, and with
    the guard planted away the recorder flags the out-of-bounds layout."""
    from harness.tpot import fp8

    monkeypatch.setattr(fp8, "padded_block_scales", lambda w: w.scale.contiguous())  # planted: the pre-fix layout
    assert _launch_blockwise(6144, 256, 32, fake_cublas) == []  # the guard refuses both, nothing launched
    monkeypatch.setattr(fp8, "block_layout_error", lambda *a: None)  # planted: no guard either
    launched = _launch_blockwise(6144, 256, 32, fake_cublas)
    assert launched and all(c[-1] and "K = 256" in c[-1] for c in launched)


def test_probe_runs_in_a_child_and_a_dying_child_falls_back_to_safe_kernels():
    from harness.tpot import fp8

    got, note = fp8.probe_in_child([(256, 256), (256, 256), (384, 256)], 2, "cpu", names=("bf16",))
    assert got == {(256, 256): "bf16", (384, 256): "bf16"} and note == "probed in a child process"
    # planted fault: a candidate the child can't resolve kills it; the retry keeps only SAFE ones and says so
    got, note = fp8.probe_in_child([(256, 256)], 2, "cpu", names=("no_such_kernel", "bf16"))
    assert got == {(256, 256): "bf16"} and "first child died" in note and "KeyError" in note


# ---- where the time goes; memory plan --------------------------------------------------------


def test_step_parts_replace_left_out_components_with_same_shape_stand_ins(tiny_ctx):
    from harness.tpot.step import PARTS

    strategy = REGISTRY["gather_cast"](tiny_ctx.pool, tiny_ctx.backend, tiny_ctx.case.preset)
    last = tiny_ctx.schedule.steps[-1]
    hidden = hidden_states(tiny_ctx.shape, last.batch_size, 0, tiny_ctx.device)
    slots = tiny_ctx.data.steps[last.step].slots
    with DecodeSession(strategy, tiny_ctx.schedule, tiny_ctx.data):
        model = ModelStep(tiny_ctx.shape, tiny_ctx.weights, strategy, tiny_ctx.allreduce, last.batch_size)
        plan = strategy.begin_step(last)
        full = model.forward(hidden, plan, last, slots)
        for part in PARTS:
            model.parts = frozenset((part,))
            assert model.forward(hidden, plan, last, slots).shape == full.shape, part
        model.parts = frozenset(PARTS)
        assert torch.equal(model.forward(hidden, plan, last, slots), full)  # all parts: the step itself
        model.parts = frozenset(("moe",))
        assert not torch.equal(model.forward(hidden, plan, last, slots), full)  # negative control: a part is not the step
    with pytest.raises(ValueError, match="unknown step parts"):
        model.capture(hidden, last, slots, parts=("gemm", "bogus"))


def test_memory_plan_glm5_prod_shadow_does_not_fit_beside_the_weights():
    from harness.tpot.tpot import memory_plan

    full = nbytes.full_rank_weight_bytes(load_shape("glm5-tp8"))
    h200, pool, slots = 150_109_880_320, 27_369_897_984, 524_288  # H200 bytes; the prod pool bytes of the H200 run
    shadow = memory_plan("shadow", pool, slots, 2 * pool, full, h200, 4)
    stock = memory_plan("stock", pool, slots, 570_949_632, full, h200, 4)
    assert stock["fits_with_full_weights"] and not shadow["fits_with_full_weights"]
    assert "does NOT fit" in shadow["memory_plan"] and 0 < shadow["max_slots_with_full_weights"] < slots
    assert full + shadow["max_slots_with_full_weights"] * 3 * pool / slots <= h200 * 0.95
    # negative control: a plan that forgets shadow's BF16 copy says it fits
    assert memory_plan("shadow", pool, slots, 0, full, h200, 4)["fits_with_full_weights"]


def test_tpot_plans_the_strategy_buffer_before_it_allocates(monkeypatch):
    """tpot checked only the pool and rotated weights against free memory: shadow's BF16 copy of the pool (twice the
    FP8 pool) went unplanned, and a run the memory could not hold allocated past it. With room for the pool, step
    inputs and weights but not shadow's copy, shadow is refused with one 'memory plan' line naming its buffer; the
    twin, stock (no buffer), builds."""
    from harness.execute.decode import step_data_bytes
    from harness.inputs import memory
    from harness.tpot.tpot import rotated_weight_bytes

    case = Case(get_preset("glm5-tp8"), get_scale("ci", slots=2048, num_layers=2), load_scenario("b1-l500"))
    shape = load_shape("glm5-tp8", shrink=True)
    g = case.geometry
    base = (g.total_bytes + step_data_bytes(case.preset, case.schedule(), g.num_layers)
            + rotated_weight_bytes(shape.for_pool(case.num_layers), 2))
    shadow = REGISTRY["shadow"].extra_bytes(g, case.schedule())
    assert shadow > g.total_bytes  # BF16 rows: twice the FP8 pool
    monkeypatch.setattr(memory, "free_bytes", lambda device: int((base + shadow // 2) / memory.HEADROOM))
    with pytest.raises(HarnessError, match=r"^memory plan: needs .*largest strategy buffer .* GiB free"):
        build_context(case, shape, torch.device("cpu"), "torch", 2, AllReduce(), strategies=("stock", "shadow"))
    ctx = build_context(case, shape, torch.device("cpu"), "torch", 2, AllReduce(), strategies=("stock",))
    assert ctx.pool.geometry == g


def test_tpot_plans_the_rotation_checks_distinct_weights_before_it_allocates(monkeypatch):
    """rotation_check makes every layer's weights (rotated_weight_bytes over all layers) beside the rotated sets; the plan
    left them out. With room for all but half of them, check_rotation is refused with one 'memory plan' line naming
    them, before the pool is made; the twin, without the check, builds."""
    from harness.execute.decode import step_data_bytes
    from harness.inputs import memory
    from harness.tpot import tpot

    case = Case(get_preset("glm5-tp8"), get_scale("ci", slots=2048, num_layers=2), load_scenario("b1-l500"))
    shape = load_shape("glm5-tp8", shrink=True)
    pool_shape, g = shape.for_pool(case.num_layers), case.geometry
    base = g.total_bytes + step_data_bytes(case.preset, case.schedule(), g.num_layers) + tpot.rotated_weight_bytes(pool_shape, 1)
    distinct = tpot.rotated_weight_bytes(pool_shape, pool_shape.num_layers)
    monkeypatch.setattr(memory, "free_bytes", lambda device: int((base + distinct // 2) / memory.HEADROOM))
    with monkeypatch.context() as patch:
        patch.setattr(tpot, "KVPool", lambda *a, **k: pytest.fail("allocated before the plan refused"))
        with pytest.raises(HarnessError, match=r"^memory plan: needs .*distinct weights \(2 sets: --check-rotation\) .* GiB free"):
            build_context(case, shape, torch.device("cpu"), "torch", 1, AllReduce(), strategies=("stock",), check_rotation=True)
    assert build_context(case, shape, torch.device("cpu"), "torch", 1, AllReduce(), strategies=("stock",)).weight_sets == 1
