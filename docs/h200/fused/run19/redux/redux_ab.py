"""Phase B's max: one redux.sync of order-preserving keys vs five shuffles: 78-layer graph us/layer, float64 check."""
import sys, json
import torch
sys.path.insert(0, ".")
OUTFILE = sys.argv[1]
from ci.tune_fused import page_indices, time_graph, SLOTS, PAGE
from harness.kernels.fused_mla_decode import Config, fused_mla_decode, partial_buffers
from harness.kernels import fused_mla_cuda as fc
from suites.gpu.test_fused_fp8_gpu import problem, reference, run_kernel, norm_rel
LAYERS = 78
dev = torch.device("cuda")
res = {}
def rec(k, v):
    res[k] = v; print(k, v, flush=True); json.dump(res, open(OUTFILE, "w"), indent=1)
base = fc.SOURCE.read_text()
def sub(src, old, new):
    assert old in src, old
    return src.replace(old, new)
old_p = sub(base, """      if constexpr (TPH == 32) {  // one head per warp: one warp-wide integer max of order-preserving keys
        mt = ordered_key(redux_max(ordered_key(mt)));
      } else {
#pragma unroll
        for (int off = TPH / 2; off; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
      }""", """#pragma unroll
      for (int off = TPH / 2; off; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));""")
VARIANTS = (("redux", base), ("shfl", old_p))
pools = [torch.randint(0, 0x7E, (SLOTS + PAGE, 1, 576), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
C = lambda s, w, st, **k: Config(s, 64, w, st, pv_fp16=True, cuda=True, **k)
SHAPES = ((32, 4096, (C(8, 8, 2, cluster_merge=True),)), (128, 2048, (C(2, 8, 2, cluster_merge=True),)),
          (1, 4096, (C(32, 16, 3),)), (8, 2048, (C(8, 8, 2, cluster_merge=True),)))
small = problem([997, 1, 4099, 64, 300], 8, rows=5000)
ref_out, _ = reference(*[t.cpu() for t in small])
small20 = problem([997, 1, 300], 20, rows=5000)
ref20, _ = reference(*[t.cpu() for t in small20])
for rnd in range(2):
    for name, src in VARIANTS:
        path = f"/tmp/v_{name}.cu"; open(path, "w").write(src)
        fc.SOURCE = type(fc.SOURCE)(path); fc._kernel.cache_clear(); fc._wave.cache_clear()
        if rnd == 0:
            for cfg in (C(8, 8, 2, cluster_merge=True), C(2, 16, 4, cluster_merge=True), C(4, 8, 2, cluster_merge=True)):
                out, _ = run_kernel(*small, cfg)
                rec(f"{name} err h8 {cfg.num_splits}/{cfg.num_warps}/{cfg.merge_by}", norm_rel(out.cpu(), ref_out))
                out, _ = run_kernel(*small20, cfg)
                rec(f"{name} err h20 {cfg.num_splits}/{cfg.num_warps}/{cfg.merge_by}", norm_rel(out.cpu(), ref20))
        for batch, kv_len, cfgs in SHAPES:
            g = torch.Generator(device=dev).manual_seed(batch * 7919 + kv_len)
            indices = page_indices(batch, kv_len, g, dev)
            indptr = torch.arange(0, batch * kv_len + 1, kv_len, dtype=torch.int32, device=dev)
            qs = [(torch.randn(batch, 8, 512, device=dev).to(torch.bfloat16), torch.randn(batch, 8, 64, device=dev).to(torch.bfloat16)) for _ in pools]
            for cfg in cfgs:
                parts = partial_buffers(batch, 8, cfg, 512, dev)
                def step():
                    for pool, (qn, qp) in zip(pools, qs):
                        fused_mla_decode(qn, qp, pool[..., :512], pool[..., 512:], indptr, indices, 1 / 192 ** 0.5, cfg, partials=parts, indices_ready=True)
                rec(f"r{rnd} {name} b{batch}-l{kv_len} s{cfg.num_splits} w{cfg.num_warps} st{cfg.num_stages} {cfg.merge_by}", round(time_graph(step) * 1e3 / LAYERS, 2))
