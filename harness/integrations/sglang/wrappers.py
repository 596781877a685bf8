"""SGLang's MLA pool class over the harness's pool buffers (zero copy), the BF16 K its KV write is handed,
and FlashInfer's MLA decode wrapper interface over a harness backend (SGLang's path on the torch backend: CPU CI)."""

from __future__ import annotations

import torch

from harness.backends.base import AttnProblem
from harness.errors import HarnessError
from harness.inputs.pool import KVPool
from harness.integrations.sglang import runtime
from harness.spec.presets import ModelPreset

INDEX_HEAD_DIM = 128  # DSA index-K: 128 FP8 channels + one fp32 scale per 128 (132 B per token)


def wrap_pool(pool: KVPool, preset: ModelPreset):
    """SGLang's pool for `preset` (DSATokenToKVPool for a DSA model, else MLATokenToKVPool) built by its own
    __init__ with FP8 KV, whose layer buffers (and DSA index-K buffers) ARE the harness's: nothing is
    allocated or copied; `check_zero_copy` proves it by data_ptr. Build it inside `runtime.single_rank()`."""
    pools = runtime.load(runtime.MEMORY_POOL)
    g = pool.geometry
    common = dict(size=g.slots, page_size=g.page_size, dtype=torch.float8_e4m3fn, kv_lora_rank=preset.kv_lora_rank,
                  qk_rope_head_dim=preset.qk_rope_head_dim, layer_num=g.num_layers, device=str(pool.device),
                  enable_memory_saver=False)
    if g.index_k_bytes:
        if g.index_k_bytes != INDEX_HEAD_DIM + INDEX_HEAD_DIM // 128 * 4:
            raise HarnessError("preset.index_k_bytes", f"{g.index_k_bytes} B per token is not SGLang's DSA index-K row")
        sgl = _zero_copy(pools.DSATokenToKVPool, pool)(**common, index_head_dim=INDEX_HEAD_DIM, kv_cache_dim=g.row_width)
    else:
        sgl = _zero_copy(pools.MLATokenToKVPool, pool)(**common)
    check_zero_copy(sgl, pool)
    return sgl


def _zero_copy(base: type, pool: KVPool) -> type:
    """`base` with its buffer allocation replaced by the harness's buffers: SGLang's own `_create_buffers` (a patched one
    too) runs first on the meta device, allocating nothing, and the harness's buffers must have the layout it makes."""

    def create_buffers(self):
        device, self.device = self.device, "meta"
        try:
            base._create_buffers(self)
        finally:
            self.device = device
        theirs = self.kv_buffer
        if len(theirs) != len(pool.buffers):
            raise HarnessError("sglang pool", f"SGLang's pool (its _create_buffers) makes {len(theirs)} KV layer buffers, the harness's has "
                                              f"{len(pool.buffers)}")
        for layer, (buf, want) in enumerate(zip(pool.buffers, theirs)):
            if (buf.shape, buf.stride(), buf.dtype) != (want.shape, want.stride(), want.dtype):
                raise HarnessError("sglang pool", f"layer {layer} KV buffer is {buf.dtype} {tuple(buf.shape)} strides {buf.stride()}, "
                                                  f"SGLang's pool expects {want.dtype} {tuple(want.shape)} strides {want.stride()} (its _create_buffers)")
        self.kv_buffer = list(pool.buffers)

    def create_index_key_cache(self):
        from sglang.srt.mem_cache.index_key_cache import IndexKeyCache

        cache = object.__new__(IndexKeyCache)  # its __init__ would allocate; the rest of it reads these two
        cache.pool = self
        _check("index-K", pool.index_k, cache._buffer_shape((self.index_buf_size + self.page_size + 1) // self.page_size),
               self.index_k_with_scale_buffer_dtype)
        cache.buffer = list(pool.index_k)
        return cache

    return type(f"Harness{base.__name__}", (base,), {"_create_buffers": create_buffers,
                                                     "_create_index_key_cache": create_index_key_cache})


def _check(what: str, buffers: list[torch.Tensor], shape: tuple, dtype: torch.dtype) -> None:
    for layer, buf in enumerate(buffers):
        if tuple(buf.shape) != tuple(shape) or buf.dtype != dtype:
            raise HarnessError("sglang pool", f"layer {layer} {what} buffer is {buf.dtype} {tuple(buf.shape)}, "
                                              f"SGLang's pool expects {dtype} {tuple(shape)}")


def check_zero_copy(sgl_pool, pool: KVPool) -> None:
    """Every layer buffer SGLang's pool reads (get_key_buffer, DSA index-K) is the harness's buffer, not a copy."""
    for layer, buf in enumerate(pool.buffers):
        theirs = sgl_pool.get_key_buffer(layer)
        if theirs.data_ptr() != buf.data_ptr() or theirs.nbytes != buf.nbytes:
            raise HarnessError("sglang pool", f"layer {layer}: SGLang's KV buffer is not the harness's buffer (a copy)")
    for layer, buf in enumerate(pool.index_k):
        if sgl_pool.index_key_cache.buffer[layer].data_ptr() != buf.data_ptr():
            raise HarnessError("sglang pool", f"layer {layer}: SGLang's index-K buffer is not the harness's buffer (a copy)")


def codes_as_bf16(codes: torch.Tensor) -> torch.Tensor:
    """BF16 [n, w] K whose cast to e4m3 (SGLang's set_mla_kv_buffer) stores `codes` (uint8 [n, w]) again: each
    finite e4m3 value is a BF16 value, and a NaN code's sign, which torch's e4m3->BF16 cast drops (every NaN
    0x7FC0 on the CPU), is put back, so 0xFF is stored as 0xFF (all 256 codes: suites/sglang/test_kv_write.py)."""
    bits = codes.view(torch.float8_e4m3fn).to(torch.bfloat16).view(torch.int16)
    return (bits | (codes.to(torch.int16) & 0x80) << 8).view(torch.bfloat16)


RUN_ARGS = ("q_nope", "q_pe", "ckv_cache", "kpe_cache", "out", "lse", "return_lse", "profiler_buffer", "kv_len",
            "page_table", "return_lse_base_on_e", "o_scale")  # FlashInfer 0.7's BatchMLAPagedAttentionWrapper.run, in order


def run_arguments(args: tuple, kwargs: dict) -> dict:
    """A decode wrapper's run(...) arguments by name, whichever of FlashInfer's forms the caller used."""
    if len(args) > len(RUN_ARGS):
        raise HarnessError("sglang run", f"{len(args)} positional arguments; FlashInfer's run takes {len(RUN_ARGS)} at most")
    named = dict(zip(RUN_ARGS, args))
    if twice := sorted(named.keys() & kwargs.keys()):
        raise HarnessError("sglang run", f"{', '.join(twice)} given twice")
    return {**named, **kwargs}


def _pair(value, names: tuple[str, str], named: dict, width: int) -> tuple:
    if value is None:
        return named.get(names[0]), named.get(names[1])
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return tuple(value)
    if isinstance(value, torch.Tensor):
        return value[..., :width], value[..., width:]  # packed: the no-PE features first
    raise HarnessError("sglang run", f"{names[0]}/{names[1]} handed as {type(value).__name__}, not a tensor or a split pair")


def split_tensors(named: dict, width: int) -> tuple:
    """(q_nope, q_pe, ckv, kpe) of run arguments by name: the legacy tensors or query= / kv_cache= (a split pair, or
    one packed tensor whose first `width` features are the no-PE ones)."""
    q_nope, q_pe = _pair(named.get("query"), ("q_nope", "q_pe"), named, width)
    ckv, kpe = _pair(named.get("kv_cache"), ("ckv_cache", "kpe_cache"), named, width)
    if any(t is None for t in (q_nope, q_pe, ckv, kpe)):
        raise HarnessError("sglang run", "no query or KV cache handed to the decode wrapper")
    return q_nope, q_pe, ckv, kpe


class BackendWrapper:
    """The BatchMLAPagedAttentionWrapper calls SGLang's MLA decode makes (plan of a flat CSR decode, run in any of
    FlashInfer's argument forms, FP8 KV with a per-tensor scale), answered by a harness backend (torch): SGLang's
    whole path, a patch's too, runs where FlashInfer cannot (CPU CI). An option it does not model is an error."""

    PLAN_OPTIONS = {"query_layout": None, "kv_cache_layout": None, "lse_mode": None, "enable_pdl": None,  # any value
                    "scale_mode": ("default", "kv-per-tensor")}
    RUN_MODELLED = {"q_nope", "q_pe", "ckv_cache", "kpe_cache", "query", "kv_cache", "out", "return_lse",
                    "return_lse_base_on_e", "ckv_scale", "kpe_scale"}

    def __init__(self, backend):
        self.backend = backend
        self._plan = self._width = None

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size,
             causal, sm_scale, q_data_type, kv_data_type, use_profiler=False, **options) -> None:
        for name, value in options.items():
            if name not in self.PLAN_OPTIONS or (self.PLAN_OPTIONS[name] and value not in self.PLAN_OPTIONS[name]):
                raise HarnessError("sglang plan", f"{name}={value!r}: not modelled by the CPU stand-in of FlashInfer's wrapper")
        if page_size != 1 or causal or q_data_type != torch.bfloat16:
            raise HarnessError("sglang plan", f"page_size {page_size}, causal {causal}, q {q_data_type}: not a decode plan")
        indptr = kv_indptr.to("cpu", torch.int32)
        if not torch.equal(indptr[1:] - indptr[:-1], kv_len_arr.to("cpu", torch.int32)):
            raise HarnessError("sglang plan", "kv_len_arr disagrees with kv_indptr")
        problem = AttnProblem(indptr, kv_indices[: int(indptr[-1])], num_heads, float(sm_scale), kv_data_type,
                              head_dim_ckv, head_dim_kpe)
        self._plan, self._width = self.backend.plan(problem), head_dim_ckv

    def run(self, *args, **kwargs):
        named = run_arguments(args, kwargs)
        if unmodelled := sorted(k for k, v in named.items() if k not in self.RUN_MODELLED and v is not None and v is not False):
            raise HarnessError("sglang run", f"{', '.join(unmodelled)}: not modelled by the CPU stand-in of FlashInfer's wrapper")
        if named.get("return_lse") and not named.get("return_lse_base_on_e"):
            raise HarnessError("sglang run", "the harness's backends return natural-log LSE only")
        if named.get("ckv_scale") != named.get("kpe_scale"):
            raise HarnessError("sglang run", "ckv_scale and kpe_scale differ: one per-tensor scale is modelled")
        o, lse = self.backend.run(self._plan, *split_tensors(named, self._width), kv_scale=named.get("ckv_scale"))
        if named.get("out") is not None:
            o = named["out"].copy_(o)
        return (o, lse) if named.get("return_lse") else o
