"""The CUDA fused FP8 MLA decode (fused_mla_cuda.cu), compiled at run time by NVRTC.

`fused_mla_decode` computes the splits' partial outputs (or, with one split, the final ones); it
streams 64-token tiles through a `stages`-deep shared-memory ring, a tile whose rows are one run
of consecutive pool rows (a page) by one bulk copy, any other by one bulk copy per row (whole
576-byte rows, sm_90+) or cp.async row gathers; see the .cu file for the data flow. The splits are merged (MERGES) by the last CTA of each request (given
arrival counters), by all of them at once, each a slice of the channels, once they have all arrived
(a launch of one wave: `grid`), inside a thread-block cluster of the request's CTAs through distributed shared
memory (sm_90+; requests past one wave of clusters run in a launch beside it, `wave_split`), or
by `fused_mla_merge`, on sm_90+ a programmatic dependent launch
(cuLaunchKernelEx) whose CTAs are resident before the first kernel drains and only wait for its
writes. It needs sm_89 or newer (cvt e4m3x2 -> f16x2) and uses no headers, so NVRTC
(harness.kernels.nvrtc) compiles it for any such arch, GPU or not (`compile_cubin`; the CPU CI builds
every instance for sm_89, sm_90 and sm_120), with no CUDA toolkit.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import itertools
from pathlib import Path

import torch

from harness.errors import HarnessError

SOURCE = Path(__file__).with_name("fused_mla_cuda.cu")
SOURCE_CACHES = ("_kernel", "_slots", "_wave", "_merge_kernel")  # the functools caches of what was built from SOURCE
TILE, ROW, QROW, SROW, PROW, IR, BARS = 64, 576, 580, 68, 72, 16, 64  # as #defined in the .cu file
WARPS = (8, 16)
HEADS_PER_CTA = (8, 16)  # one n-tile of 8 heads, or two
D_CKV, D_KPE = 512, 64
STAGES = (2, 3, 4, 5)
PING_PONG_STAGES = (2,)  # two groups' rings of 2 (4 slots); 3 each do not fit 227 KB
MIN_ARCH = (8, 9)
PDL_ARCH = (9, 0)  # griddepcontrol (programmatic dependent launch), thread-block clusters
MERGE_BATCH = 16   # fused_mla_merge: splits whose loads are in flight at once
_CLUSTER_ATTRIBUTE = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
_PDL_ATTRIBUTE = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
MERGES = ("kernel", "cta", "cluster", "grid")  # the .cu file's merge_mode values 0, 1, 2, 3
WAIT_PRIOR = 4  # merge_mode flag: the launch waits for the one it runs beside before it exits
INDICES_READY = 8  # merge_mode flag: the indices were written before the previous kernel started
MAX_REST_SPLITS = 16  # splits per request of the launch beside a wave of clusters (wave_split)
CLUSTER_SPLITS = (2, 4, 8)  # a cluster merge: portable cluster sizes that divide the 512 channels
OPTIONS = ("-std=c++17",)  # NVRTC's, beside the target arch


def heads_per_cta(num_heads: int) -> int:
    """Heads per CTA: one n-tile of 8 when they fit, else two (head groups of 16)."""
    return 8 if num_heads <= 8 else 16


@dataclasses.dataclass(frozen=True)
class Instance:
    """One instance of the decode kernel template: heads per CTA, ring depth, warps, and `pp` (ping_pong: 16
    warps as two groups of 8, each streaming every other tile through its own ring of `stages` slots, merged in
    shared memory)."""

    nh: int
    stages: int
    warps: int
    pp: bool = False

    def __post_init__(self):
        if self.stages not in STAGES or self.nh not in HEADS_PER_CTA or self.warps not in WARPS:
            raise ValueError(f"stages must be one of {STAGES}, heads per CTA 8 or 16 and warps one of {WARPS}, "
                             f"got {self.stages}, {self.nh}, {self.warps}")
        if self.pp and (self.warps != 16 or self.stages not in PING_PONG_STAGES):
            raise ValueError(f"ping_pong is 16 warps and rings of {PING_PONG_STAGES} stages, got {self.warps} warps, "
                             f"{self.stages} stages")

    @property
    def name(self) -> str:
        return f"fused_mla_decode<{self.nh}, {self.stages}, {self.warps}, {str(self.pp).lower()}>"

    @property
    def smem(self) -> int:
        """Dynamic shared memory of one CTA: the KV ring(s) and their barriers, the index ring(s), Q (fp16),
        and per group partial logits, P, softmax state."""
        groups = 2 if self.pp else 1
        warps = self.warps // groups
        return (groups * self.stages * TILE * ROW + BARS + groups * IR * TILE * 4 + self.nh * QROW * 2
                + groups * ((warps // 4) * self.nh * SROW * 4 + self.nh * PROW * 2 + 3 * self.nh * 4))


def instances() -> list[Instance]:
    """Every instance fused_fp8 can launch."""
    out = []
    for nh, warps, stages, pp in itertools.product(HEADS_PER_CTA, WARPS, STAGES, (False, True)):
        try:
            out.append(Instance(nh, stages, warps, pp))
        except ValueError:
            pass
    return out


def arrival_slots(batch: int, num_heads: int) -> int:
    """Arrival counters a CTA-merge launch needs: one per (request, group of 8 heads), enough for
    either CTA head group (8 or 16 heads)."""
    return batch * -(-num_heads // 8)


MERGE_KERNEL = f"fused_mla_merge<{MERGE_BATCH}>"


def compile_cubin(instance: Instance, arch: str) -> tuple[bytes, str]:
    """(cubin, lowered kernel name) of the decode kernel for sm_<arch>, e.g. arch "90" or "120"."""
    return _compile(instance.name, arch)


def compile_merge_cubin(arch: str) -> tuple[bytes, str]:
    """(cubin, lowered kernel name) of the split merge kernel for sm_<arch>."""
    return _compile(MERGE_KERNEL, arch)


def _compile(name: str, arch: str) -> tuple[bytes, str]:
    from harness.kernels import nvrtc

    built = nvrtc.build(SOURCE.read_text(), [name], arch, OPTIONS, SOURCE.name)
    return built.cubin, built.lowered[name]


def _props(device_index: int):
    props = torch.cuda.get_device_properties(device_index)
    if (props.major, props.minor) < MIN_ARCH:
        raise HarnessError("fused_fp8", f"the CUDA kernel needs sm_89 or newer, {props.name} is sm_{props.major}{props.minor}")
    return props


def _load(name: str, device_index: int):
    from torch.cuda._utils import _cuda_load_module

    props = _props(device_index)
    with torch.cuda.device(device_index):
        cubin, lowered = _compile(name, f"{props.major}{props.minor}")
        return _cuda_load_module(cubin, [lowered])[lowered]


@functools.cache
def _kernel(instance: Instance, device_index: int):
    props = _props(device_index)
    need = instance.smem
    if need > props.shared_memory_per_block_optin:
        raise HarnessError("fused_fp8", f"{instance.name} needs {need} bytes of shared memory per CTA, "
                                        f"{props.name} allows {props.shared_memory_per_block_optin}")
    kernel = _load(instance.name, device_index)
    with torch.cuda.device(device_index):
        kernel.set_shared_memory_config(need)
    return kernel


@functools.cache
def dependent_launches(device_index: int) -> bool:
    """Whether the device runs programmatic dependent launches and thread-block clusters (sm_90+)."""
    props = torch.cuda.get_device_properties(device_index)
    return (props.major, props.minor) >= PDL_ARCH


@functools.cache
def _merge_kernel(device_index: int):
    """(the merge kernel, whether this device launches it as a programmatic dependent launch)."""
    return _load(MERGE_KERNEL, device_index), dependent_launches(device_index)


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_PDL = ((_PDL_ATTRIBUTE, (1,)),)


def _launch_config(grid: tuple[int, int, int], block: int, shared_mem: int, attributes: tuple[tuple[int, tuple[int, ...]], ...],
                   stream) -> _LaunchConfig:
    """A CUlaunchConfig with launch `attributes` ((id, its leading ints), ...); it keeps them alive."""
    attrs = (_LaunchAttribute * len(attributes))()
    for attr, (attribute, values) in zip(attrs, attributes):
        attr.id = attribute
        for i, v in enumerate(values):
            attr.value[i] = v
    config = _LaunchConfig(grid=(ctypes.c_uint * 3)(*grid), block=(ctypes.c_uint * 3)(block, 1, 1), shared_mem=shared_mem,
                           stream=stream, attrs=ctypes.cast(attrs, ctypes.POINTER(_LaunchAttribute)), num_attrs=len(attributes))
    config.keep = attrs
    return config


def _launch_ex(kernel, grid: tuple[int, int, int], block: int, shared_mem: int, args: list,
               attributes: tuple[tuple[int, tuple[int, ...]], ...]) -> None:
    """cuLaunchKernelEx of `kernel` on the current stream with launch `attributes` ((id, its leading
    ints), ...). args: tensors, ints and floats (double)."""
    from torch.cuda._utils import _get_gpu_runtime_library

    params_values = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else
                     ctypes.c_double(a) if isinstance(a, float) else ctypes.c_int(a) for a in args]
    params = (ctypes.c_void_p * len(params_values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in params_values])
    config = _launch_config(grid, block, shared_mem, attributes, torch.cuda.current_stream().cuda_stream)
    err = _get_gpu_runtime_library().cuLaunchKernelEx(ctypes.byref(config), kernel.func, params, None)
    if err:
        raise RuntimeError(f"cuLaunchKernelEx (launch attributes {[a for a, _ in attributes]}) failed with CUDA error {err}")


def wave_split(batch: int, groups: int, num_splits: int, max_clusters: int, slots: int) -> tuple[int, int]:
    """(requests in the cluster launch, splits per request of the launch beside it) for a cluster
    merge of `batch` requests of `groups` head groups (a cluster each) when the device holds
    `max_clusters` clusters of `num_splits` CTAs and `slots` CTAs at once. Requests past one wave
    of clusters (b32-l4096 on an H200: 30 of 32) would otherwise run in a second wave; they run
    beside the first instead, each split over the slots the clusters leave free (at most
    MAX_REST_SPLITS and what partial buffers of `batch` x `num_splits` splits hold) and merged by
    its last CTA, provided that gives them at least num_splits splits: with fewer, each of their
    CTAs would stream more than a cluster's and finish last (b40-l4096 on an H200: 10 requests at 2
    splits, 81.8 µs against 42.6 for the second wave). (batch, 0): one launch of all the clusters."""
    head = min(batch, max_clusters // groups)
    rest = batch - head
    free = (slots - head * groups * num_splits) // (rest * groups) if rest else 0
    if free < num_splits:
        return batch, 0
    return head, min(MAX_REST_SPLITS, batch * num_splits // rest, free)


@functools.cache
def _slots(instance: Instance, device_index: int) -> int:
    """CTAs of the decode kernel the device holds at once."""
    from torch.cuda._utils import _get_gpu_runtime_library

    cu, kernel, per_sm = _get_gpu_runtime_library(), _kernel(instance, device_index), ctypes.c_int(0)
    with torch.cuda.device(device_index):
        err = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(per_sm), kernel.func, 32 * instance.warps,
                                                             instance.smem)
    if err:
        raise RuntimeError(f"the decode kernel's occupancy query failed with CUDA error {err}")
    return per_sm.value * torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _wave(instance: Instance, num_splits: int, device_index: int) -> tuple[int, int]:
    """(clusters of num_splits CTAs, CTAs) of the decode kernel the device holds at once."""
    from torch.cuda._utils import _get_gpu_runtime_library

    cu, kernel = _get_gpu_runtime_library(), _kernel(instance, device_index)
    config = _launch_config((num_splits, 1, 1), 32 * instance.warps, instance.smem,
                            ((_CLUSTER_ATTRIBUTE, (num_splits, 1, 1)),), None)
    clusters = ctypes.c_int(0)
    with torch.cuda.device(device_index):
        err = cu.cuOccupancyMaxActiveClusters(ctypes.byref(clusters), kernel.func, ctypes.byref(config))
    if err:
        raise RuntimeError(f"the decode kernel's cluster occupancy query failed with CUDA error {err}")
    return clusters.value, _slots(instance, device_index)


def grid_merges(num_splits: int, ctas: int, slots: int) -> bool:
    """Whether a launch of `ctas` CTAs, `num_splits` per request and head group, can merge them all at once
    (merge_by "grid"): every split takes 512 / num_splits channels (whole 4-channel chunks) and, since each
    waits for its request's other splits, every CTA of the launch must be resident at once (one wave; the
    occupancy query counts the whole GPU, so an MPS SM limit is not allowed for)."""
    return num_splits > 1 and D_CKV % (4 * num_splits) == 0 and ctas <= slots


def whole_rows(ckv2, kpe2) -> bool:
    """Whether ckv2 / kpe2 are the two parts of one buffer of 576-byte rows (kpe right after ckv), so
    that a run of consecutive pool rows is one contiguous block the kernel can bulk-copy."""
    return ckv2.stride(0) == kpe2.stride(0) == ROW and kpe2.data_ptr() == ckv2.data_ptr() + D_CKV


def decode(q_nope, q_pe, ckv2, kpe2, kv_indptr, kv_indices, part_out, part_lse, arrivals, out, lse,
           scale_log2: float, kv_scale: float, num_splits: int, instance: Instance, merge_by: str,
           indices_ready: bool = False, new_tokens: int | None = None) -> None:
    """fused_mla_decode over (num_splits, batch, head groups), writing out and lse. With more than
    one split, `merge_by` (one of MERGES) says who merges them: "cta" the last CTA per request
    (counting in `arrivals`: `arrival_slots` zeros, left at zero), "grid" all of them, a slice of the
    channels each, once they have all arrived (the same counters; a launch that is not one wave, see
    `grid_merges`, is merged the "cta" way instead), "cluster" the request's CTAs as
    one thread-block cluster (sm_90+, num_splits in CLUSTER_SPLITS; requests past one wave of
    clusters in a launch beside it, see `wave_split`), "kernel" `merge` after it.
    On sm_90+ each launch is a programmatic dependent of the stream's previous kernel and waits for
    it before reading anything; with `indices_ready` (kv_indptr / kv_indices were written before that
    kernel started, as a plan filled before the step's kernels is) after reading the indices, and with
    `new_tokens` too (the kernels still running when it starts may write each request's last `new_tokens` KV
    rows, no other: a decode step's new token, written right before its attention) after issuing its first
    tiles' loads of the rows before them, the next tiles' index loads and an L2 prefetch of Q's lines (Q itself is
    loaded after the wait).
    `instance`: the kernel instance (Config.cuda_instance). Other arguments as in
    harness.kernels.fused_mla_decode (ckv2 / kpe2: the pool's uint8 rows as 2-D views)."""
    batch, heads, _ = q_nope.shape
    for name, t in (("q_nope", q_nope), ("q_pe", q_pe)):
        if t.data_ptr() % 8 or t.stride(0) % 4 or t.stride(1) % 4:
            raise ValueError(f"{name}: the CUDA kernel loads 4 channels at a time (8-byte aligned rows)")
    for name, t in (("ckv", ckv2), ("kpe", kpe2)):
        if t.data_ptr() % 16 or t.stride(0) % 16:
            raise ValueError(f"{name}: the CUDA kernel gathers 16-byte chunks (16-byte aligned rows)")
    if ckv2.shape[1] != D_CKV or kpe2.shape[1] != D_KPE:
        raise ValueError(f"the CUDA kernel is built for {D_CKV} + {D_KPE} channels, got {ckv2.shape[1]} + {kpe2.shape[1]}")
    cluster = merge_by == "cluster" and num_splits > 1
    if cluster and num_splits not in CLUSTER_SPLITS:
        raise ValueError(f"a cluster merge takes {CLUSTER_SPLITS} splits, got {num_splits}")
    if instance.nh != heads_per_cta(heads):
        raise ValueError(f"{instance.name} takes {instance.nh} heads per CTA, {heads} heads need {heads_per_cta(heads)}")
    device_index = q_nope.device.index if q_nope.device.index is not None else torch.cuda.current_device()
    pdl = dependent_launches(device_index)
    if cluster and not pdl:
        raise ValueError("a cluster merge needs sm_90 or newer (thread-block clusters)")
    kernel = _kernel(instance, device_index)
    block, smem, groups = 32 * instance.warps, instance.smem, -(-heads // instance.nh)
    whole = int(whole_rows(ckv2, kpe2))
    early_after = new_tokens if indices_ready and new_tokens is not None else -1  # the kernel's new_tokens: -1 loads none early

    def args(lo: int, hi: int, splits: int, mode: int) -> list:  # requests lo .. hi-1
        q_n, q_p, o, ls = q_nope[lo:hi], q_pe[lo:hi], out[lo:hi], lse[lo:hi]
        mode |= INDICES_READY if indices_ready else 0
        return [q_n, q_p, ckv2, kpe2, kv_indptr[lo:], kv_indices, part_out, part_lse, arrivals, o, ls,
                q_n.stride(0), q_n.stride(1), q_p.stride(0), q_p.stride(1), ckv2.stride(0), kpe2.stride(0),
                o.stride(0), o.stride(1), ls.stride(0), heads, splits, mode, whole, early_after, float(scale_log2), float(kv_scale)]

    def launch(grid: tuple[int, int, int], kernel_args: list, attributes=()) -> None:
        if pdl:
            _launch_ex(kernel, grid, block, smem, kernel_args, attributes + _PDL)
        else:
            kernel(grid=grid, block=(block, 1, 1), shared_mem=smem, args=kernel_args)

    if merge_by == "grid" and not grid_merges(num_splits, num_splits * batch * groups, _slots(instance, device_index)):
        merge_by = "cta"
    if not cluster:
        launch((num_splits, batch, groups), args(0, batch, num_splits, MERGES.index(merge_by)))
        if num_splits > 1 and merge_by == "kernel":
            merge(part_out, part_lse, out, lse, kv_scale)
        return
    head, rest_splits = wave_split(batch, groups, num_splits, *_wave(instance, num_splits, device_index))
    if head:
        launch((num_splits, head, groups), args(0, head, num_splits, MERGES.index("cluster")),
               ((_CLUSTER_ATTRIBUTE, (num_splits, 1, 1)),))
    if head < batch:  # beside the clusters: placed once they all are (PDL), waits for them at its end
        launch((rest_splits, batch - head, groups), args(head, batch, rest_splits, MERGES.index("cta") | (WAIT_PRIOR if head else 0)))


def merge(part_out, part_lse, out, lse, kv_scale: float) -> None:
    """fused_mla_merge over (batch, heads): out bf16 [B, H, 512] and lse [B, H] (natural log) from
    the splits' part_out fp16 [B, S, H, 512] (before kv_scale) and base-2 part_lse fp32 [B, S, H];
    on sm_90+ a programmatic dependent launch of the kernel before it on the stream."""
    batch, num_splits, heads, _ = part_out.shape
    device_index = out.device.index if out.device.index is not None else torch.cuda.current_device()
    kernel, dependent = _merge_kernel(device_index)
    args = [part_out, part_lse, out, lse, out.stride(0), out.stride(1), lse.stride(0), heads, num_splits, float(kv_scale)]
    if dependent:
        _launch_ex(kernel, (batch, heads, 1), D_CKV // 4, 0, args, _PDL)
    else:
        kernel(grid=(batch, heads, 1), block=(D_CKV // 4, 1, 1), args=args)
