"""Why the harness's attn_us of fused_fp8 exceeds the tuner's per-layer time: same kernel, same data."""
import sys, json, statistics
import torch
sys.path.insert(0, ".")
from ci.tune_fused import page_indices, time_graph, SLOTS, PAGE
from harness.kernels.fused_mla_decode import Config, fused_mla_decode, partial_buffers
from harness import timing
dev = torch.device("cuda")
res = {}
def rec(k, v):
    res[k] = round(v, 2); print(k, res[k], flush=True)
LAYERS = 78
pools = [torch.randint(0, 0x7E, (SLOTS + PAGE, 1, 576), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
for batch, kv_len, cfg in ((32, 4096, Config(8, 64, 8, 2, pv_fp16=True, cuda=True, pdl_merge=True)),
                           (128, 2048, Config(2, 64, 8, 2, pv_fp16=True, cuda=True))):
    g = torch.Generator(device=dev).manual_seed(batch * 7919 + kv_len)
    indices = page_indices(batch, kv_len, g, dev)
    indptr = torch.arange(0, batch * kv_len + 1, kv_len, dtype=torch.int32, device=dev)
    qn = torch.randn(batch, 8, 512, device=dev).to(torch.bfloat16); qp = torch.randn(batch, 8, 64, device=dev).to(torch.bfloat16)
    parts = partial_buffers(batch, 8, cfg, 512, dev)
    call = lambda a, b, p: fused_mla_decode(a, b, p[..., :512], p[..., 512:], indptr, indices, 1 / 192 ** 0.5, cfg, partials=parts)
    tag = f"b{batch}-l{kv_len}"
    def step():
        for p in pools: call(qn, qp, p)
    rec(f"{tag} graph78 (tuner)", time_graph(step) * 1e3 / LAYERS)
    def step1():
        for _ in range(LAYERS): call(qn, qp, pools[0])
    rec(f"{tag} graph78 same layer (warm L2 tail)", time_graph(step1) * 1e3 / LAYERS)
    t = timing.device_time_ms(call, 30, use_cuda_graph=True, input_args=(qn, qp, pools[0]))
    rec(f"{tag} harness device_time_ms median", statistics.median(t) * 1e3)
    rec(f"{tag} harness device_time_ms min", min(t) * 1e3)
json.dump(res, open(sys.argv[1], "w"), indent=1)
