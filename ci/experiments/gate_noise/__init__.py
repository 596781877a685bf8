"""python -m ci.experiments.gate_noise OUT_DIR: asv's test, the harness rule and the asv gate on synthetic noise (CPU)."""
