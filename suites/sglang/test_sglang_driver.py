"""The SGLang TPOT driver against the real SGLang (CPU): its command line parses with SGLang's own
parser, and the installed gather_cast plugin really replaces the whole-pool cast of SGLang's
FlashInferMLAAttnBackend.forward_decode (FlashInfer replaced by a recorder). Skipped without sglang."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import pytest
import torch

from harness.integrations.sglang.runtime import import_module

try:  # sglang.srt, not sglang: with suites/ on sys.path, this folder alone imports as a namespace "sglang"
    import_module("sglang.srt")  # a failure leaves nothing behind that turns later imports into KeyError: 'sglang'
except Exception as exc:  # ImportError, or a broken install (e.g. a CUDA-only torchvision)
    pytest.skip(f"sglang is not importable ({type(exc).__name__}: {exc})"[:200], allow_module_level=True)
pytestmark = pytest.mark.sglang

import sgl  # noqa: E402

from harness.errors import HarnessError  # noqa: E402
from harness.inputs.pool import geometry_for  # noqa: E402
from harness.spec.presets import SCALES  # noqa: E402
from harness.tpot import sglang_driver  # noqa: E402
from harness.tpot.config import load_shape  # noqa: E402

ROWS, HEADS, WIDTH = 300, 8, 576


@pytest.fixture(autouse=True)
def _sglang():
    """SGLang's pools and FlashInfer MLA backend import (sgl.require): a missing dependency of this SGLang is a skip
    naming it here too, not a traceback from the first module a test imports (sglang 0.5.20: xgrammar)."""
    import sgl

    sgl.require()


def _sglang_parser():
    from sglang.benchmark.one_batch import BenchArgs
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    BenchArgs.add_cli_args(parser)
    return parser


def _driver_args(tmp_path):
    shape = load_shape("glm5-tp8")
    return shape, sglang_driver.one_batch_args(tmp_path, shape, 32, 4096, 16, tmp_path / "r.jsonl", 495_552)


def test_command_line_parses_with_sglangs_own_parser(tmp_path):
    from sglang.benchmark.one_batch import BenchArgs

    shape, args = _driver_args(tmp_path)
    ns = _sglang_parser().parse_args(args)
    assert (ns.attention_backend, ns.kv_cache_dtype, ns.load_format) == ("flashinfer", "fp8_e4m3", "dummy")
    assert json.loads(ns.json_model_override_args) == sglang_driver.one_rank_overrides(shape)
    bench = BenchArgs.from_cli_args(ns)
    assert (bench.batch_size, bench.input_len, bench.output_len) == ((32,), (4096,), (16,)) or \
        (list(bench.batch_size), list(bench.input_len), list(bench.output_len)) == ([32], [4096], [16])


class SteppingRunner:
    """The model-runner surface sglang's latency_test_run_once uses, each decode step sleeping a known time."""

    def __init__(self, step_s: list[float]):
        self.step_s = iter(step_s)

    def max_batch_size(self, input_len, output_len):
        return 1024

    def clear(self):
        pass

    def synchronize(self):
        pass

    def extend(self, reqs):
        return torch.zeros(4, dtype=torch.int64), None, "batch"

    def decode(self, ids, batch):
        time.sleep(next(self.step_s))
        return ids, None

    def cleanup(self, batch):
        pass


def _one_batch_run(tmp_path, log_decode_step: int) -> tuple[str, dict]:
    """SGLang's own measured run (latency_test_run_once) with a stand-in runner, as the driver launches it:
    batch 4, output_len 9 (8 timed decode steps). Its log, under the line one_batch prints before it."""
    from sglang.benchmark.one_batch import latency_test_run_once

    lines = []
    result = latency_test_run_once("r", SteppingRunner([0.002 + 0.001 * (i % 3) for i in range(8)]), lines.append, None, 4, 16, 9,
                                   log_decode_step, False, False, ("CPU",), "", "all", 0)
    return "\n".join([sglang_driver.BENCHMARK_LINE, *lines]), result


def test_the_driver_reads_every_step_sglangs_benchmark_logs(tmp_path):
    """With the driver's --log-decode-step, SGLang logs every decode step: the driver's samples are its 8 steps
    and their median is SGLang's median_decode_latency (to the log's 10 µs rounding). Twin: SGLang's default
    (0) logs only steps 0-4, and the driver refuses the log instead of gating on five steps."""
    from sglang.benchmark.one_batch import BenchArgs

    _, args = _driver_args(tmp_path)
    bench = BenchArgs.from_cli_args(_sglang_parser().parse_args(args))
    log, result = _one_batch_run(tmp_path, bench.log_decode_step)
    steps = sglang_driver.parse_step_ms(log, 4, 9)
    assert len(steps) == 8 and statistics.median(steps) == pytest.approx(result["median_decode_latency"] * 1e3, abs=0.011)
    log, _ = _one_batch_run(tmp_path, BenchArgs.log_decode_step)
    with pytest.raises(HarnessError, match="5 decode step lines"):
        sglang_driver.parse_step_ms(log, 4, 9)


def _sglang_row_width(tmp_path, shape, args) -> int:
    """The KV row width SGLang's own calculate_mla_kv_cache_dim gives the driver's stand-in checkpoint
    (its config.json read by transformers, as SGLang reads it) under the DSA backends `args` choose."""
    from sglang.srt.mem_cache.kv_cache_configurator import calculate_mla_kv_cache_dim
    from sglang.srt.runtime_context import get_context
    from transformers import AutoConfig

    ns = _sglang_parser().parse_args(args)
    hf = AutoConfig.from_pretrained(sglang_driver.write_model_folder(shape, tmp_path / "model"))
    model = SimpleNamespace(hf_config=hf, kv_lora_rank=hf.kv_lora_rank, qk_rope_head_dim=hf.qk_rope_head_dim)
    with get_context().override_server_args(dsa_prefill_backend=ns.dsa_prefill_backend, dsa_decode_backend=ns.dsa_decode_backend,
                                            disaggregation_mode=ns.disaggregation_mode):
        return calculate_mla_kv_cache_dim(model_config=model, kv_cache_dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize("preset", ["glm5-tp8", "deepseek-v3-tp8"])
def test_sglang_builds_the_presets_kv_row_for_the_drivers_command_line(tmp_path, preset):
    """The pool SGLang builds for the driver's command line has the preset's row (576 bytes): for GLM-5, a DSA
    model, only because the driver picks the trtllm DSA backends."""
    shape = load_shape(preset)
    args = sglang_driver.one_batch_args(tmp_path, shape, 32, 4096, 16, tmp_path / "r.jsonl", 495_552)
    assert _sglang_row_width(tmp_path, shape, args) == shape.preset.row_width == 576


def test_without_the_dsa_backends_sglang_stores_another_row(tmp_path):
    """Negative control: without --dsa-*-backend trtllm SGLang's GLM-5 pool rows are 656 bytes (FP8 nope, fp32
    block scales, BF16 rope), not the 576-byte rows the harness models."""
    shape = load_shape("glm5-tp8")
    args = sglang_driver.one_batch_args(tmp_path, shape, 32, 4096, 16, tmp_path / "r.jsonl", 495_552)
    i = args.index(sglang_driver.DSA_RAW_ROWS[0])
    assert args[i:i + 4] == sglang_driver.DSA_RAW_ROWS
    assert _sglang_row_width(tmp_path, shape, args[:i] + args[i + 4:]) == 656


POOL_LAYERS = 2


class SGLangPoolSizing:
    """How SGLang 0.5.23 sizes one_batch's KV pool for a command line, by its own code on CPU: ServerArgs.from_cli_args
    (--max-total-tokens), its page size for the model (DeepSeek-family override: 64-token pages for a DSA model, else
    _page_size_default's 1), and KVCacheConfigurator.config_from_budget (its pool configurator's bytes per token,
    _apply_token_constraints' min(profiled, --max-total-tokens), rounding down to whole pages) for a KV budget in bytes:
    what ModelRunner.alloc_memory_pool does after measuring free GPU memory. The configurator object is a stand-in
    holding only the fields that path reads (plain MLA/DSA pool, tp 1, no speculative decoding)."""

    def __init__(self, args: list[str]):
        from sglang.srt.arg_groups.model_override_base import resolving_view
        from sglang.srt.arg_groups.model_overrides.deepseek_v2 import _deepseek_family_overrides
        from sglang.srt.arg_groups.overrides import _page_size_default
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.server_args = sa = ServerArgs.from_cli_args(_sglang_parser().parse_args(args))
        self.model_config = ModelConfig.from_server_args(sa)
        declared = _deepseek_family_overrides(sa, self.model_config.hf_config)
        self.page_size = declared["page_size"] if "page_size" in declared else _page_size_default(resolving_view(sa))["page_size"]
        layers = self.model_config.num_hidden_layers
        self.kvc = SimpleNamespace(
            model_config=self.model_config, kv_cache_dtype=torch.float8_e4m3fn, kv_cache_dtype_str=sa.kv_cache_dtype,
            is_hybrid_swa=False, use_mla_backend=True, mambaish_config=None, is_draft_worker=False, pp_size=1,
            layer_info=SimpleNamespace(num_effective_layers=layers, start_layer=0, end_layer=layers),
            spec_algorithm=SpeculativeAlgorithm.NONE, server_args=sa, kv_shard_rank=None, kv_shard_size=1)
        self.kvc._apply_token_constraints = lambda capacity: KVCacheConfigurator._apply_token_constraints(self.kvc, capacity)
        self._config_from_budget = KVCacheConfigurator.config_from_budget

    def _context(self):
        from sglang.srt.runtime_context import get_context

        sa = self.server_args
        return get_context().override_server_args(max_total_tokens=sa.max_total_tokens, page_size=self.page_size,
                                                  dsa_prefill_backend=sa.dsa_prefill_backend, dsa_decode_backend=sa.dsa_decode_backend)

    def bytes_per_token(self) -> int:
        from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

        with self._context():
            return create_memory_pool_configurator(self.kvc)._cell_size

    def tokens(self, budget_bytes: int) -> int:
        """max_total_num_tokens: the pool's `size` (sglang one_batch prints it as max_total_num_tokens=)."""
        with self._context():
            return self._config_from_budget(self.kvc, budget_bytes).max_total_num_tokens


def _launcher_report(tokens: int, page_size: int, dsa: bool) -> str:
    """The launcher's pool line for SGLang's real pool of `tokens` slots (MLATokenToKVPool / DSATokenToKVPool on CPU),
    as sglang_launch.pool_report reads it from the model runner after alloc_memory_pool."""
    from harness.tpot.sglang_launch import POOL_MARK, pool_report

    pool = sgl.mla_pool(tokens, page_size, POOL_LAYERS, dsa)
    return POOL_MARK + json.dumps(pool_report(SimpleNamespace(token_to_kv_pool=pool, max_total_num_tokens=tokens)))


SLOTS = SCALES["ci"].slots  # a case's pool small enough to build on the CPU
PRESETS = ["glm5-tp8", "deepseek-v3-tp8"]


def _pool_args(tmp_path, preset: str, slots: int) -> tuple:
    shape = load_shape(preset).for_pool(POOL_LAYERS)
    folder = sglang_driver.write_model_folder(shape, tmp_path / "model")
    return shape, sglang_driver.one_batch_args(folder, shape, 1, 4096, 16, tmp_path / "r.jsonl", slots)


@pytest.mark.parametrize("preset", PRESETS)
def test_sglang_builds_the_cases_pool_for_the_drivers_command_line(tmp_path, preset):
    """With memory for more, SGLang's own sizing of the driver's command line gives the case's slots, SGLang's pool of
    that size has the case's rows (slots + page_size) of 576 B, and the driver accepts the launcher's report of it.
    Before: the command line had no --max-total-tokens, so the pool was whatever free memory gave (twins below)."""
    shape, args = _pool_args(tmp_path, preset, SLOTS)
    sizing = SGLangPoolSizing(args)
    assert sizing.server_args.max_total_tokens == SLOTS
    assert sizing.page_size == shape.preset.page_size  # GLM-5 (DSA): SGLang's 64-token pages; DeepSeek-V3: 1
    tokens = sizing.tokens(sizing.bytes_per_token() * 4 * SLOTS)
    assert tokens == SLOTS
    geometry = geometry_for(shape.preset, SLOTS, POOL_LAYERS)
    report = sglang_driver.check_pool(_launcher_report(tokens, sizing.page_size, bool(shape.preset.index_k_bytes)), geometry)
    assert (report["slots"], report["rows"], report["row_bytes"]) == (SLOTS, geometry.rows, 576)
    assert sglang_driver.check_pool(f"max_total_num_tokens={tokens}\n", geometry) == {"slots": SLOTS}  # one_batch's own line (tp > 1)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("plant", ["without --max-total-tokens", "another --max-total-tokens", "capped by memory"])
def test_a_pool_sglang_sizes_otherwise_is_refused(tmp_path, preset, plant):
    """Planted twins: SGLang's own sizing gives another pool (the profiled capacity without the option; the other number;
    the profiled capacity when memory holds fewer slots than asked), and the driver refuses the launcher's report of it."""
    shape, args = _pool_args(tmp_path, preset, SLOTS)
    budget_slots = 4 * SLOTS
    if plant == "without --max-total-tokens":
        i = args.index("--max-total-tokens")
        args = args[:i] + args[i + 2:]
    elif plant == "another --max-total-tokens":
        args[args.index("--max-total-tokens") + 1] = str(2 * SLOTS)
    else:
        budget_slots = SLOTS // 2 + 1  # free memory for about half the pool
    sizing = SGLangPoolSizing(args)
    tokens = sizing.tokens(sizing.bytes_per_token() * budget_slots)
    assert tokens != SLOTS
    geometry = geometry_for(shape.preset, SLOTS, POOL_LAYERS)
    with pytest.raises(HarnessError, match=f"not the case's {SLOTS:,} slots"):
        sglang_driver.check_pool(_launcher_report(tokens, sizing.page_size, bool(shape.preset.index_k_bytes)), geometry)
    with pytest.raises(HarnessError, match=f"not the case's {SLOTS:,} slots"):
        sglang_driver.check_pool(f"max_total_num_tokens={tokens}\n", geometry)


def test_sglang_rounds_the_pool_down_to_whole_pages_and_the_driver_refuses_such_slots_up_front(tmp_path):
    """GLM-5's 64-token pages: SGLang turns --max-total-tokens 16,416 into a 16,384-slot pool, so the driver refuses a
    case of 16,416 slots before SGLang runs; twin: 16,384 is whole pages and passes."""
    shape, args = _pool_args(tmp_path, "glm5-tp8", SLOTS + 32)
    sizing = SGLangPoolSizing(args)
    assert sizing.tokens(sizing.bytes_per_token() * 4 * SLOTS) == SLOTS
    with pytest.raises(HarnessError, match="64-token pages"):
        sglang_driver.check_slots(SLOTS + 32, shape.preset.page_size, 1, 4096, 16)
    sglang_driver.check_slots(SLOTS, shape.preset.page_size, 1, 4096, 16)


def test_the_launcher_reports_the_pool_sglang_built_and_stops_on_another(monkeypatch, capsys):
    """sglang_launch's hook on SGLang's ModelRunner.alloc_memory_pool (the class one_batch.load_model builds) prints the
    pool SGLang just built and, when it is not the --slots asked for, exits 2 before the benchmark; twin: the same pool
    asked for runs on. alloc_memory_pool itself is a stand-in that builds SGLang's real pool on the CPU."""
    from sglang.benchmark import one_batch
    from sglang.srt.model_executor.model_runner import ModelRunner

    from harness.tpot.sglang_launch import POOL_MARK, report_pool

    assert one_batch.ModelRunner is ModelRunner

    def alloc_memory_pool(self):
        self.token_to_kv_pool, self.max_total_num_tokens = sgl.mla_pool(SLOTS, 64, POOL_LAYERS, True), SLOTS
        return "allocated"

    for expect in (SLOTS, SLOTS * 2):
        monkeypatch.setattr(ModelRunner, "alloc_memory_pool", alloc_memory_pool)
        report_pool(expect)
        runner = SimpleNamespace(is_draft_worker=False)
        if expect == SLOTS:
            assert ModelRunner.alloc_memory_pool(runner) == "allocated"
        else:
            with pytest.raises(SystemExit) as stop:
                ModelRunner.alloc_memory_pool(runner)
            assert stop.value.code == 2
        out = capsys.readouterr()
        (line,) = [x for x in out.out.splitlines() if x.startswith(POOL_MARK)]
        report = json.loads(line[len(POOL_MARK):])
        assert (report["slots"], report["rows"], report["row_bytes"], report["pool"]) == (SLOTS, SLOTS + 64, 576, "DSATokenToKVPool")
        assert ("stopped before the benchmark" in out.err) == (expect != SLOTS)


def test_a_wrong_value_is_refused_by_sglangs_parser(tmp_path):
    _, args = _driver_args(tmp_path)
    bad = [("fp8_e5m3_typo" if a == "fp8_e4m3" else a) for a in args]  # planted: a kv-cache dtype SGLang lacks
    with pytest.raises(SystemExit):
        _sglang_parser().parse_args(bad)


class Recorder:
    """Stands in for FlashInfer's BatchMLAPagedAttentionWrapper: records what plan/run receive."""

    def __init__(self):
        self.planned, self.ran = None, []

    def plan(self, qo_indptr, kv_indptr, kv_indices, *rest, **kw):
        self.planned = kv_indices.clone()

    def run(self, q_nope, q_rope, ckv, kpe, out=None, return_lse=False):
        self.ran.append((ckv.shape, ckv.dtype, ckv.clone()))
        return out.zero_()


class FakePool:
    """SGLang's MLATokenToKVPool surface forward_decode uses: a uint8 buffer viewed as e4m3."""

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.buffer = torch.randint(0, 0x7E, (ROWS, 1, WIDTH), dtype=torch.uint8, generator=gen)

    def get_key_buffer(self, layer_id):
        return self.buffer.view(torch.float8_e4m3fn)


def _bare_backend(cls, gather: bool):
    """The backend object without __init__ (no GPU, no model runner), FlashInfer replaced by a recorder."""
    backend = object.__new__(cls)
    recorder = Recorder()
    backend.token_to_kv_pool = FakePool()
    backend.forward_metadata = SimpleNamespace(decode_wrapper=recorder)
    backend.indices_updater_decode = SimpleNamespace(call_begin_forward=lambda wrapper, kv_indices: wrapper.plan(None, None, kv_indices))
    if gather:
        backend.harness_attach()
    return backend, recorder


def _decode(backend, kv_indices):
    backend.indices_updater_decode.call_begin_forward(backend.forward_metadata.decode_wrapper, kv_indices)
    layer = SimpleNamespace(layer_id=0, tp_q_head_num=HEADS, v_head_dim=512, head_dim=WIDTH)
    q = torch.zeros((2, HEADS * 512), dtype=torch.bfloat16)
    q_rope = torch.zeros((2, HEADS * 64), dtype=torch.bfloat16)
    # no DCP lse path; out_cache_loc, which forward_decode reads without a KV write too (sglang 0.5.21)
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: False), out_cache_loc=None)
    backend.forward_decode(q, None, None, layer, batch, save_kv_cache=False, q_rope=q_rope)


KV_INDICES = torch.tensor([17, 5, 250, 251, 3], dtype=torch.int32)


def test_gather_cast_plugin_replaces_the_whole_pool_cast():
    from harness.tpot.sglang_plugin import gather_cast_backend_class

    backend, recorder = _bare_backend(gather_cast_backend_class(), gather=True)
    _decode(backend, KV_INDICES)
    (shape, dtype, ckv), = recorder.ran
    assert shape == (len(KV_INDICES), 1, 512) and dtype == torch.bfloat16  # the compact buffer, not the pool
    assert torch.equal(recorder.planned, torch.arange(len(KV_INDICES), dtype=torch.int32))  # plan on compact rows
    whole = FakePool().get_key_buffer(0).to(torch.bfloat16)
    assert torch.equal(ckv, whole[KV_INDICES.long(), :, :512])  # the same values attention reads in stock


def test_sglangs_own_backend_casts_the_whole_pool():
    """Twin: without the plugin, the recorder sees SGLang's whole-pool cast (what the test above rules out)."""
    from sglang.srt.layers.attention.flashinfer_mla_backend import FlashInferMLAAttnBackend

    backend, recorder = _bare_backend(FlashInferMLAAttnBackend, gather=False)
    _decode(backend, KV_INDICES)
    (shape, dtype, _), = recorder.ran
    assert shape == (ROWS, 1, 512) and dtype == torch.bfloat16
    assert torch.equal(recorder.planned, KV_INDICES)


def test_install_puts_the_plugin_into_sglangs_registry():
    from sglang.srt.layers.attention import attention_registry as registry

    from harness.tpot.sglang_plugin import install

    original = registry.ATTENTION_BACKENDS["flashinfer"]
    calls = []
    try:
        registry.ATTENTION_BACKENDS["flashinfer"] = lambda runner: calls.append(runner) or "sglang's backend"
        install("stock")  # stock is SGLang unchanged
        stock_factory = registry.ATTENTION_BACKENDS["flashinfer"]
        install("gather_cast")
        factory = registry.ATTENTION_BACKENDS["flashinfer"]
        assert factory is not stock_factory
        assert factory(SimpleNamespace(use_mla_backend=False)) == "sglang's backend" and len(calls) == 1  # non-MLA: SGLang's
    finally:
        registry.ATTENTION_BACKENDS["flashinfer"] = original
