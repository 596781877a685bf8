"""python -m ci.experiments.tune_fused: autotune fused_fp8 and write harness/kernels/fused_tuning.toml (GPU; tune_fused.py)."""
