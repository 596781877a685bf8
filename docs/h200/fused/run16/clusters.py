"""How many thread-block clusters of the decode kernel an H200 holds at once (cuOccupancyMaxActiveClusters),
and b32-l4096 per-layer time of each merge at s4 / s8 (78-layer graph)."""
import ctypes, sys, json
import torch
sys.path.insert(0, ".")
from ci.tune_fused import page_indices, time_graph, SLOTS, PAGE
from harness.kernels import fused_mla_cuda as fc
from harness.kernels.fused_mla_decode import Config, fused_mla_decode, partial_buffers
cu = torch.cuda._utils._get_gpu_runtime_library()
res = {}
for nh, st, w, splits, batch in ((8, 2, 8, 8, 32), (8, 2, 8, 4, 32), (8, 3, 8, 4, 32), (8, 4, 8, 4, 32), (8, 2, 8, 2, 128), (8, 4, 8, 8, 1)):
    k = fc._kernel(nh, st, w, 0)
    attr = fc._LaunchAttribute(id=4)
    attr.value[0], attr.value[1], attr.value[2] = splits, 1, 1
    cfg = fc._LaunchConfig(grid=(ctypes.c_uint * 3)(splits, batch, 1), block=(ctypes.c_uint * 3)(32 * w, 1, 1),
                           shared_mem=fc.smem_bytes(nh, st, w), stream=None, attrs=ctypes.pointer(attr), num_attrs=1)
    n = ctypes.c_int(-1)
    err = cu.cuOccupancyMaxActiveClusters(ctypes.byref(n), k.func, ctypes.byref(cfg))
    key = f"nh{nh} st{st} w{w} cluster{splits}"
    res[key] = dict(err=err, max_active_clusters=n.value, needed=batch)
    print(key, res[key], flush=True)
LAYERS = 78
dev = torch.device("cuda")
pools = [torch.randint(0, 0x7E, (SLOTS + PAGE, 1, 576), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
batch, kv_len = 32, 4096
g = torch.Generator(device=dev).manual_seed(batch * 7919 + kv_len)
indices = page_indices(batch, kv_len, g, dev)
indptr = torch.arange(0, batch * kv_len + 1, kv_len, dtype=torch.int32, device=dev)
qn = torch.randn(batch, 8, 512, device=dev).to(torch.bfloat16); qp = torch.randn(batch, 8, 64, device=dev).to(torch.bfloat16)
for splits, st in ((4, 3), (4, 4), (8, 2)):
    for merge in ("cta", "pdl", "cluster"):
        cfg = Config(splits, 64, 8, st, pv_fp16=True, cuda=True, pdl_merge=merge == "pdl", cluster_merge=merge == "cluster")
        parts = partial_buffers(batch, 8, cfg, 512, dev)
        def step():
            for p in pools:
                fused_mla_decode(qn, qp, p[..., :512], p[..., 512:], indptr, indices, 1 / 192 ** 0.5, cfg, partials=parts)
        key = f"b32 s{splits} st{st} {merge}"
        res[key] = round(time_graph(step) * 1e3 / LAYERS, 2)
        print(key, res[key], flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
