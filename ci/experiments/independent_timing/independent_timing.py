"""Independent cross-check of the harness's GPU figures, run in the same session on the same GPU.

Times the same operations with a different tool (triton.testing.do_bench / do_bench_cudagraph,
not flashinfer.testing) and different call paths (direct kernel and FlashInfer wrapper calls,
not the harness's strategies and backend): the full-pool torch cast, the vectorized Triton
cast, the fused gather+cast of 4,096 rows, FA3 BF16 attention at B1 L4096, and the
78-layer production pool fill. Writes a JSON the report compares against the harness.

usage: python -m ci.experiments.independent_timing OUT.json
"""

import json
import sys
import time

import torch
import triton.testing as tt

SLOTS, WIDTH, LAYERS = 495_552, 576, 78


def main(out_path: str) -> None:
    from flashinfer.mla import BatchMLAPagedAttentionWrapper, MLAPlanMetadata

    from harness.kernels import cast, gather_cast, synth_fill

    dev = torch.device("cuda")
    pools = [torch.empty(SLOTS + 1, 1, WIDTH, dtype=torch.uint8, device=dev) for _ in range(LAYERS)]
    synth_fill.fill_layer_(pools[0], 0, 0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for layer, p in enumerate(pools):
        synth_fill.fill_layer_(p, 0, layer)
    torch.cuda.synchronize()
    fill_s = time.perf_counter() - t0

    layer_cycle = iter(range(10**9))

    def next_pool():  # rotate layers so L2 never holds the previous call's data
        return pools[next(layer_cycle) % LAYERS]

    out = torch.empty(SLOTS + 1, 1, WIDTH, dtype=torch.bfloat16, device=dev)
    figures = {
        "pool_fill_s": fill_s,
        "torch_cast_us": tt.do_bench(lambda: next_pool().view(torch.float8_e4m3fn).to(torch.bfloat16), return_mode="median") * 1e3,
        "triton_cast_us": tt.do_bench(lambda: cast.cast_pool_to_bf16(next_pool(), out), return_mode="median") * 1e3,
    }
    idx = torch.randperm(SLOTS, device=dev)[:4096].to(torch.int32) + 1
    compact = torch.empty(4097, 1, WIDTH, dtype=torch.bfloat16, device=dev)
    figures["gather_cast_4096_us"] = tt.do_bench_cudagraph(lambda: gather_cast.gather_cast_(pools[5], idx, compact), return_mode="median") * 1e3

    bf16_pool = pools[7].view(torch.float8_e4m3fn).to(torch.bfloat16)
    wrapper = BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev), backend="fa3")
    indptr = torch.tensor([0, 4096], dtype=torch.int32)
    wrapper.plan(
        metadata=MLAPlanMetadata.csr(torch.tensor([0, 1], dtype=torch.int32), indptr, idx, torch.tensor([4096], dtype=torch.int32)),
        num_heads=8, head_dim_ckv=512, head_dim_kpe=64, page_size=1, causal=False, sm_scale=1 / 16,
        q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, query_layout="split", kv_cache_layout="split",
    )
    q_nope = torch.randn(1, 8, 512, dtype=torch.bfloat16, device=dev)
    q_pe = torch.randn(1, 8, 64, dtype=torch.bfloat16, device=dev)
    ckv, kpe = bf16_pool[..., :512], bf16_pool[..., 512:]
    figures["fa3_bf16_b1_l4096_us"] = tt.do_bench_cudagraph(
        lambda: wrapper.run(query=(q_nope, q_pe), kv_cache=(ckv, kpe)), return_mode="median"
    ) * 1e3
    figures["gpu"] = torch.cuda.get_device_name(dev)
    figures["tool"] = "triton.testing.do_bench (torch casts, layers rotated) / do_bench_cudagraph (gather, attention)"
    with open(out_path, "w") as f:
        json.dump(figures, f, indent=1)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
