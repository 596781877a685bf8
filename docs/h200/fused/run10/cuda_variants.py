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
    out = src.replace("{  // phase A", "if (0) {  // phase A").replace("if (tid < SOFTMAX_THREADS) {  // phase B", "if (0) {  // phase B").replace("{  // phase C", "if (0) {  // phase C")
    assert out.count("if (0)") == 3
    return out
def sub(src, old, new):
    assert old in src, old
    return src.replace(old, new)
FN = """// e4m3 x 4 -> fp16x2 of value * 2^-8 by bit moves (no NaN): even = bytes 0, 2; odd = bytes 1, 3.
__device__ __forceinline__ void e4m3x4_scaled(u32 x, u32& even, u32& odd) {
  odd = (x & 0x80008000u) | ((x & 0x7F007F00u) >> 1);
  const u32 y = x << 8;
  even = (y & 0x80008000u) | ((y & 0x7F007F00u) >> 1);
}

__device__ __forceinline__ u32 byte_perm("""
def bitc(src):
    src = sub(src, "__device__ __forceinline__ u32 byte_perm(", FN)
    src = sub(src, "for (int q = 0; q < 4; ++q) e4m3x4_to_f16(byte_perm(r[q], 0x3120), ev[q], od[q]);",
              "for (int q = 0; q < 4; ++q) e4m3x4_scaled(r[q], ev[q], od[q]);")
    return sub(src, "const float inv = empty ? 0.f : kv_scale / l;", "const float inv = empty ? 0.f : kv_scale * 256.f / l;")
def bita(src):
    for q in ("r0, a0, a2", "r1, a1, a3", "r2, a4, a6", "r3, a5, a7"):
        src = sub(src, f"e4m3x4_to_f16({q});", f"e4m3x4_scaled({q});")
    src = sub(src, "s[u] = tok < valid ? v * scale_log2 : NEG_INF;", "s[u] = tok < valid ? v * (scale_log2 * 256.f) : NEG_INF;")
    return sub(src, "*(uint2*)(qs + h * QROW + k) = make_uint2(f0, f1);", "*(uint2*)(qs + h * QROW + k) = make_uint2((f0 & 0xFFFF) | (f1 << 16), (f0 >> 16) | (f1 & 0xFFFF0000u));")
NOMERGE = sub(base, "  if (!is_last) return;", "  if (1) return;")
VARIANTS = [("base", base), ("bitC", bitc(base)), ("bitAC", bita(bitc(base))), ("memonly", memonly(base)), ("nomerge", NOMERGE),
            ("bitAC_nomerge", bita(bitc(NOMERGE)))]
SHAPES = ((32, 4096, ((8, 2, 8), (4, 4, 8), (4, 3, 8), (4, 4, 16))),
          (128, 2048, ((2, 2, 8), (1, 4, 8), (2, 3, 8))), (1, 4096, ((32, 3, 16), (32, 2, 8))))
pools = [torch.randint(0, 0x7E, (SLOTS + PAGE, 1, 576), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
small = problem([997, 1, 4099, 64, 300], 8, rows=5000)
ref_out, _ = reference(*[t.cpu() for t in small])
results = []
for name, src in VARIANTS:
    path = f"/tmp/v_{name}.cu"; open(path, "w").write(src)
    fc.SOURCE = type(fc.SOURCE)(path); fc._kernel.cache_clear()
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
        for splits, st, w in cfgs:
            cfg = Config(splits, 64, w, st, pv_fp16=True, cuda=True)
            parts = partial_buffers(batch, 8, splits, 512, dev)
            def step():
                for pool, (qn, qp) in zip(pools, qs):
                    fused_mla_decode(qn, qp, pool[..., :512], pool[..., 512:], indptr, indices, 1 / 192 ** 0.5, cfg, partials=parts)
            row[f"b{batch}-l{kv_len} s{splits} st{st} w{w}"] = round(time_graph(step) * 1e3 / LAYERS, 1)
            if False:
                def step_s():
                    for pool, (qn, qp) in zip(pools, qs):
                        fused_mla_decode(qn, qp, pool[..., :512], pool[..., 512:], indptr, scattered, 1 / 192 ** 0.5, cfg, partials=parts)
                row[f"scattered b{batch}-l{kv_len} s{splits} st{st} w{w}"] = round(time_graph(step_s) * 1e3 / LAYERS, 1)
    print(json.dumps(row), flush=True)
    results.append(row)
json.dump(results, open(OUTFILE, "w"), indent=1)
