"""sglang_flashinfer and sglang_fa3: the installed SGLang's own MLA decode backends as strategies.

sglang_flashinfer runs SGLang's FlashInferMLAAttnBackend on the harness's pool (zero copy) and steps
(harness.integrations.sglang.flashinfer_mla): its request table, its decode indices updater and
Triton kv-indices kernel, its forward_decode (the new tokens' KV write through its pool's set_mla_kv_buffer,
the whole-layer cast and the FlashInfer wrapper) and,
for CUDA graphs, its own capture/replay metadata methods. With the same FlashInfer kernel it must
equal `stock` bit for bit: the proof that stock is SGLang. On the torch backend (CPU CI) the
harness's torch attention answers the wrapper's calls. attn_us is its whole forward_decode per layer
(its cast, or whatever a patch does instead, included: SGLang's function is not split) without the KV
write (timed calls hand it no new tokens, as stock's attn_us leaves its write out); no cast_us.

sglang_fa3 names SGLang's FlashAttentionBackend, whose FA3 kernels live in sgl_kernel.flash_attn:
it reports why it cannot run (no SGLang, the sgl_kernel stand-in, no adapter yet), never skips silently.

Neither is benchmarked by default (register(benchmark=False)): asv and `tpot` must not need SGLang."""

from __future__ import annotations

import os

import torch

from harness.envvars import triton_interpreted
from harness.integrations.sglang import runtime, stand_in, wrappers
from harness.integrations.sglang.flashinfer_mla import FlashInferMLA
from harness.spec.faults import Fault
from harness.strategies.base import Strategy, register

SGLANG_KERNEL_SM90 = "fa3"  # what FlashInfer's backend="auto" (SGLang's wrappers) plans on SM90 (ordered_sm90_backends)


@register("sglang_flashinfer", order=70, devices=("cpu", "cuda"), kv_dtype=torch.bfloat16, tier="bitwise",
          backends=("flashinfer", "torch"), faults=(Fault.REQ_TO_TOKEN_OFF_BY_ONE,), benchmark=False)
class SGLangFlashInfer(Strategy):
    runs_sglang = True
    cast_untimed = ("the installed SGLang's forward_decode casts (or, patched, does not) inside itself: "
                    "timed with the attention in attn_us, never apart")
    unmodelled = ("the installed SGLang's code, not the harness's model of stock, decides what it moves and allocates: "
                  "only measured figures are reported (peak_bytes on CUDA)")

    @classmethod
    def unsupported_reason(cls, device, backend):
        if reason := super().unsupported_reason(device, backend):
            return reason
        if reason := runtime.import_reason(runtime.MLA_BACKEND):
            return f"{cls.name}: {reason}"
        if device.type == "cpu" and not triton_interpreted(os.environ.get("TRITON_INTERPRET")):
            return f"{cls.name}: SGLang's Triton kv-indices kernel needs TRITON_INTERPRET=1 on the CPU (set before triton is imported)"
        if backend.name.startswith("flashinfer") and torch.cuda.get_device_capability(device) == (9, 0) \
                and backend.kernel != SGLANG_KERNEL_SM90:
            return f"{cls.name}: SGLang's FlashInfer wrappers (backend='auto') run {SGLANG_KERNEL_SM90} on SM90, not {backend.kernel}"
        return None

    @classmethod
    def extra_bytes(cls, geometry, schedule) -> int:
        return geometry.layer_bytes * 2  # the memory plan's estimate: forward_decode's BF16 layer, as stock (not reported)

    def setup(self, schedule):
        flashinfer = self.backend.name.startswith("flashinfer")
        runtime.load(runtime.MLA_BACKEND)  # before any other SGLang import: a broken SGLang's error names it and its module
        self._rank = runtime.single_rank()
        self._rank.__enter__()
        try:
            self.sgl = FlashInferMLA(self.name, self.pool, self.preset, schedule, self.faults,
                                     wrapper=None if flashinfer else (lambda workspace: wrappers.BackendWrapper(self.backend)),
                                     kernel=self.backend.kernel if flashinfer else None)
        except BaseException:
            self._rank.__exit__(None, None, None)
            raise
        self._kv_dtypes = self.sgl.kv_dtypes  # what forward_decode hands the kernel, kept past teardown for run_tier
        self._graphs_ok = flashinfer
        self._none = torch.empty((0, 1, self.preset.row_width), dtype=torch.bfloat16, device=self.device)
        self._layer, self._new = 0, None

    def run_tier(self):
        """bitwise (equal to stock) while SGLang handed the kernel BF16 KV, its cast as stock's; tolerance (the
        golden check alone, native_fp8's policy) once a patched forward_decode attended on the FP8 pool itself."""
        return "tolerance" if torch.float8_e4m3fn in self._kv_dtypes else "bitwise"

    def teardown(self):
        del self.sgl, self._none, self._new
        self._rank.__exit__(None, None, None)

    def begin_step(self, batch, graph_capacity=None):
        if graph_capacity is not None and self.device.type == "cuda" and not self._graphs_ok:
            raise RuntimeError("SGLang's CUDA-graph path plans FlashInfer's own wrapper: run it on the flashinfer backend")
        return self.sgl.begin(batch, graph_capacity)

    def replan_step(self, plan, batch):
        self.sgl.replan(plan, batch)

    def write(self, batch, layer, slots, codes):
        """Kept for the layer's attend: SGLang's forward_decode writes it through its pool (save_kv_cache), handed
        the codes' BF16 values, whose cast stores the same bytes as the harness's write (all 256 codes, NaNs too)."""
        self._new = (layer, slots, wrappers.codes_as_bf16(codes))

    def cast_call(self, layer):
        """Nothing: SGLang's forward_decode reads the pool itself (what a harness cast would time is not SGLang's)."""
        self._layer = layer  # the layer the next attend runs (forward_decode takes the layer, not its KV)
        return _no_kv, (self._none,)

    def prepare_kv(self, layer):
        """No KV here: SGLang's forward_decode casts the layer itself (LSETap checks what it hands FlashInfer)."""
        self._layer = layer
        return self.split(self._none)

    def attend(self, plan, q_nope, q_pe, kv):
        new, self._new = self._new, None
        if new is not None and new[0] != self._layer:
            raise RuntimeError(f"layer {new[0]}'s KV write is pending at layer {self._layer}'s attend")
        return self.sgl.attend(plan, self._layer, q_nope, q_pe, new[1:] if new else None)


def _no_kv(empty: torch.Tensor) -> torch.Tensor:
    return empty


@register("sglang_fa3", order=80, devices=("cuda",), kv_dtype=torch.bfloat16, tier="tolerance", benchmark=False)
class SGLangFA3(Strategy):
    runs_sglang = True

    @classmethod
    def unsupported_reason(cls, device, backend):
        if reason := super().unsupported_reason(device, backend):
            return reason
        if reason := runtime.import_reason(runtime.FA3_BACKEND):
            return f"{cls.name}: {reason}"
        if stand_in.is_stand_in("sgl_kernel.flash_attn"):
            return (f"{cls.name}: FlashAttentionBackend's FA3 kernels live in sgl_kernel.flash_attn, and sgl_kernel here is "
                    "the harness's import-time stand-in (install the sgl-kernel wheel)")
        return cls.runner_reason()

    @classmethod
    def runner_reason(cls):
        return f"{cls.name}: no adapter for FlashAttentionBackend yet"  # whatever SGLang or sgl_kernel is installed
