"""python -m ci.experiments.gate OUT_DIR: A/A and planted-slowdown pairs judged by `harness compare` (GPU; gate.py)."""
