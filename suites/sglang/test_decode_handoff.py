"""SGLang's real FlashInferMLAAttnBackend hands FlashInfer exactly what the harness hands it: the plan
(token-level kv_indices/indptr, heads, sm_scale, page_size 1, BF16 q and kv, as the harness's FlashInfer
backend plans it) and, per layer, BF16 views of the WHOLE layer buffer with no KV scale (`stock`'s handoff
to its backend), cast once per layer call as `stock` casts. Both sides run against recorders instead of
FlashInfer. SGLang's FA3 backend casts the same whole layer per decode call."""

from __future__ import annotations

import inspect
import sys
import textwrap
from types import ModuleType, SimpleNamespace

import pytest
import sgl
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.backends.flashinfer import FlashInferBackend
from harness.execute import decode as decode_loop
from harness.inputs.cases import Case, load_case
from harness.inputs.pool import KVPool
from harness.inputs.reference import step_queries
from harness.spec.presets import get_preset, get_scale
from harness.spec.scenario import load_scenario
from harness.strategies import REGISTRY
from harness.strategies.sglang_backend import SGLANG_KERNEL_SM90

pytestmark = pytest.mark.sglang

SLOTS = 16_384
CAST_CASE = "glm5-tp8.ci.multistep-reuse"  # 4 steps of 2 layers: 8 forward_decode calls
WHOLE_POOL_CAST = "get_key_buffer(layer.layer_id).to(q.dtype)"


class Recorder:
    """Stands in for FlashInfer's BatchMLAPagedAttentionWrapper (SGLang) or a harness Backend."""

    def __init__(self):
        self.plans, self.runs = [], []

    def plan(self, *args, **kwargs):
        self.plans.append((args, kwargs))
        return "plan"

    def run(self, *args, **kwargs):
        self.runs.append((args, kwargs))
        q_nope = args[0] if args[0] != "plan" else args[1]
        out = kwargs.get("out")
        return out if out is not None else torch.zeros_like(q_nope)


def case_for(preset_name: str, scenario: str = "ragged-mix") -> Case:
    return Case(get_preset(preset_name), get_scale("ci", slots=SLOTS, num_layers=1), load_scenario(scenario))


class BackendRecorder(Recorder):
    """A recorder behind the harness's Backend contract: run returns (out bf16 [B, H, 512], lse fp32 [B, H])."""

    def run(self, *args, **kwargs):
        q_nope = super().run(*args, **kwargs)
        return torch.zeros_like(q_nope), torch.zeros(q_nope.shape[:2], dtype=torch.float32)


def flashinfer_plan(problem) -> dict:
    """The keyword arguments the harness's FlashInferBackend (SGLang's SM90 kernel) hands
    BatchMLAPagedAttentionWrapper.plan for `problem`: flashinfer.mla (CUDA-only) replaced by recorders."""
    wrapper, mla = Recorder(), ModuleType("flashinfer.mla")
    mla.BatchMLAPagedAttentionWrapper = lambda workspace, **kwargs: wrapper
    mla.MLAPlanMetadata = SimpleNamespace(csr=SimpleNamespace)  # the CSR arrays it is built from, as attributes
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "flashinfer", ModuleType("flashinfer"))
        mp.setitem(sys.modules, "flashinfer.mla", mla)
        mp.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
        FlashInferBackend("cpu", SGLANG_KERNEL_SM90).plan(problem)
    ((), kwargs), = wrapper.plans
    return kwargs


def scales(kwargs: dict) -> dict:
    """The scale arguments of a run call that hand one (None: no scale)."""
    return {name: value for name, value in kwargs.items() if "scale" in name and value is not None}


def harness_handoff(case: Case, strategy: str = "stock", pool: KVPool | None = None) -> dict:
    """What the harness strategy hands its backend for the first step, layer 0, planned as the harness's
    FlashInfer backend plans FlashInfer."""
    pool = pool or KVPool(case.geometry, case.scenario.seed, torch.device("cpu"))
    batch = case.schedule().steps[0]
    rec = BackendRecorder()
    s = REGISTRY[strategy](pool, rec, case.preset)
    s.setup(case.schedule())
    plan = s.begin_step(batch)
    q_nope, q_pe = step_queries(case.preset, case.scenario.seed, batch, 0)
    s.attend(plan, q_nope, q_pe, s.prepare_kv(0))
    (problem,), _ = rec.plans[0]
    plan = flashinfer_plan(problem)
    (_, q_n, q_p, ckv, kpe), kwargs = rec.runs[0]
    return dict(kv_indptr=plan["metadata"].kv_indptr.tolist(), kv_indices=plan["metadata"].kv_indices.tolist(),
                num_heads=plan["num_heads"], sm_scale=plan["sm_scale"], q_dtype=(plan["q_data_type"], q_n.dtype),
                kv_dtype=plan["kv_data_type"], page_size=plan["page_size"], scales=scales(kwargs),
                head_dims=(plan["head_dim_ckv"], plan["head_dim_kpe"]), causal=plan["causal"],
                q_nope=q_n, q_pe=q_p, ckv=ckv, kpe=kpe)


def plan_first_step(module, case: Case, wrapper) -> tuple:
    """SGLang's FlashInfer MLA backend (`module`: the released one, or a patched commit's) built without __init__
    on an SGLang pool holding the case's bytes, with the request table its scheduler keeps (token position ->
    pool slot); its decode indices updater plans the first step into `wrapper` (real call_begin_forward, real
    kv-indices kernel). Returns (backend, batch, kv_indptr)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

    preset, batch = case.preset, case.schedule().steps[0]
    pool = sgl.mla_pool(SLOTS, preset.page_size, 1, dsa=preset.index_k_bytes > 0)
    # the same pool content (byte identity of the written pools is test_pool_bytes' job)
    pool.kv_buffer[0].copy_(KVPool(case.geometry, case.scenario.seed, torch.device("cpu")).buffers[0])
    lens = torch.as_tensor(batch.kv_indptr[1:] - batch.kv_indptr[:-1], dtype=torch.int64)
    req_to_token = torch.zeros((batch.batch_size, int(lens.max())), dtype=torch.int32)
    for i in range(batch.batch_size):
        req_to_token[i, : lens[i]] = torch.as_tensor(batch.kv_indices[batch.rows_of(i)])
    backend = object.__new__(module.FlashInferMLAAttnBackend)
    backend.token_to_kv_pool = pool
    backend.kv_index_translator = KVIndexTranslator(req_to_token=req_to_token, token_to_kv_pool_allocator=None,
                                                    token_to_kv_pool=pool, page_size=preset.page_size, device="cpu")
    config = object.__new__(ModelConfig)
    config.qk_nope_head_dim, config.qk_rope_head_dim = preset.qk_nope_head_dim, preset.qk_rope_head_dim
    config._init_mla_scaling(sgl.rope_scaling(preset))
    updater = object.__new__(module.FlashInferMLAIndicesUpdaterDecode)
    updater.num_local_heads, updater.kv_lora_rank, updater.qk_rope_head_dim = preset.heads_per_rank, 512, 64
    updater.scaling, updater.data_type, updater.attn_backend = config.scaling, torch.bfloat16, backend
    kv_indptr = torch.zeros(batch.batch_size + 1, dtype=torch.int32)
    kv_indices = torch.full((int(lens.sum()),), -1, dtype=torch.int32)
    with sgl.single_rank():
        updater.call_begin_forward(
            wrapper, lens, int(lens.sum()), torch.arange(batch.batch_size + 1, dtype=torch.int32), kv_indptr,
            init_metadata_replay=True, plan=None, req_pool_indices=torch.arange(batch.batch_size),
            kv_indices=kv_indices, qo_indptr_cpu=None, kv_indptr_cpu=None, kv_len_arr_cpu=None,
        )
    return backend, batch, kv_indptr


def decode_first_layer(backend, case: Case, batch, wrapper) -> None:
    """The backend's real forward_decode of layer 0 on the step's queries, into `wrapper`."""
    preset = case.preset
    backend.forward_metadata = SimpleNamespace(decode_wrapper=wrapper)
    # the ForwardBatch fields forward_decode reads without a KV write (out_cache_loc: sglang 0.5.21 reads it first)
    forward_batch = SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: True), out_cache_loc=None)
    q_nope, q_pe = step_queries(preset, case.scenario.seed, batch, 0)
    with sgl.single_rank():
        backend.forward_decode(q_nope.reshape(batch.batch_size, -1), None, None, sgl.layer(0, preset.heads_per_rank),
                               forward_batch, save_kv_cache=False, q_rope=q_pe.reshape(batch.batch_size, -1))


def sglang_handoff(case: Case) -> dict:
    """What SGLang's FlashInfer MLA backend hands FlashInfer for the same step and layer: its decode
    indices updater plans (real call_begin_forward, real kv-indices kernel over req_to_token) and its
    real forward_decode runs, each on an object built without __init__ and with the wrapper recorded."""
    sgl.require()
    from sglang.srt.layers.attention import flashinfer_mla_backend

    wrapper = Recorder()
    backend, batch, kv_indptr = plan_first_step(flashinfer_mla_backend, case, wrapper)
    (_, _, plan_indices, _, heads, ckv_dim, kpe_dim, page_size, causal, sm_scale, q_dtype, kv_dtype), _ = wrapper.plans[0]
    decode_first_layer(backend, case, batch, wrapper)
    (q_n, q_p, ckv, kpe), kwargs = wrapper.runs[0]
    return dict(kv_indptr=kv_indptr.tolist(), kv_indices=plan_indices.tolist(), num_heads=heads, sm_scale=sm_scale,
                q_dtype=(q_dtype, q_n.dtype), kv_dtype=kv_dtype, page_size=page_size, scales=scales(kwargs),
                head_dims=(ckv_dim, kpe_dim), causal=causal, q_nope=q_n, q_pe=q_p, ckv=ckv, kpe=kpe)


def whole_layer(ckv: torch.Tensor, kpe: torch.Tensor) -> torch.Tensor:
    """The [rows, 1, 576] buffer ckv and kpe are views of (asserts they are split views of one)."""
    assert ckv.data_ptr() + ckv.shape[-1] * ckv.element_size() == kpe.data_ptr() and ckv.stride() == kpe.stride()
    return torch.as_strided(ckv, (ckv.shape[0], 1, ckv.shape[-1] + kpe.shape[-1]), ckv.stride())


def assert_same_handoff(theirs: dict, ours: dict, layer_rows: int) -> None:
    for key in ("kv_indptr", "kv_indices", "num_heads", "page_size", "causal", "head_dims", "q_dtype", "kv_dtype", "scales"):
        assert theirs[key] == ours[key], f"{key}: SGLang {theirs[key]!r} vs harness {ours[key]!r}"
    assert abs(theirs["sm_scale"] - ours["sm_scale"]) <= 1e-12 * theirs["sm_scale"], (
        f"sm_scale: SGLang {theirs['sm_scale']!r} vs harness {ours['sm_scale']!r}")
    assert torch.equal(theirs["q_nope"], ours["q_nope"]) and torch.equal(theirs["q_pe"], ours["q_pe"])
    for key in ("ckv", "kpe"):  # the 512/64 split: the whole-layer comparison below sees only the buffer both are views of
        assert theirs[key].shape == ours[key].shape, f"{key}: SGLang {tuple(theirs[key].shape)} vs harness {tuple(ours[key].shape)}"
    their_kv, our_kv = whole_layer(theirs["ckv"], theirs["kpe"]), whole_layer(ours["ckv"], ours["kpe"])
    assert their_kv.dtype == our_kv.dtype == torch.bfloat16
    assert their_kv.shape == our_kv.shape == (layer_rows, 1, 576), (their_kv.shape, our_kv.shape)
    assert torch.equal(their_kv.view(torch.int16), our_kv.view(torch.int16)), "the BF16 layer buffers differ"


PRESETS = ["glm5-tp8", "deepseek-v3-tp8"]


@pytest.mark.parametrize("preset", PRESETS)
def test_stock_hands_the_backend_what_sglang_hands_flashinfer(preset):
    case = case_for(preset)
    assert_same_handoff(sglang_handoff(case), harness_handoff(case), case.geometry.rows)


# each planted fault and the comparison's line that must name it
FAULTS = {"gather_cast": "^kv_indices: ", "page1-pool": "^the BF16 layer buffers differ", "old-sm-scale": "^sm_scale: ",
          "split-448-128": "^ckv: ", "plan-page-64": "^page_size: SGLang 1 vs harness 64", "stock-kv-scale": "^scales: ",
          "plan-causal": "^causal: SGLang False vs harness True", "plan-head-dims": r"^head_dims: SGLang \(512, 64\)"}


PLAN_FAULTS = {"plan-page-64": {"page_size": 64}, "plan-causal": {"causal": True},  # the pool's 64-token pages; a causal mask
               "plan-head-dims": {"head_dim_ckv": 448, "head_dim_kpe": 128}}


@pytest.mark.parametrize("fault", FAULTS)
def test_handoff_comparison_catches_planted_faults(fault, monkeypatch):
    case = case_for("deepseek-v3-tp8" if fault == "old-sm-scale" else "glm5-tp8")
    theirs = sglang_handoff(case)
    if fault == "gather_cast":  # a compact gathered buffer is not the whole layer
        ours = harness_handoff(case, "gather_cast")
    elif fault in PLAN_FAULTS:  # the harness's FlashInfer plan with one argument changed
        plan_kwargs, changed = FlashInferBackend._plan_kwargs, PLAN_FAULTS[fault]
        monkeypatch.setattr(FlashInferBackend, "_plan_kwargs", lambda self, problem: {**plan_kwargs(self, problem), **changed})
        ours = harness_handoff(case)
    elif fault == "stock-kv-scale":  # stock handing its backend a KV scale, which SGLang never applies
        monkeypatch.setattr(REGISTRY["stock"], "setup", lambda self, schedule: setattr(self, "kv_scale", 2.0))
        ours = harness_handoff(case)
    elif fault == "split-448-128":  # the same whole-layer buffer cut at another channel: ckv 448, kpe 128
        monkeypatch.setattr(REGISTRY["stock"], "split", lambda self, buf: (buf[..., :448], buf[..., 448:]))
        ours = harness_handoff(case)
    elif fault == "page1-pool":  # the token-granular pool the harness had before (same row count)
        from harness.inputs.pool import PoolGeometry

        ours = harness_handoff(case, pool=KVPool(PoolGeometry(SLOTS + 63, 1, 576), case.scenario.seed, torch.device("cpu")))
    else:  # DeepSeek-V3 without the YaRN mscale
        from dataclasses import replace

        ours = harness_handoff(replace(case, preset=replace(case.preset, yarn_factor=1.0)))
    with pytest.raises(AssertionError, match=FAULTS[fault]):
        assert_same_handoff(theirs, ours, case.geometry.rows)


def assert_whole_pool_cast(source: str) -> None:
    assert WHOLE_POOL_CAST in source, (
        f"SGLang's FlashInferMLAAttnBackend.forward_decode no longer contains `{WHOLE_POOL_CAST}`: "
        "`stock` no longer models SGLang; re-read the installed backend and update harness/strategies/stock.py"
    )


class CastLog(TorchDispatchMode):
    """Counts FP8 -> BF16 casts (aten._to_copy): one entry of element counts per cast."""

    def __init__(self):
        super().__init__()
        self.casts = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float8_e4m3fn and kwargs.get("dtype") == torch.bfloat16:
            self.casts.append(args[0].numel())
        return func(*args, **kwargs)


def decode_casts(monkeypatch, patch=None) -> tuple[list[list[int]], int]:
    """The FP8 -> BF16 casts (element counts) inside each forward_decode call of the sglang_flashinfer strategy over
    CAST_CASE (SGLang's own init_forward_metadata planning each step), and one layer buffer's element count. `patch`
    wraps forward_decode first (a user's change)."""
    from harness.integrations.sglang import runtime

    backend = runtime.load(runtime.MLA_BACKEND).FlashInferMLAAttnBackend
    decode, calls = backend.forward_decode, []
    if patch:
        decode = patch(decode)

    def logged(self, *args, **kwargs):
        with CastLog() as log:
            out = decode(self, *args, **kwargs)
        calls.append(log.casts)
        return out

    monkeypatch.setattr(backend, "forward_decode", logged)
    case = load_case(CAST_CASE)
    sgl.run_strategies(case.name, ("sglang_flashinfer",))
    return calls, (case.geometry.slots + case.geometry.page_size) * case.geometry.row_width


def assert_every_call_casts_one_whole_layer(calls: list[list[int]], layer: int) -> None:
    assert calls and all(casts == [layer] for casts in calls), (
        f"SGLang's forward_decode cast {calls[:2]} FP8 elements per call, not one whole layer ({layer}): "
        "`stock` no longer models SGLang; re-read the installed backend and update harness/strategies/stock.py")


def test_installed_backend_casts_one_whole_layer_per_decode_call(monkeypatch):
    """What the installed backend does, not what its source says: every forward_decode call of every step casts
    exactly one whole layer buffer (a patch that keeps the old cast only as a fallback branch is caught here)."""
    sgl.require()
    assert_every_call_casts_one_whole_layer(*decode_casts(monkeypatch))


def test_cast_count_fails_when_a_patch_casts_only_the_rows_in_use(monkeypatch):
    """Negative control: forward_decode over a pool cut to the rows the steps read (outputs unchanged)."""
    sgl.require()
    limit = max(int(batch.kv_indices.max()) for batch in load_case(CAST_CASE).schedule().steps) + 1

    def patch(decode):
        def fewer_rows(self, *args, **kwargs):
            pool, real = self.token_to_kv_pool, self.token_to_kv_pool.get_key_buffer
            pool.get_key_buffer = lambda layer_id: real(layer_id)[:limit]
            try:
                return decode(self, *args, **kwargs)
            finally:
                del pool.get_key_buffer
        return fewer_rows

    with pytest.raises(AssertionError, match="`stock` no longer models SGLang"):
        assert_every_call_casts_one_whole_layer(*decode_casts(monkeypatch, patch))


def stock_casts(monkeypatch, strategy: type = REGISTRY["stock"]) -> list[list[int]]:
    """The FP8 -> BF16 casts (element counts) of `strategy`'s decode session over CAST_CASE (a recorder as its
    backend), per layer call (write, prepare_kv, attend): each cast counted in the first call ending after it (setup's
    and begin_step's in the step's first), and one last entry for those after the last call (teardown's)."""
    case = load_case(CAST_CASE)
    schedule, pool = case.schedule(), KVPool(case.geometry, case.scenario.seed, torch.device("cpu"))
    data, attend, calls = decode_loop.make_step_data(case.preset, schedule, pool), decode_loop.attend, []

    def logged(*args):
        out = attend(*args)
        calls.append(log.casts)
        log.casts = []
        return out

    monkeypatch.setattr(decode_loop, "attend", logged)
    with CastLog() as log, decode_loop.DecodeSession(strategy(pool, BackendRecorder(), case.preset), schedule, data) as session:
        session.run_all(())
    return calls + [log.casts]


def assert_stock_casts_as_sglang(theirs: list[list[int]], ours: list[list[int]]) -> None:
    assert ours == theirs + [[]], (
        f"per layer call stock casts {ours} FP8 elements (last: after its last call), SGLang's forward_decode {theirs}: "
        "stock does not do SGLang's work per call")


def test_stock_casts_per_layer_call_what_sglangs_forward_decode_casts(monkeypatch):
    """Over several steps and layers, each write + prepare_kv + attend of stock casts what the installed backend's
    forward_decode for that step and layer casts (one whole layer), and stock casts nothing else."""
    sgl.require()
    theirs, _ = decode_casts(monkeypatch)
    assert_stock_casts_as_sglang(theirs, stock_casts(monkeypatch))


class CastOnceThenRowsInUse(REGISTRY["stock"]):
    """Planted: layer 0 cast once into a kept BF16 buffer in setup, then each call casts only the step's rows."""

    def setup(self, schedule):
        fn, tensors = self.cast_call(0)
        self.kept = fn(*tensors)

    def begin_step(self, batch, graph_capacity=None):
        self.rows = torch.as_tensor(batch.kv_indices, dtype=torch.int64)
        return super().begin_step(batch, graph_capacity)

    def prepare_kv(self, layer):
        self.kept[self.rows] = self.pool.buffers[layer][self.rows].view(torch.float8_e4m3fn).to(torch.bfloat16)
        return self.split(self.kept)


class SkipsTheSecondStepsCast(REGISTRY["stock"]):
    """Planted: the second step attends on the BF16 layers the first step cast."""

    def setup(self, schedule):
        self.kept, self.step = {}, None

    def begin_step(self, batch, graph_capacity=None):
        self.step = batch.step
        return super().begin_step(batch, graph_capacity)

    def prepare_kv(self, layer):
        if self.step != 1:
            self.kept[layer] = super().prepare_kv(layer)
        return self.kept[layer]


@pytest.mark.parametrize("planted", [CastOnceThenRowsInUse, SkipsTheSecondStepsCast], ids=lambda cls: cls.__name__)
def test_cast_comparison_fails_for_a_stock_that_casts_less_per_call(planted, monkeypatch):
    """Negative controls: stocks that hand attention a whole BF16 layer but cast less per call than SGLang."""
    sgl.require()
    theirs, _ = decode_casts(monkeypatch)
    with pytest.raises(AssertionError, match="stock does not do SGLang's work per call"):
        assert_stock_casts_as_sglang(theirs, stock_casts(monkeypatch, planted))


def test_a_backend_that_cannot_run_here_is_named_not_called_a_model_change(monkeypatch):
    """Twin of the cast count's claim: a forward_decode that raises (as sglang 0.5.21's Triton KV write does in the
    CPU interpreter) counts no casts, and the test must fail with that error, not say `stock` no longer models SGLang."""
    sgl.require()

    def patch(decode):
        def broken(self, *args, **kwargs):
            raise RuntimeError("planted: this SGLang's forward_decode cannot run here")
        return broken

    with pytest.raises(AssertionError) as failure:
        assert_every_call_casts_one_whole_layer(*decode_casts(monkeypatch, patch))
    assert "planted: this SGLang's forward_decode cannot run here" in str(failure.value), str(failure.value)
    assert "no longer models SGLang" not in str(failure.value)


def test_installed_backend_still_casts_the_whole_pool():
    sgl.require()
    from sglang.srt.layers.attention.flashinfer_mla_backend import FlashInferMLAAttnBackend

    assert_whole_pool_cast(inspect.getsource(FlashInferMLAAttnBackend.forward_decode))


def test_source_pin_fails_when_the_cast_is_gone():
    sgl.require()
    from sglang.srt.layers.attention.flashinfer_mla_backend import FlashInferMLAAttnBackend

    patched = inspect.getsource(FlashInferMLAAttnBackend.forward_decode).replace(".to(q.dtype)", "")
    with pytest.raises(AssertionError, match="`stock` no longer models SGLang"):
        assert_whole_pool_cast(patched)


@pytest.fixture
def fa3():
    """SGLang's FlashAttentionBackend module, imported on the CPU through the harness's sgl_kernel stand-in (FA3's
    kernels are CUDA-only); dropped again afterwards, so that without sgl_kernel it stays unimportable."""
    sgl.require()
    from harness.integrations.sglang import runtime, stand_in

    stand_in.install()
    try:
        yield runtime.import_module(runtime.FA3_BACKEND)
    finally:
        stand_in.uninstall()
        sys.modules.pop(runtime.FA3_BACKEND, None)


def fa3_decode_casts(module, monkeypatch, patch: tuple[str, str, str] | None = None) -> tuple[list[list[int]], int]:
    """The FP8 -> BF16 casts (element counts) inside each forward_decode call of SGLang's FlashAttentionBackend (MLA,
    FA3, built without __init__ on an FP8 pool of CAST_CASE's geometry; the FA3 kernel a recorder) over CAST_CASE's
    steps and layers, and one layer buffer's element count. `patch` (method, text, replacement): that method
    recompiled from its source so edited (a user's change)."""
    monkeypatch.setattr(module, "flash_attn_with_kvcache", lambda **kwargs: torch.zeros_like(kwargs["qv"]))
    cls = module.FlashAttentionBackend
    if patch:
        name, old, new = patch
        source = textwrap.dedent(inspect.getsource(getattr(cls, name)))
        assert old in source, f"{cls.__name__}.{name} has no `{old}` to patch"
        namespace = dict(vars(module))
        # compiled under this file's `from __future__ import annotations`, as SGLang's module is
        exec(compile(source.replace(old, new), module.__file__, "exec"), namespace)
        monkeypatch.setattr(cls, name, namespace[name])
    case = load_case(CAST_CASE)
    preset, g = case.preset, case.geometry
    backend = object.__new__(cls)
    # what __init__ sets for an MLA model with FP8 KV on FA3, no speculative decoding, no local attention; the
    # metadata's page table and lengths are the kernel's only
    vars(backend).update(use_mla=True, fa_impl_ver=3, kv_cache_dtype=torch.float8_e4m3fn, kv_cache_dtype_str="fp8_e4m3",
                         kv_cache_is_mxfp8=False, page_size=g.page_size, topk=0, local_attn_builder=None, num_splits=0,
                         token_to_kv_pool=sgl.mla_pool(g.slots, g.page_size, g.num_layers, dsa=preset.index_k_bytes > 0),
                         forward_metadata=SimpleNamespace(local_attn_metadata=None, page_table=None, cache_seqlens_int32=None,
                                                          cu_seqlens_q=None, cu_seqlens_k=None, max_seq_len_q=1))
    calls = []
    for batch in case.schedule().steps:
        forward_batch = SimpleNamespace(spec_info=None, batch_size=batch.batch_size)
        for layer_id in range(g.num_layers):
            layer = SimpleNamespace(**vars(sgl.layer(layer_id, preset.heads_per_rank)), scaling=preset.sm_scale, logit_cap=0.0,
                                    k_scale=None, v_scale=None, sliding_window_size=None, is_cross_attention=False,
                                    attn_type=module.AttentionType.DECODER)
            q_nope, q_pe = step_queries(preset, case.scenario.seed, batch, layer_id)
            with CastLog() as log, sgl.single_rank():
                backend.forward_decode(q_nope.reshape(batch.batch_size, -1), None, None, layer, forward_batch,
                                       save_kv_cache=False, q_rope=q_pe.reshape(batch.batch_size, -1))
            calls.append(log.casts)
    return calls, (g.slots + g.page_size) * g.row_width


def test_installed_fa3_backend_casts_one_whole_layer_per_decode_call(fa3, monkeypatch):
    """SGLang's FA3 backend casts as its FlashInfer one: every MLA forward_decode call casts exactly one whole FP8
    layer to BF16 (its FP8-query branch, with descales, is for head_dim <= 256; MLA's is 576)."""
    assert_every_call_casts_one_whole_layer(*fa3_decode_casts(fa3, monkeypatch))


@pytest.mark.parametrize("patch", [
    ("forward_decode", "get_key_buffer(layer.layer_id).to(q.dtype)", "get_key_buffer(layer.layer_id)"),
    ("prepare_paged_mha_query", "layer.head_dim <= 256", "layer.head_dim <= 576"),
], ids=["cast-removed", "fp8-query-at-576"])
def test_fa3_cast_count_fails_when_the_source_is_patched(fa3, monkeypatch, patch):
    """Negative controls: the whole-layer cast removed, or the FP8-query branch taken for MLA's head_dim."""
    with pytest.raises(AssertionError, match="`stock` no longer models SGLang"):
        assert_every_call_casts_one_whole_layer(*fa3_decode_casts(fa3, monkeypatch, patch))
