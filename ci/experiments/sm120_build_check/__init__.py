"""python -m ci.experiments.sm120_build_check: FlashInfer's FA2 MLA module compiles for sm_120a via nvcc (CUDA toolkit; sm120_build_check.py)."""
