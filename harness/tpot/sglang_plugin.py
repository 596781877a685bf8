"""Install a harness strategy into SGLang's FlashInfer MLA decode path (import only where sglang is).

`install(strategy)` replaces the factory SGLang's attention-backend registry holds for "flashinfer"
(`ATTENTION_BACKENDS`, sglang 0.5.23 `srt/layers/attention/attention_registry.py`), so the command
line keeps `--attention-backend flashinfer`:
- stock: nothing changes (SGLang's own whole-pool `get_key_buffer(layer).to(bf16)` per layer);
- gather_cast: the decode plan gets sequential rows [0, nnz) and the pool rows it was given are kept;
  during `forward_decode`, `get_key_buffer` returns only those rows, gathered and cast to BF16 by the
  harness's gather_cast kernel (SGLang's `.to(q.dtype)` is then a no-op), so the whole-pool cast
  never runs. Under CUDA-graph replay SGLang plans on its capture-stable index buffer, so the gather
  covers that buffer's capacity (`--cuda-graph-max-bs` bounds it; `--disable-cuda-graph` avoids it).
shadow (a BF16 pool copy the KV pool must keep in sync) and native_fp8 (FlashInfer FP8 MLA plans) are
not offered here. Which strategies are is declared by each strategy: register(sglang="module:function")
names the function returning its backend class (gather_cast: `gather_cast_backend_class` below).
"""

from __future__ import annotations

import importlib

import torch

from harness.errors import HarnessError
from harness.strategies import REGISTRY
from harness.strategies import SGLANG as SUPPORTED  # the baseline and every register(sglang=...) strategy
from harness.strategies.gather_cast import _gather_cast


class _CompactPool:
    """The KV pool as the backend sees it: during decode, a layer's buffer is the step's rows only."""

    def __init__(self, pool, backend):
        self._pool, self._backend = pool, backend

    def __getattr__(self, name):
        return getattr(self._pool, name)

    def get_key_buffer(self, layer_id: int):
        buf = self._pool.get_key_buffer(layer_id)
        rows = self._backend.gather_rows
        if not self._backend.in_decode or rows is None:
            return buf
        compact = torch.empty((rows.numel(), *buf.shape[1:]), dtype=torch.bfloat16, device=buf.device)
        return _gather_cast(buf.view(torch.uint8), rows, compact)


class _RemapPlan:
    """A decode wrapper whose `plan` sees sequential rows; the pool rows go to the backend."""

    def __init__(self, wrapper, backend):
        self._wrapper, self._backend = wrapper, backend

    def __getattr__(self, name):
        return getattr(self._wrapper, name)

    def plan(self, qo_indptr, kv_indptr, kv_indices, *args, **kwargs):
        self._backend.gather_rows = kv_indices
        return self._wrapper.plan(qo_indptr, kv_indptr, self._backend.sequential(kv_indices.numel(), kv_indices.device), *args, **kwargs)


def gather_cast_backend_class():
    """SGLang's FlashInferMLAAttnBackend with the gather_cast decode path."""
    from sglang.srt.layers.attention.flashinfer_mla_backend import FlashInferMLAAttnBackend

    class GatherCastMLABackend(FlashInferMLAAttnBackend):
        harness_strategy = "gather_cast"

        def __init__(self, model_runner, *args, **kwargs):
            super().__init__(model_runner, *args, **kwargs)
            self.harness_attach()

        def harness_attach(self) -> None:
            """Wrap the pool and the decode planner (split from __init__ so tests can build the object bare)."""
            self.gather_rows, self.in_decode, self._sequential = None, False, None
            self.token_to_kv_pool = _CompactPool(self.token_to_kv_pool, self)
            updater = self.indices_updater_decode
            begin = updater.call_begin_forward
            updater.call_begin_forward = lambda wrapper, *a, **kw: begin(_RemapPlan(wrapper, self), *a, **kw)

        def sequential(self, n: int, device) -> torch.Tensor:
            """int32 [0, n) in one grown-once buffer (stable storage for a captured graph)."""
            if self._sequential is None or self._sequential.numel() < n:
                self._sequential = torch.arange(max(n, 1), dtype=torch.int32, device=device)
            return self._sequential[:n]

        def forward_decode(self, *args, **kwargs):
            self.in_decode = True
            try:
                return super().forward_decode(*args, **kwargs)
            finally:
                self.in_decode = False

    return GatherCastMLABackend


def install(strategy: str) -> None:
    """Make SGLang's "flashinfer" attention backend run `strategy` for MLA models in this process."""
    if strategy not in SUPPORTED:
        raise HarnessError("--strategy", f"the SGLang driver runs {', '.join(SUPPORTED)}, not {strategy!r}")
    if REGISTRY[strategy].baseline:
        return  # SGLang's own path
    from sglang.srt.layers.attention import attention_registry as registry

    module, _, function = REGISTRY[strategy].sglang.partition(":")
    original = registry.ATTENTION_BACKENDS["flashinfer"]
    cls = getattr(importlib.import_module(module), function)()

    def create(runner):
        return cls(runner) if runner.use_mla_backend else original(runner)

    registry.ATTENTION_BACKENDS["flashinfer"] = create
