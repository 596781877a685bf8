"""Device check of the overlapped CUDA loop: compile (sm_90, sm_120), float64 reference, NaN, runs."""
import sys, time, traceback
import torch
sys.path.insert(0, ".")
from suites.gpu.test_fused_fp8_gpu import problem, reference, run_kernel, norm_rel
from harness.kernels.fused_mla_decode import Config
from harness.kernels import fused_mla_cuda as fc

t = time.time()
for arch in ("90", "120"):
    for nh in (8, 16):
        for st in (3, 4, 5):
            for w in (8, 16):
                try:
                    fc.compile_cubin(nh, st, w, arch, True)
                except Exception as e:
                    print("COMPILE FAIL", arch, nh, st, w, str(e)[:3000], flush=True)
print(f"compile {time.time()-t:.1f}s", flush=True)
C = lambda s, w, st, **k: Config(s, 64, w, st, pv_fp16=True, cuda=True, overlap=True, **k)
CFGS = (C(1, 8, 3), C(3, 8, 4), C(5, 16, 4), C(1, 16, 5), C(8, 8, 5), C(64, 16, 3), C(4, 16, 4, cluster_merge=True),
        C(2, 8, 5, pdl_merge=True), C(4, 16, 5, cluster_merge=True))
fails = 0
for heads in (8, 16, 20):
    for lens in ([1], [2], [1, 2, 3, 5, 7, 11, 13], [997, 1, 4099], [31] * 9, [64, 65, 128, 200], [63, 129, 191]):
        q_nope, q_pe, pool, indptr, indices = problem(lens, heads, rows=5000)
        ref_out, ref_lse = reference(q_nope.cpu(), q_pe.cpu(), pool.cpu(), indptr.cpu(), indices.cpu())
        base, _ = run_kernel(q_nope, q_pe, pool, indptr, indices, Config(3, 64, 8, 2, pv_fp16=True, cuda=True))
        for cfg in CFGS:
            try:
                if heads == 16 and cfg.num_stages == 5 and cfg.num_warps == 16:
                    continue  # does not fit
                out, lse = run_kernel(q_nope, q_pe, pool, indptr, indices, cfg)
                torch.cuda.synchronize()
                e = norm_rel(out.cpu(), ref_out); le = float((lse.cpu().double() - ref_lse).abs().max())
                ok = e < 3e-3 and le < 1e-3
                fails += not ok
                if not ok: print(f"FAIL h{heads} lens{lens[:4]} {cfg}: rel {e:.2e} (base {norm_rel(base.cpu(), ref_out):.2e}) lse {le:.2e}", flush=True)
            except Exception:
                fails += 1
                traceback.print_exc()
                print("EXC", heads, lens, cfg, flush=True)
q_nope, q_pe, pool, indptr, indices = problem([40, 300, 7], 8, rows=1000, seed=3)
poisoned_row = int(indices[int(indptr[1]) + 123])
for channel in (0, 300, 511, 512, 575):
    p2 = pool.clone(); p2[poisoned_row, 0, channel] = 0x7F
    for cfg in (C(1, 8, 4), C(3, 16, 3)):
        out, lse = run_kernel(q_nope, q_pe, p2, indptr, indices, cfg)
        nan_ok = not bool(torch.isfinite(out[1]).all()) and not bool(torch.isfinite(lse[1]).all()) and bool(torch.isfinite(out[0]).all())
        fails += not nan_ok
        print("nan", channel, cfg.num_splits, "ok" if nan_ok else "FAIL", flush=True)
print("FAILS", fails, flush=True)
