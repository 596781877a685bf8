"""GPU suites (marker gpu; skipped on CPU with the reason "needs a CUDA GPU")."""
