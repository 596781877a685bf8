"""b32-l4096: the cluster merge for the requests one wave of clusters holds, the rest beside it
(PDL launch, CTA merge, waits for the cluster launch at its end). 78-layer graph per-layer us."""
import ctypes, sys, json
import torch
sys.path.insert(0, ".")
from ci.tune_fused import page_indices, time_graph, SLOTS, PAGE
from harness.kernels import fused_mla_cuda as fc
from harness.kernels.fused_mla_decode import Config, fused_mla_decode, partial_buffers
cu = torch.cuda._utils._get_gpu_runtime_library()
LAYERS = 78
dev = torch.device("cuda")
res = {}

def max_clusters(st, w, splits):
    k = fc._kernel(8, st, w, 0)
    attr = fc._LaunchAttribute(id=4)
    attr.value[0], attr.value[1], attr.value[2] = splits, 1, 1
    cfg = fc._LaunchConfig(grid=(ctypes.c_uint * 3)(splits, 64, 1), block=(ctypes.c_uint * 3)(32 * w, 1, 1),
                           shared_mem=fc.smem_bytes(8, st, w), stream=None, attrs=ctypes.pointer(attr), num_attrs=1)
    n = ctypes.c_int(-1)
    assert cu.cuOccupancyMaxActiveClusters(ctypes.byref(n), k.func, ctypes.byref(cfg)) == 0
    return n.value

pools = [torch.randint(0, 0x7E, (SLOTS + PAGE, 1, 576), dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
for batch, kv_len, splits in ((32, 4096, 8), (40, 4096, 8)):
    g = torch.Generator(device=dev).manual_seed(batch * 7919 + kv_len)
    indices = page_indices(batch, kv_len, g, dev)
    indptr = torch.arange(0, batch * kv_len + 1, kv_len, dtype=torch.int32, device=dev)
    qs = [(torch.randn(batch, 8, 512, device=dev).to(torch.bfloat16), torch.randn(batch, 8, 64, device=dev).to(torch.bfloat16)) for _ in pools]
    n_max = max_clusters(2, 8, splits)
    na = min(batch, n_max)
    res[f"b{batch} max clusters of {splits}"] = n_max
    pdl = Config(splits, 64, 8, 2, pv_fp16=True, cuda=True, pdl_merge=True)
    clu = Config(splits, 64, 8, 2, pv_fp16=True, cuda=True, cluster_merge=True)
    ppdl = partial_buffers(batch, 8, pdl, 512, dev)
    pclu = partial_buffers(batch, 8, clu, 512, dev)
    def run(cfg, parts, pool, qn, qp):
        return fused_mla_decode(qn, qp, pool[..., :512], pool[..., 512:], indptr, indices, 1 / 192 ** 0.5, cfg, partials=parts)
    def split_run(rest_splits, rparts, pool, qn, qp, out, lse):
        ckv2, kpe2 = pool[..., :512].reshape(pool.shape[0], -1), pool[..., 512:].reshape(pool.shape[0], -1)
        sc = 1 / 192 ** 0.5 / 0.6931471805599453
        fc.decode(qn[:na], qp[:na], ckv2, kpe2, indptr[:na + 1], indices, ppdl[0], ppdl[1], ppdl[2], out[:na], lse[:na],
                  sc, 1.0, splits, 2, 8, "cluster")
        if na < batch:
            po, pl, arr = rparts
            k = fc._kernel(8, 2, 8, 0)
            qn2, qp2, o2, l2 = qn[na:], qp[na:], out[na:], lse[na:]
            args = [qn2, qp2, ckv2, kpe2, indptr[na:], indices, po, pl, arr, o2, l2,
                    qn2.stride(0), qn2.stride(1), qp2.stride(0), qp2.stride(1), ckv2.stride(0), kpe2.stride(0),
                    o2.stride(0), o2.stride(1), l2.stride(0), 8, rest_splits, 1 | 4, int(fc.whole_rows(ckv2, kpe2)), float(sc), 1.0]
            fc._launch_ex(k, (rest_splits, batch - na, 1), 256, fc.smem_bytes(8, 2, 8), args, fc._PDL_ATTRIBUTE, (1,))
    ref, _ = run(pdl, ppdl, pools[0], *qs[0])
    for name, cfg, parts in (("pdl", pdl, ppdl), ("cluster", clu, pclu)):
        out, _ = run(cfg, parts, pools[0], *qs[0])
        res[f"b{batch} s{splits} {name} err"] = float((out.float() - ref.float()).norm() / ref.float().norm())
        def step(cfg=cfg, parts=parts):
            for p, (qn, qp) in zip(pools, qs):
                run(cfg, parts, p, qn, qp)
        res[f"b{batch} s{splits} {name}"] = round(time_graph(step) * 1e3 / LAYERS, 2)
        print(res, flush=True)
    for rest_splits in (8, 12, 16):
        rc = Config(rest_splits, 64, 8, 2, pv_fp16=True, cuda=True)
        rparts = partial_buffers(max(1, batch - na), 8, rc, 512, dev)
        out = torch.empty(batch, 8, 512, dtype=torch.bfloat16, device=dev); lse = torch.empty(batch, 8, device=dev)
        split_run(rest_splits, rparts, pools[0], *qs[0], out, lse)
        torch.cuda.synchronize()
        res[f"b{batch} split {na}+{batch - na} rest s{rest_splits} err"] = float((out.float() - ref.float()).norm() / ref.float().norm())
        outs = [(torch.empty(batch, 8, 512, dtype=torch.bfloat16, device=dev), torch.empty(batch, 8, device=dev)) for _ in pools]
        def step_s(rest_splits=rest_splits, rparts=rparts):
            for p, (qn, qp), (o, l) in zip(pools, qs, outs):
                split_run(rest_splits, rparts, p, qn, qp, o, l)
        res[f"b{batch} split {na}+{batch - na} rest s{rest_splits}"] = round(time_graph(step_s) * 1e3 / LAYERS, 2)
        print(res, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
