"""SGLang's FlashInferMLAAttnBackend run on the harness's pool, step by step and layer by layer.

SGLang's own __init__ builds the backend (decode only: skip_prefill) from a stand-in ModelRunner holding the
harness's pools (zero copy), request table and model config, so state a patch adds there exists; for its
duration, FlashInfer classes it makes but decode never calls stand in on the CPU, and its batch-size
alignment (which reads a launched server's parallel state) is one rank's. Then, per step, SGLang's own metadata methods plan:
`init_forward_metadata` (eager) or `init_forward_metadata_out_graph` (CUDA-graph capture, then
replay through `fast_mla_decode_plan`), each running `FlashInferMLAIndicesUpdaterDecode.call_begin_forward`
and its Triton kv-indices kernel over the request table (tables.RequestTable); per layer SGLang's
`forward_decode` writes the new tokens' KV through its pool's `set_mla_kv_buffer` (save_kv_cache, handed
BF16 K as the model hands it: wrappers.codes_as_bf16), casts the whole layer and runs the decode wrapper.

The wrapper SGLang makes (FlashInfer's BatchMLAPagedAttentionWrapper, backend="auto") is tapped
(`LSETap`): each call goes to it unchanged, and run also asks the kernel for the LSE that SGLang's
single-rank decode does not request, in natural log as the harness's backends return it, and
asserts the attention boundary's dtype contract: BF16 queries, outputs and fp32 LSE, and KV of BF16
(SGLang's cast) or e4m3 (a patch that attends on the FP8 pool), whichever SGLang handed the kernel
(`FlashInferMLA.kv_dtypes` records it: the strategy's tier follows)."""

from __future__ import annotations

import copy
import types
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from harness.backends.contract import check_boundary
from harness.errors import HarnessError
from harness.inputs.pool import KVPool
from harness.integrations.sglang import runtime, wrappers
from harness.integrations.sglang.tables import RequestTable
from harness.spec.buckets import BUCKETS, bucket_capacities, bucket_for
from harness.spec.faults import Fault
from harness.spec.presets import ModelPreset
from harness.spec.schedule import Schedule, StepBatch

HANDED_KV = (torch.bfloat16, torch.float8_e4m3fn)  # SGLang's cast of the pool, or the pool itself (a native-FP8 patch)


class LSETap:
    """A decode wrapper as forward_decode sees it: everything goes to `wrapper`; run returns SGLang's
    output and keeps the kernel's natural-log LSE in `lse` (and what SGLang handed it in `handed`)."""

    def __init__(self, wrapper, name: str, kv_dtypes: set, width: int):
        self.wrapper, self.name, self.kv_dtypes, self.width = wrapper, name, kv_dtypes, width
        self.lse = self.handed = None

    def __getattr__(self, attr):
        return getattr(self.wrapper, attr)

    def run(self, *args, **kwargs):
        """Whichever of FlashInfer's forms forward_decode calls (legacy tensors, query= / kv_cache=, FP8 scales, ...),
        handed on as given (positional tensors stay positional), with the LSE asked for."""
        named = wrappers.run_arguments(args, kwargs)
        if named.get("return_lse"):
            raise HarnessError("sglang", "forward_decode asked for the LSE: a decode-context-parallel path, not modelled")
        lse_at = wrappers.RUN_ARGS.index("return_lse")  # positional arguments from it on go by name, the LSE asked for
        o, lse = self.wrapper.run(*args[:lse_at], **{**dict(zip(wrappers.RUN_ARGS[lse_at:], args[lse_at:])), **kwargs,
                                                     "return_lse": True, "return_lse_base_on_e": True})
        q_nope, _, ckv, kpe = wrappers.split_tensors(named, self.width)
        check_boundary(self.name, ckv.dtype if ckv.dtype in HANDED_KV else torch.bfloat16, q_nope, ckv, kpe, o, lse)
        self.kv_dtypes.add(ckv.dtype)
        self.lse, self.handed = lse, (ckv, kpe)
        return o


@dataclass
class StepPlan:
    """One step's forward metadata as SGLang's own metadata method built it (its DecodeMetadata, with whatever
    fields a patched SGLang adds), its wrapper tapped, and the forward batch it was planned for."""

    metadata: Any
    tap: LSETap
    batch_size: int
    forward_batch: SimpleNamespace


class StandInRunner(SimpleNamespace):
    """The ModelRunner fields SGLang's FlashInferMLAAttnBackend.__init__ reads, made by the harness (no server runs).
    A field a patched __init__ reads beyond them is an AttributeError that says so (hasattr still works)."""

    def __getattr__(self, name):
        raise AttributeError(f"model_runner.{name}: not in the harness's StandInRunner (integrations/sglang/flashinfer_mla.py), "
                             "which your SGLang's backend __init__ reads")


class _Unused:
    """Stands in for a FlashInfer class SGLang's __init__ instantiates but decode never calls (CPU: no FlashInfer)."""

    def __init__(self, *args, **kwargs):
        pass


@contextmanager
def module_names(module, names: dict):
    """`module`'s global `names` replaced for the duration (added where absent), then restored."""
    missing = object()
    saved = {name: getattr(module, name, missing) for name in names}
    for name, value in names.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(module, name)
            else:
                setattr(module, name, value)


@contextmanager
def cuda_allocations_on_cpu(module):
    """`module`'s torch.empty(..., device="cuda") made on the CPU for the duration: SGLang 0.5.23's eager decode
    plan (call_begin_forward) allocates kv_indices on "cuda" by name, and on a CPU run its own init_forward_metadata
    runs unchanged with this one allocation moved. Only that module's `torch` is swapped, and only here."""
    real = module.torch

    def empty(*args, device=None, **kwargs):
        if device is not None and torch.device(device).type == "cuda":
            device = "cpu"
        return real.empty(*args, device=device, **kwargs)

    shim = types.ModuleType("torch")
    shim.__getattr__ = lambda name: getattr(real, name)
    shim.empty = empty
    with module_names(module, {"torch": shim}):
        yield


def rope_scaling(preset: ModelPreset) -> dict | None:
    """The preset's rope_scaling as the model's HF config.json writes it (DeepSeek-V3: YaRN, factor 40)."""
    if preset.yarn_factor <= 1:
        return None
    return {"type": "yarn", "factor": preset.yarn_factor, "mscale": 1.0, "mscale_all_dim": preset.yarn_mscale_all_dim,
            "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}


class FlashInferMLA:
    """SGLang's FlashInfer MLA decode over `pool` for one schedule. `wrapper` makes the eager decode
    wrapper from the workspace (None: SGLang's own, FlashInfer's BatchMLAPagedAttentionWrapper with
    backend="auto"); CUDA-graph plans always use SGLang's own. `kernel`: the FlashInfer kernel the
    harness's backend runs (stock's), which the planned wrapper must have chosen. Use inside `runtime.single_rank()`."""

    def __init__(self, name: str, pool: KVPool, preset: ModelPreset, schedule: Schedule, faults=frozenset(), wrapper=None,
                 kernel: str | None = None):
        fm = runtime.load(runtime.MLA_BACKEND)
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        self.name, self.preset, self.device, self.faults, self.kernel = name, preset, pool.device, frozenset(faults), kernel
        self.module = fm
        self.kv_dtypes: set[torch.dtype] = set()  # the KV dtypes forward_decode handed the kernel
        self.decode_mode = ForwardMode.DECODE
        self.sgl_pool = wrappers.wrap_pool(pool, preset)
        self.table = RequestTable(schedule, pool.device, self.faults)
        max_bs = max(bucket_for(b.batch_size) for b in schedule.steps) if pool.device.type == "cuda" else max(
            b.batch_size for b in schedule.steps)
        dev = pool.device

        # the model config and ModelRunner fields FlashInferMLAAttnBackend.__init__ reads (a decode-only backend)
        config = object.__new__(ModelConfig)
        config.qk_nope_head_dim, config.qk_rope_head_dim = preset.qk_nope_head_dim, preset.qk_rope_head_dim
        config._init_mla_scaling(rope_scaling(preset))
        config.context_len, config.num_attention_heads = self.table.req_to_token.shape[1], preset.heads_per_rank
        config.kv_lora_rank, config.v_head_dim = preset.kv_lora_rank, preset.kv_lora_rank
        translator = KVIndexTranslator(req_to_token=self.table.req_to_token, token_to_kv_pool_allocator=None,
                                       token_to_kv_pool=self.sgl_pool, page_size=preset.page_size, device=str(dev))
        runner = StandInRunner(model_config=config, device=dev, dtype=torch.bfloat16, kv_cache_dtype=torch.float8_e4m3fn,
                               page_size=preset.page_size, req_to_token_pool=self.table.pool, token_to_kv_pool=self.sgl_pool,
                               kv_index_translator=translator)
        # its max_bs sizes only buffers a decode-only backend given kv_indptr_buf / q_indptr_decode_buf never makes; SGLang's
        # alignment rule reads a launched server's parallel state (one rank without MLP sync: 1)
        stand_ins = {"get_cuda_graph_max_batch_size": lambda size: size}
        if dev.type != "cuda":
            stand_ins["BatchPrefillWithRaggedKVCacheWrapper"] = _Unused  # FlashInfer is CUDA-only
        if wrapper is not None:
            stand_ins["BatchMLAPagedAttentionWrapper"] = lambda workspace, *args, **kwargs: wrapper(workspace)
        with module_names(fm, stand_ins):  # SGLang's own __init__: whatever state a patch adds there is made
            b = fm.FlashInferMLAAttnBackend(runner, skip_prefill=True, kv_indptr_buf=torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
                                            q_indptr_decode_buf=torch.arange(max_bs + 1, dtype=torch.int32, device=dev))
        self.backend, self._graph_ready = b, False
        self._capacity = max(bucket_capacities(schedule, BUCKETS).values())

    def forward_batch(self, batch: StepBatch) -> SimpleNamespace:
        """The ForwardBatch fields SGLang's decode metadata methods and forward_decode read, after the table is brought
        to `batch` (out_cache_loc, the write slots, is set by `attend`; physical, as SGLang's KVLocPlan.bind marks it)."""
        req_pool_indices = self.table.update(batch)
        lens = torch.as_tensor(batch.kv_indptr[1:] - batch.kv_indptr[:-1], dtype=torch.int64)
        if Fault.DROPPED_LAST_TOKEN in self.faults:  # the shared control: each request's newest token unread
            lens = (lens - 1).clamp(min=0)
        seq_lens = lens.to(self.device)
        return SimpleNamespace(forward_mode=self.decode_mode, batch_size=batch.batch_size, req_pool_indices=req_pool_indices,
                               seq_lens=seq_lens, seq_lens_cpu=lens, seq_lens_sum=int(lens.sum()), positions=seq_lens - 1,
                               spec_info=None, kv_loc_plan=None, out_cache_loc=None, out_cache_loc_is_physical=True)

    def begin(self, batch: StepBatch, graph_capacity: int | None = None) -> StepPlan:
        """Plan the step: SGLang's eager metadata, or (CUDA, `graph_capacity`) its graph-capture metadata."""
        b, fb = self.backend, self.forward_batch(batch)
        if self.device.type != "cuda":
            with cuda_allocations_on_cpu(self.module):
                b.init_forward_metadata(fb)
        elif graph_capacity is None:
            b.init_forward_metadata(fb)
        else:
            if graph_capacity > self._capacity:
                raise HarnessError("graph_capacity", f"{graph_capacity} kv_indices exceed the schedule's {self._capacity}")
            if not self._graph_ready:  # one kv_indices buffer for every bucket, as SGLang's graph runner shares it
                b.init_cuda_graph_state(b.kv_indptr.numel() - 1, b.kv_indptr.numel() - 1,
                                        kv_indices_buf=torch.zeros(self._capacity, dtype=torch.int32, device=self.device))
                self._graph_ready = True
            b.init_forward_metadata_out_graph(fb, in_capture=True)
        self._check_kernel(b.forward_metadata.decode_wrapper)
        tap = LSETap(b.forward_metadata.decode_wrapper, self.name, self.kv_dtypes, self.preset.kv_lora_rank)
        metadata = copy.copy(b.forward_metadata)  # the step's one metadata, as every layer of SGLang's step reads it:
        metadata.decode_wrapper = tap  # what a layer sets on it the next layer sees; SGLang's own object stays untapped
        return StepPlan(metadata, tap, batch.batch_size, fb)

    def replan(self, plan: StepPlan, batch: StepBatch) -> None:
        """A captured bucket's next step: SGLang's replay metadata (fast_mla_decode_plan into the captured buffers)."""
        if batch.batch_size != plan.batch_size:
            raise HarnessError("replan", f"a graph of {plan.batch_size} requests cannot replay {batch.batch_size}")
        plan.forward_batch = self.forward_batch(batch)
        self.backend.init_forward_metadata_out_graph(plan.forward_batch)

    def attend(self, plan: StepPlan, layer: int, q_nope: torch.Tensor, q_pe: torch.Tensor,
               new: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """SGLang's forward_decode of `layer` (its KV write, whole-layer cast and wrapper run): (out, lse). It sees the
        metadata SGLang's own method built for the step, only its decode wrapper tapped, and the step's forward batch.
        `new`: (slots, BF16 K [n, 576]) of the layer's new tokens, written as the model's attention hands them
        (k_nope [n, 1, 512] as k and v, k_rope [n, 1, 64], out_cache_loc the slots); None: no write."""
        b, (batch, heads), r = self.backend, q_nope.shape[:2], self.preset.kv_lora_rank
        b.forward_metadata = plan.metadata
        radix = SimpleNamespace(layer_id=layer, tp_q_head_num=heads, tp_k_head_num=1, v_head_dim=r,
                                head_dim=self.preset.row_width)
        k = k_rope = None
        if new is not None:
            plan.forward_batch.out_cache_loc, k = new
            k, k_rope = k[:, None, :r], k[:, None, r:]
        o = b.forward_decode(q_nope.reshape(batch, -1), k, k, radix, plan.forward_batch,
                             save_kv_cache=new is not None, q_rope=q_pe.reshape(batch, -1), k_rope=k_rope)
        return o.view(batch, heads, self.preset.kv_lora_rank), plan.tap.lse

    def _check_kernel(self, wrapper) -> None:
        """The kernel FlashInfer's auto policy planned must be the harness backend's (same kernel as stock)."""
        planned = getattr(wrapper, "_backend", None)
        if self.kernel is not None and planned != self.kernel:
            raise HarnessError("sglang", f"SGLang's wrapper (backend='auto') planned {planned}; the harness's backend runs {self.kernel}")
