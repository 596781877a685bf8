"""Streaming-read probe: how fast can the b32/b128 gathers go (ldg, bulk-copy ring, current kernel)."""
import sys, json
import torch
sys.path.insert(0, ".")
from torch.cuda._utils import _nvrtc_compile, _cuda_load_module
from ci.tune_fused import page_indices, time_graph, SLOTS, PAGE
from harness.kernels.fused_mla_decode import Config, fused_mla_decode, partial_buffers
from harness.kernels import fused_mla_cuda as fc

OUTFILE = sys.argv[1]
LAYERS = 78
dev = torch.device("cuda")
props = torch.cuda.get_device_properties(0)
arch = f"{props.major}{props.minor}"
src = open(".scratch/probe/stream.cu").read()
def load(name):
    cubin, low = _nvrtc_compile(src, name, arch, nvcc_options=["-std=c++17"])
    return _cuda_load_module(cubin, [low])[low]
pools = [torch.randint(0, 0x7E, (SLOTS + PAGE, 1, 576), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
sink = torch.zeros(1024, dtype=torch.int32, device=dev)
res = {}
def rec(k, v):
    res[k] = round(v, 2); print(k, res[k], flush=True)
for batch, kv_len in ((32, 4096), (128, 2048)):
    g = torch.Generator(device=dev).manual_seed(batch * 7919 + kv_len)
    indices = page_indices(batch, kv_len, g, dev)
    indptr = torch.arange(0, batch * kv_len + 1, kv_len, dtype=torch.int32, device=dev)
    tag = f"b{batch}-l{kv_len}"
    floor_us = batch * kv_len * 576 / 4241e9 * 1e6
    rec(f"{tag} floor_us@4241", floor_us)
    for U, W, splits in ((8, 8, 8), (8, 8, 16)):
        k = load(f"ldg_stream<{U}, {W}>")
        def step():
            for p in pools:
                k(grid=(splits, batch, 1), block=(32 * W, 1, 1), args=[p, indptr, indices, splits, sink])
        rec(f"{tag} ldg U{U} W{W} s{splits}", time_graph(step) * 1e3 / LAYERS)
    for kind, st, cw, sps in (("bulk_stream2", 2, 4, (8, 16)), ("bulk_stream2", 3, 4, (4, 8)), ("bulk_stream2", 4, 4, (4, 8)),
                              ("bulk_stream2", 5, 4, (4,)), ("bulk_stream2", 4, 8, (4,)),
                              ("ldgsts_stream", 2, 8, (8, 16)), ("ldgsts_stream", 4, 8, (4, 8)), ("ldgsts_stream", 5, 8, (4,)),
                              ("ldgsts_stream", 3, 4, (8, 16)), ("ldgsts_stream", 5, 16, (4,))):
        k = load(f"{kind}<{st}, {cw}>")
        smem = st * 64 * 592 + 16 * st + 16384
        k.set_shared_memory_config(smem)
        threads = 32 * (cw + 1) if kind.startswith("bulk") else 32 * cw
        for splits in sps:
            def step():
                for p in pools:
                    k(grid=(splits, batch, 1), block=(threads, 1, 1), shared_mem=smem, args=[p, indptr, indices, splits, sink])
            rec(f"{tag} {kind} st{st} w{cw} s{splits}", time_graph(step) * 1e3 / LAYERS)
    qs = [(torch.randn(batch, 8, 512, device=dev).to(torch.bfloat16), torch.randn(batch, 8, 64, device=dev).to(torch.bfloat16)) for _ in pools]
    for splits, st, w in ((8, 2, 8), (4, 4, 8)) if batch == 32 else ((2, 2, 8), (1, 4, 8)):
        cfg = Config(splits, 64, w, st, pv_fp16=True, cuda=True)
        parts = partial_buffers(batch, 8, splits, 512, dev)
        def step():
            for pool, (qn, qp) in zip(pools, qs):
                fused_mla_decode(qn, qp, pool[..., :512], pool[..., 512:], indptr, indices, 1 / 192 ** 0.5, cfg, partials=parts)
        rec(f"{tag} kernel s{splits} st{st} w{w}", time_graph(step) * 1e3 / LAYERS)
json.dump(res, open(OUTFILE, "w"), indent=1)
