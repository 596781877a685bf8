"""python -m ci.experiments.pool_cycle [CASE]: which strategy run leaves its pool kept by a reference cycle (GPU; pool_cycle.py)."""
