"""One layer of b32-l4096 (tuner's paged indices) through the committed CUDA config, for ncu."""
import sys
import torch
sys.path.insert(0, ".")
from ci.tune_fused import page_indices, SLOTS, PAGE
from harness.kernels.fused_mla_decode import Config, fused_mla_decode, partial_buffers

batch, kv_len = int(sys.argv[1]), int(sys.argv[2])
splits, st, w, merge = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
dev = torch.device("cuda")
pool = torch.randint(0, 0x7E, (SLOTS + PAGE, 1, 576), dtype=torch.uint8, device=dev)
g = torch.Generator(device=dev).manual_seed(batch * 7919 + kv_len)
indices = page_indices(batch, kv_len, g, dev)
indptr = torch.arange(0, batch * kv_len + 1, kv_len, dtype=torch.int32, device=dev)
qn = torch.randn(batch, 8, 512, device=dev).to(torch.bfloat16)
qp = torch.randn(batch, 8, 64, device=dev).to(torch.bfloat16)
cfg = Config(splits, 64, w, st, pv_fp16=True, cuda=True, pdl_merge=merge == "pdl", cluster_merge=merge == "cluster")
parts = partial_buffers(batch, 8, cfg, 512, dev)
for _ in range(5):
    fused_mla_decode(qn, qp, pool[..., :512], pool[..., 512:], indptr, indices, 1 / 192 ** 0.5, cfg, partials=parts)
torch.cuda.synchronize()
print("ok")
