"""run19b: (1) phase A with 4 accumulator chains vs 2 (78-layer graph, tuner data); (2) where the
harness's b32-l4096 attn_us exceeds the tuner's for the same config: harness data vs tuner data,
harness timing vs 78-layer graph."""
import sys, json, statistics
import torch
sys.path.insert(0, ".")
OUTFILE = sys.argv[1]
from ci.tune_fused import page_indices, time_graph, SLOTS, PAGE
from harness.kernels.fused_mla_decode import Config, fused_mla_decode, partial_buffers
from harness.kernels import fused_mla_cuda as fc, fused_tuning
from harness import timing
LAYERS = 78
dev = torch.device("cuda")
res = {}
def rec(k, v):
    res[k] = v; print(k, v, flush=True); json.dump(res, open(OUTFILE, "w"), indent=1)
def sub(src, old, new):
    assert old in src, old
    return src.replace(old, new)
base = fc.SOURCE.read_text()
acc4 = sub(base, "mma16816(acc[j][s & 1], a0, a1, a2, a3, q.x, q.y);", "mma16816(acc[j][s & 3], a0, a1, a2, a3, q.x, q.y);")
acc4 = sub(acc4, "__device__ __forceinline__ void qk_chunk(const u8* rows_g, const u16* q_g, int c0, int t, float (*acc)[2][4]) {",
           "__device__ __forceinline__ void qk_chunk(const u8* rows_g, const u16* q_g, int c0, int t, float (*acc)[4][4]) {")
acc4 = sub(acc4, "      float acc[NT][2][4];", "      float acc[NT][4][4];")
acc4 = sub(acc4, "        for (int c = 0; c < 4; ++c) acc[jn][0][c] = acc[jn][1][c] = 0.f;", "        for (int c = 0; c < 4; ++c) acc[jn][0][c] = acc[jn][1][c] = acc[jn][2][c] = acc[jn][3][c] = 0.f;")
for c in range(4):
    acc4 = sub(acc4, f"acc[jn][0][{c}] + acc[jn][1][{c}];", f"acc[jn][0][{c}] + acc[jn][1][{c}] + acc[jn][2][{c}] + acc[jn][3][{c}];")
from suites.gpu.test_fused_fp8_gpu import problem, reference, run_kernel, norm_rel
pools = [torch.randint(0, 0x7E, (SLOTS + PAGE, 1, 576), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
SHAPES = ((32, 4096, (Config(8, 64, 8, 2, pv_fp16=True, cuda=True, cluster_merge=True), Config(8, 64, 8, 2, pv_fp16=True, cuda=True, pdl_merge=True))),
          (128, 2048, (Config(2, 64, 8, 2, pv_fp16=True, cuda=True, cluster_merge=True),)),
          (1, 4096, (Config(16, 64, 8, 2, pv_fp16=True, cuda=True, pdl_merge=True),)))
small = problem([997, 1, 4099, 64, 300], 8, rows=5000)
ref_out, _ = reference(*[t.cpu() for t in small])
small16 = problem([997, 1, 300], 20, rows=5000)
ref16, _ = reference(*[t.cpu() for t in small16])
for rnd in range(2):
    for name, src in (("base", base), ("acc4", acc4)):
        path = f"/tmp/v_{name}.cu"; open(path, "w").write(src)
        fc.SOURCE = type(fc.SOURCE)(path); fc._kernel.cache_clear(); fc._wave.cache_clear()
        if rnd == 0:
            for cfg in (Config(3, 64, 8, 2, pv_fp16=True, cuda=True), Config(1, 64, 16, 4, pv_fp16=True, cuda=True)):
                out, _ = run_kernel(*small, cfg)
                rec(f"{name} err h8 w{cfg.num_warps}", norm_rel(out.cpu(), ref_out))
                out, _ = run_kernel(*small16, cfg)
                rec(f"{name} err h20 w{cfg.num_warps}", norm_rel(out.cpu(), ref16))
        for batch, kv_len, cfgs in SHAPES:
            g = torch.Generator(device=dev).manual_seed(batch * 7919 + kv_len)
            indices = page_indices(batch, kv_len, g, dev)
            indptr = torch.arange(0, batch * kv_len + 1, kv_len, dtype=torch.int32, device=dev)
            qs = [(torch.randn(batch, 8, 512, device=dev).to(torch.bfloat16), torch.randn(batch, 8, 64, device=dev).to(torch.bfloat16)) for _ in pools]
            for cfg in cfgs:
                parts = partial_buffers(batch, 8, cfg, 512, dev)
                def step():
                    for pool, (qn, qp) in zip(pools, qs):
                        fused_mla_decode(qn, qp, pool[..., :512], pool[..., 512:], indptr, indices, 1 / 192 ** 0.5, cfg, partials=parts)
                rec(f"r{rnd} {name} b{batch}-l{kv_len} s{cfg.num_splits} {cfg.merge_by}", round(time_graph(step) * 1e3 / LAYERS, 2))
fc.SOURCE = type(fc.SOURCE)("harness/kernels/fused_mla_cuda.cu"); fc._kernel.cache_clear(); fc._wave.cache_clear()
del pools
torch.cuda.empty_cache()
# (2) the gap, on the harness's own case
from harness.cases import Case
from harness.presets import get_preset, get_scale
from harness.scenario import load_scenario
from harness.prepared import PreparedCase
case = Case(get_preset("glm5-tp8"), get_scale("prod"), load_scenario("b32-l4096"))
prep = PreparedCase(case, dev, "torch").build()
with prep.session("fused_fp8") as s:
    st = s.strategy
    last = s.schedule.steps[-1]
    plan = st.begin_step(last)
    rec("harness config", str(plan.config))
    qn, qp = s.data.steps[last.step].q_nope[0], s.data.steps[last.step].q_pe[0]
    rec("harness q strides", [list(qn.stride()), list(qp.stride()), list(qn.shape)])
    idx = plan.kv_indices[:plan.problem.kv_indices.numel()]
    ip = plan.kv_indptr
    rec("harness kv_lens", sorted(set((ip[1:] - ip[:-1]).tolist())))
    tiles = idx.view(-1, 64)
    rec("harness tiles that are runs", float(((tiles[:, 1:] - tiles[:, :-1]) == 1).all(1).float().mean()))
    rec("harness first rows of tiles % 64", sorted(set((tiles[:, 0] % 64).tolist()))[:5])
    rows0 = st.cast_call(0)[1][0]
    rec("harness layer-0 rows", [list(rows0.shape), list(rows0.stride()), rows0.dtype.__repr__()])
    attend = lambda a, b, kv: st.attend(plan, a, b, st.split(kv))
    t = timing.device_time_ms(attend, 30, use_cuda_graph=True, input_args=(qn, qp, rows0))
    rec("harness attn_us (measure.py method) median", round(statistics.median(t) * 1e3, 2))
    layers = [st.cast_call(l)[1][0] for l in range(LAYERS)]
    def step_h():
        for r in layers:
            st.attend(plan, qn, qp, st.split(r))
    rec("78-layer graph, harness data", round(time_graph(step_h) * 1e3 / LAYERS, 2))
    qc, pc = qn.contiguous(), qp.contiguous()
    def step_hc():
        for r in layers:
            st.attend(plan, qc, pc, st.split(r))
    rec("78-layer graph, harness data, contiguous q", round(time_graph(step_hc) * 1e3 / LAYERS, 2))
    g = torch.Generator(device=dev).manual_seed(32 * 7919 + 4096)
    tidx = page_indices(32, 4096, g, dev)
    saved = plan.kv_indices[:tidx.numel()].clone()
    plan.kv_indices[:tidx.numel()].copy_(tidx)
    rec("78-layer graph, harness pools + q, tuner indices", round(time_graph(step_h) * 1e3 / LAYERS, 2))
    t = timing.device_time_ms(attend, 30, use_cuda_graph=True, input_args=(qn, qp, rows0))
    rec("harness attn_us method, tuner indices", round(statistics.median(t) * 1e3, 2))
    plan.kv_indices[:tidx.numel()].copy_(saved)
