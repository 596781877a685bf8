"""`python -m ci.experiments.fused_variants timeline OUT.json`: where a launch's time goes, CTA by CTA.

Each variant is built with DIAG_CLOCK=1 (harness/kernels/fused_mla_cuda.cu): thread 0 of every CTA records
the globaltimer at entry, before and past the wait on the previous kernel, when Q is in shared memory, when its
first tile has landed, past its last tile, when it has published its partial output to its request's other splits
and once they all have (merges across CTAs), and at exit, and the SM clocks its tile loop spent waiting for tiles. One replay of the timer's graph (every
layer's launch, after warm replays) is read back; per launch (a layer's pool, and the cluster launch apart from
the one beside it) the CTAs' phases are summarized over every layer: start skew (entry after the layer's first
CTA), issue (index loads and the early tile loads), wait, q (Q's loads), first tile, loop (and its share spent
waiting), tail (epilogue and merge: publish, siblings (waiting for the request's other splits), merge), end skew
(exit before the layer's last CTA); per layer its span (first entry to last exit), period (to the next layer's first
entry), gap (its last exit to the next layer's first entry: negative where that starts before it ends) and release
(its last exit to the next layer's first CTA past its wait: the dependent launch's release).
"""

from __future__ import annotations

import ctypes
import statistics

import numpy as np
import torch

from harness.kernels.fused_mla_cuda import WAIT_PRIOR  # merge_mode flag of the launch beside the cluster launch

MARKS, RECORDS = 9, 16384  # DIAG_MARKS, DIAG_RECORDS in the .cu file
WORDS = 3 + MARKS
PHASES = ("issue", "wait", "q", "first_tile", "loop", "publish", "siblings", "merge")  # between consecutive marks
LOOP_END = 1 + PHASES.index("loop")  # the mark past the last tile


def _driver(name: str, *args) -> None:
    """The CUDA driver call `name`(*args), raising on an error."""
    from torch.cuda._utils import _get_gpu_runtime_library

    err = getattr(_get_gpu_runtime_library(), name)(*args)
    if err:
        raise RuntimeError(f"{name} failed with CUDA error {err}")


def _global(kernel, name: str) -> ctypes.c_uint64:
    """The device address of the kernel module's __device__ variable `name`."""
    ptr, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    try:
        _driver("cuModuleGetGlobal_v2", ctypes.byref(ptr), ctypes.byref(size), kernel.module, name.encode())
    except RuntimeError as exc:
        raise RuntimeError(f"{exc} for {name}: was the kernel built with DIAG_CLOCK=1?") from None
    return ptr


def reset(kernel) -> None:
    """Zero the record count (after the stream's work is done)."""
    torch.cuda.synchronize()
    _driver("cuMemsetD32_v2", _global(kernel, "diag_count"), ctypes.c_uint(0), ctypes.c_size_t(1))


def read(kernel) -> np.ndarray:
    """The records written since the last reset: uint64 [n, WORDS]."""
    torch.cuda.synchronize()
    count = ctypes.c_uint32(0)
    _driver("cuMemcpyDtoH_v2", ctypes.byref(count), _global(kernel, "diag_count"), ctypes.c_size_t(4))
    if count.value > RECORDS:
        raise RuntimeError(f"{count.value} CTAs recorded, the kernel keeps {RECORDS}: time fewer layers (--layers)")
    out = np.zeros((count.value, WORDS), dtype=np.uint64)
    if count.value:
        _driver("cuMemcpyDtoH_v2", out.ctypes.data_as(ctypes.c_void_p), _global(kernel, "diag_clock"),
                ctypes.c_size_t(out.nbytes))
    return out


def _stats(values) -> dict:
    v = sorted(values)
    if not v:
        return {}
    q = lambda f: v[min(len(v) - 1, int(f * (len(v) - 1) + 0.5))]  # noqa: E731
    return {"median": statistics.median(v), "p10": q(0.1), "p90": q(0.9), "max": v[-1]}


def summarize(records: np.ndarray) -> dict:
    """Per launch kind ("main", "beside" for the WAIT_PRIOR launch) the CTAs' phases in µs over every layer, and
    the layers' spans and periods (timer_step_ns: the finest step between two timestamps, the globaltimer's
    resolution as seen); `last` holds the phases of each layer's last CTA to exit."""
    r = records.astype(np.int64)
    key, ids, t, clocks = r[:, 0], r[:, 1], r[:, 2:2 + MARKS], records[:, 2 + MARKS]
    kind = np.where((ids >> 32) & WAIT_PRIOR, "beside", "main")
    tiles = (ids >> 40) & 0xFFFF
    smid = (ids >> 24) & 0xFF
    wait_clk, loop_clk = (clocks & 0xFFFFFFFF).astype(np.float64), (clocks >> np.uint64(32)).astype(np.float64)
    layers = {}
    for k in np.unique(key):
        m = key == k
        layers[int(k)] = (t[m, 0].min(), t[m, -1].max())
    start = np.array([layers[int(k)][0] for k in key])
    end = np.array([layers[int(k)][1] for k in key])
    phases = {"start_skew": t[:, 0] - start, **{name: t[:, i + 1] - t[:, i] for i, name in enumerate(PHASES)},
              "tail": t[:, -1] - t[:, LOOP_END], "end_skew": end - t[:, -1]}
    stamps = np.unique(t)
    doc = {"ctas": int(len(r)), "layers": len(layers), "sms": int(len(np.unique(smid))),
           "timer_step_ns": int(np.diff(stamps).min()) if len(stamps) > 1 else None, "kinds": {}}
    for kd in ("main", "beside"):
        m = kind == kd
        if not m.any():
            continue
        row = {name: _stats((v[m] / 1e3).tolist()) for name, v in phases.items()}
        row["ctas_per_layer"] = int(m.sum()) // len(layers)
        row["tiles"] = _stats(tiles[m].tolist())
        row["loop_waiting_share"] = _stats((wait_clk[m] / np.maximum(loop_clk[m], 1)).tolist())
        doc["kinds"][kd] = row
    last = np.array([int(np.argmax(np.where(key == k, t[:, -1], -1))) for k in layers])
    doc["last"] = {name: _stats((v[last] / 1e3).tolist()) for name, v in phases.items()}
    doc["last"]["kind_beside"] = int((kind[last] == "beside").sum())
    order = sorted(layers, key=lambda k: layers[k][0])
    starts = [layers[k][0] for k in order]
    past_wait = {k: t[(key == k) & (kind == "main"), 2].min() for k in order}
    doc["layer_span_us"] = _stats([(e - s) / 1e3 for s, e in layers.values()])
    doc["layer_period_us"] = _stats([(b - a) / 1e3 for a, b in zip(starts, starts[1:])])
    doc["layer_gap_us"] = _stats([(layers[b][0] - layers[a][1]) / 1e3 for a, b in zip(order, order[1:])])
    doc["layer_release_us"] = _stats([(past_wait[b] - layers[a][1]) / 1e3 for a, b in zip(order, order[1:])])
    return doc
