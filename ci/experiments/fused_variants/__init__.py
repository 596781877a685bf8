"""Kernel variants of the CUDA fused FP8 MLA decode timed side by side, and its Nsight Compute source profile (issue 28)."""
