"""Timing of CUDA kernel configs (+ memory-only debug variant, wrong outputs) on the tune_fused setup."""
import ctypes, sys, json
import torch
sys.path.insert(0, ".")
OUTFILE = sys.argv[1]
from ci.tune_fused import page_indices, time_graph, SLOTS, PAGE
from harness.kernels.fused_mla_decode import Config, fused_mla_decode, partial_buffers
from harness.kernels import fused_mla_cuda as fc
from suites.gpu.test_fused_fp8_gpu import problem, reference, run_kernel, norm_rel

LAYERS = 78
dev = torch.device("cuda")
base = fc.SOURCE.read_text()
libcuda = torch.cuda._utils._get_gpu_runtime_library()
def attrs(k):
    out = []
    for a in (4, 3):
        v = ctypes.c_int(); libcuda.cuFuncGetAttribute(ctypes.byref(v), a, k.func); out.append(v.value)
    return out
def memonly(src):
    out = src.replace("{  // phase A", "if (0) {  // phase A").replace("      {\n        float acc[NG][NT][4];", "      if (0) {\n        float acc[NG][NT][4];")
    out = out.replace("if (tid < SOFTMAX_THREADS) {  // phase B", "if (0) {  // phase B").replace("{  // phase C", "if (0) {  // phase C")
    assert out.count("if (0)") == 3
    return out
def sub(src, old, new):
    assert old in src, old
    return src.replace(old, new)
def gather(src):
    return sub(src, "  whole_rows = 0;  // no bulk copies before sm_90\n#endif", "#endif\n  whole_rows = 0;")
def noepi(src):
    return sub(src, "  {  // epilogue: the softmax sums; with 16 warps the second token half's O^T is added to the first's", "  return;\n  {")
def oldwait(src):
    return sub(src, "    if ((run_bits >> si) & 1) {  // a run: its barrier; the cp.async groups since tile i hold only index tiles\n      cp_async_wait<STAGES - 1>();",
               "    if ((run_bits >> si) & 1) {\n      cp_async_wait<STAGES - 2>();")
def nomovm(src):
    return sub(src, "  asm volatile(\"movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\" : \"=r\"(y) : \"r\"(x));", "  y = x;")
def nocvt(src):
    return sub(src, "  asm(\"{ .reg .b16 a, b; mov.b32 {a, b}, %2; cvt.rn.f16x2.e4m3x2 %0, a; cvt.rn.f16x2.e4m3x2 %1, b; }\"\n      : \"=r\"(lo), \"=r\"(hi) : \"r\"(x));", "  lo = x & 0x3f3f3f3f; hi = (x >> 1) & 0x3f3f3f3f;")
def nosoftmax(src):
    return sub(src, "if (tid < SOFTMAX_THREADS) {  // phase B", "if (0) {  // phase B")
def nophaseC(src):
    return sub(src, "{  // phase C", "if (0) {  // phase C")
PREV = open(".scratch/probe/head_kernel.cu").read()
VARIANTS = [("base", base), ("prev", PREV), ("memonly", memonly(base)), ("prev_memonly", memonly(PREV))]
SHAPES = ((32, 4096, ((8, 2, 8, "pdl"), (8, 2, 8), (8, 2, 8, "cluster"), (4, 3, 8), (4, 4, 8))),
          (128, 2048, ((2, 2, 8, "cluster"), (2, 2, 8), (1, 4, 8))), (1, 4096, ((16, 2, 8, "pdl"), (32, 4, 16))))
NEW_SMEM = fc.smem_bytes
def prev_smem(nh, stages, warps):
    return stages * 64 * 576 + 64 + 16 * 64 * 4 + nh * 576 * 2 + (warps // 4) * nh * 68 * 4 + 64 * nh * 2 + 3 * nh * 4
pools = [torch.randint(0, 0x7E, (SLOTS + PAGE, 1, 576), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
small = problem([997, 1, 4099, 64, 300], 8, rows=5000)
ref_out, _ = reference(*[t.cpu() for t in small])
results = []
for name, src in VARIANTS:
    path = f"/tmp/v_{name}.cu"; open(path, "w").write(src)
    fc.SOURCE = type(fc.SOURCE)(path); fc._kernel.cache_clear()
    fc.smem_bytes = prev_smem if name.startswith("prev") else NEW_SMEM
    row = dict(variant=name)
    for w in (8, 16):
        for st, sp in ((4, 3), (2, 1)):
            out, _ = run_kernel(*small, Config(sp, 64, w, st, pv_fp16=True, cuda=True))
            row[f"err w{w} st{st} s{sp}"] = norm_rel(out.cpu(), ref_out)
            row[f"regs/local w{w} st{st}"] = attrs(fc._kernel(8, st, w, 0))
    for batch, kv_len, cfgs in SHAPES:
        g = torch.Generator(device=dev).manual_seed(batch * 7919 + kv_len)
        indices = page_indices(batch, kv_len, g, dev)
        scattered = (torch.randperm(SLOTS, generator=g, device=dev)[:batch * kv_len] + 1).to(torch.int32)
        indptr = torch.arange(0, batch * kv_len + 1, kv_len, dtype=torch.int32, device=dev)
        qs = [(torch.randn(batch, 8, 512, device=dev).to(torch.bfloat16), torch.randn(batch, 8, 64, device=dev).to(torch.bfloat16)) for _ in pools]
        for splits, st, w, *pdl in cfgs:
            cfg = Config(splits, 64, w, st, pv_fp16=True, cuda=True, pdl_merge=pdl == ["pdl"], cluster_merge=pdl == ["cluster"])
            parts = partial_buffers(batch, 8, cfg, 512, dev)
            def step():
                for pool, (qn, qp) in zip(pools, qs):
                    fused_mla_decode(qn, qp, pool[..., :512], pool[..., 512:], indptr, indices, 1 / 192 ** 0.5, cfg, partials=parts)
            row[f"b{batch}-l{kv_len} s{splits} st{st} w{w}{' ' + pdl[0] if pdl else ''}"] = round(time_graph(step) * 1e3 / LAYERS, 1)
            if False:
                def step_s():
                    for pool, (qn, qp) in zip(pools, qs):
                        fused_mla_decode(qn, qp, pool[..., :512], pool[..., 512:], indptr, scattered, 1 / 192 ** 0.5, cfg, partials=parts)
                row[f"scattered b{batch}-l{kv_len} s{splits} st{st} w{w}"] = round(time_graph(step_s) * 1e3 / LAYERS, 1)
    print(json.dumps(row), flush=True)
    results.append(row)
json.dump(results, open(OUTFILE, "w"), indent=1)
