"""TMA streaming probe (b32/b128 page tiles): 1-D bulk copy per page vs swizzled 2-D tensor-map boxes."""
import ctypes, sys, json
import torch
sys.path.insert(0, ".")
from torch.cuda._utils import _nvrtc_compile, _cuda_load_module, _get_gpu_runtime_library
from ci.tune_fused import page_indices, time_graph, SLOTS, PAGE

OUTFILE = sys.argv[1]
LAYERS = 78
dev = torch.device("cuda")
props = torch.cuda.get_device_properties(0)
arch = f"{props.major}{props.minor}"
src = open(".scratch/tma/tma_stream.cu").read()
cu = _get_gpu_runtime_library()

class Map(ctypes.Structure):
    _fields_ = [("v", ctypes.c_uint64 * 16)]

def encode(ptr, inner, rows, box_inner, swizzle):
    m = Map()
    dims = (ctypes.c_uint64 * 2)(inner, rows)
    strides = (ctypes.c_uint64 * 1)(576)
    box = (ctypes.c_uint32 * 2)(box_inner, 64)
    es = (ctypes.c_uint32 * 2)(1, 1)
    err = cu.cuTensorMapEncodeTiled(ctypes.byref(m), 0, 2, ctypes.c_void_p(ptr), dims, strides, box, es, 0, swizzle, 3, 0)
    assert err == 0, err
    return m

def load(name):
    cubin, low = _nvrtc_compile(src, name, arch, nvcc_options=["-std=c++17"])
    return _cuda_load_module(cubin, [low])[low]

def launch(k, grid, block, smem, args):
    vals = []
    for a in args:
        if isinstance(a, Map): vals.append(a)
        elif isinstance(a, torch.Tensor): vals.append(ctypes.c_void_p(a.data_ptr()))
        else: vals.append(ctypes.c_int(a))
    params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
    err = cu.cuLaunchKernel(k.func, grid[0], grid[1], grid[2], block, 1, 1, smem,
                            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), params, None)
    assert err == 0, err

pools = [torch.randint(0, 0x7E, (SLOTS + PAGE, 1, 576), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
maps = [(encode(p.data_ptr(), 512, SLOTS + PAGE, 128, 3), encode(p.data_ptr() + 512, 64, SLOTS + PAGE, 64, 2)) for p in pools]
sink = torch.zeros(1024, dtype=torch.int32, device=dev)
res = {}
def rec(k, v):
    res[k] = round(v, 2); print(k, res[k], flush=True)
for batch, kv_len in ((32, 4096), (128, 2048)):
    g = torch.Generator(device=dev).manual_seed(batch * 7919 + kv_len)
    indices = page_indices(batch, kv_len, g, dev)
    indptr = torch.arange(0, batch * kv_len + 1, kv_len, dtype=torch.int32, device=dev)
    tag = f"b{batch}-l{kv_len}"
    rec(f"{tag} floor_us@4241", batch * kv_len * 576 / 4241e9 * 1e6)
    for mode in (0, 1):
        for st, w, sps in ((2, 8, (8, 16) if batch == 32 else (2, 4)), (3, 8, (4, 8) if batch == 32 else (1, 2)),
                           (4, 8, (4, 8) if batch == 32 else (1, 2)), (5, 8, (4,) if batch == 32 else (1,))):
            k = load(f"tma_stream<{st}, {w}, {mode}>")
            smem = st * 64 * 576 + 8 * st + 4 * 1024
            k.set_shared_memory_config(smem)
            for splits in sps:
                def step():
                    for p, (mc, mk) in zip(pools, maps):
                        launch(k, (splits, batch, 1), 32 * w, smem, [mc, mk, p, indptr, indices, splits, sink])
                rec(f"{tag} mode{mode} st{st} w{w} s{splits}", time_graph(step) * 1e3 / LAYERS)
json.dump(res, open(OUTFILE, "w"), indent=1)
