"""python -m ci.experiments.independent_timing OUT.json: cross-check the harness's GPU figures with triton.testing (GPU; independent_timing.py)."""
