"""python -m ci.experiments.ncu_fused OUT_DIR: the harness's attn_us beside Nsight Compute's kernel time and DRAM bytes of the same launch (GPU; ncu_fused.py)."""
