"""The CUDA fused FP8 MLA decode (fused_mla_cuda.cu), compiled at run time by NVRTC.

One launch computes what the two Triton stages of `fused_mla_decode` do: the splits' partial
outputs, merged by the last split of each request to finish. The kernel streams 64-token tiles
through a `stages`-deep shared-memory ring of cp.async gathers; see the .cu file for the data
flow. It needs sm_89 or newer (cvt e4m3x2 -> f16x2) and uses no headers, so NVRTC compiles it for
any such arch on a machine with a CUDA torch, GPU or not (`compile_cubin`); torch's NVRTC wrapper
still wants a CUDA toolkit directory (CUDA_HOME) for its include path, as FlashInfer's JIT does.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from harness.errors import HarnessError

SOURCE = Path(__file__).with_name("fused_mla_cuda.cu")
TILE, ROW, QROW, SROW = 64, 592, 592, 68  # as #defined in the .cu file
WARPS = (8, 16)
D_CKV, D_KPE = 512, 64
STAGES = (2, 3, 4, 5)
MIN_ARCH = (8, 9)


def heads_per_cta(num_heads: int) -> int:
    """Heads per CTA: one n-tile of 8 when they fit, else two (head groups of 16)."""
    return 8 if num_heads <= 8 else 16


def smem_bytes(nh: int, stages: int, warps: int) -> int:
    """Dynamic shared memory of one CTA: the KV ring, Q (fp16), partial logits, P, softmax state."""
    return stages * TILE * ROW + nh * QROW * 2 + (warps // 4) * nh * SROW * 4 + TILE * nh * 2 + 3 * nh * 4


def arrival_slots(batch: int, num_heads: int) -> int:
    """Arrival counters a split launch needs: one per (request, group of 8 heads), enough for
    either CTA head group (8 or 16 heads)."""
    return batch * -(-num_heads // 8)


def fits(num_heads: int, stages: int, warps: int, smem_limit: int) -> bool:
    """Whether one CTA's shared memory fits a device's per-block limit (227 KB on an H200, 99 KB on
    sm_120)."""
    return smem_bytes(heads_per_cta(num_heads), stages, warps) <= smem_limit


def kernel_name(nh: int, stages: int, warps: int) -> str:
    return f"fused_mla_decode<{nh}, {stages}, {warps}>"


def compile_cubin(nh: int, stages: int, warps: int, arch: str) -> tuple[bytes, str]:
    """(cubin, lowered kernel name) for sm_<arch>, e.g. arch "90" or "120"."""
    from torch.cuda._utils import _nvrtc_compile

    if stages not in STAGES or nh not in (8, 16) or warps not in WARPS:
        raise ValueError(f"stages must be one of {STAGES}, heads per CTA 8 or 16 and warps one of {WARPS}, "
                         f"got {stages}, {nh}, {warps}")
    return _nvrtc_compile(SOURCE.read_text(), kernel_name(nh, stages, warps), arch, nvcc_options=["-std=c++17"])


@functools.cache
def _kernel(nh: int, stages: int, warps: int, device_index: int):
    from torch.cuda._utils import _cuda_load_module

    props = torch.cuda.get_device_properties(device_index)
    if (props.major, props.minor) < MIN_ARCH:
        raise HarnessError("fused_fp8", f"the CUDA kernel needs sm_89 or newer, {props.name} is sm_{props.major}{props.minor}")
    need = smem_bytes(nh, stages, warps)
    if need > props.shared_memory_per_block_optin:
        raise HarnessError("fused_fp8", f"{stages} stages need {need} bytes of shared memory per CTA, "
                                        f"{props.name} allows {props.shared_memory_per_block_optin}")
    with torch.cuda.device(device_index):
        cubin, name = compile_cubin(nh, stages, warps, f"{props.major}{props.minor}")
        kernel = _cuda_load_module(cubin, [name])[name]
        kernel.set_shared_memory_config(need)
    return kernel


def decode(q_nope, q_pe, ckv2, kpe2, kv_indptr, kv_indices, part_out, part_lse, arrivals, out, lse,
           scale_log2: float, kv_scale: float, num_splits: int, stages: int, warps: int) -> None:
    """One launch over (num_splits, batch, head groups) that writes out and lse; arguments as in
    fused_mla_decode (ckv2 / kpe2: the pool's uint8 rows as 2-D views; arrivals: `arrival_slots`
    zeros, left at zero)."""
    batch, heads, _ = q_nope.shape
    for name, t in (("q_nope", q_nope), ("q_pe", q_pe)):
        if t.data_ptr() % 8 or t.stride(0) % 4 or t.stride(1) % 4:
            raise ValueError(f"{name}: the CUDA kernel loads 4 channels at a time (8-byte aligned rows)")
    for name, t in (("ckv", ckv2), ("kpe", kpe2)):
        if t.data_ptr() % 16 or t.stride(0) % 16:
            raise ValueError(f"{name}: the CUDA kernel gathers 16-byte chunks (16-byte aligned rows)")
    if ckv2.shape[1] != D_CKV or kpe2.shape[1] != D_KPE:
        raise ValueError(f"the CUDA kernel is built for {D_CKV} + {D_KPE} channels, got {ckv2.shape[1]} + {kpe2.shape[1]}")
    nh = heads_per_cta(heads)
    device_index = q_nope.device.index if q_nope.device.index is not None else torch.cuda.current_device()
    kernel = _kernel(nh, stages, warps, device_index)
    kernel(grid=(num_splits, batch, -(-heads // nh)), block=(32 * warps, 1, 1), shared_mem=smem_bytes(nh, stages, warps),
           args=[q_nope, q_pe, ckv2, kpe2, kv_indptr, kv_indices, part_out, part_lse, arrivals, out, lse,
                 q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), ckv2.stride(0), kpe2.stride(0),
                 out.stride(0), out.stride(1), lse.stride(0), heads, num_splits, float(scale_log2), float(kv_scale)])
