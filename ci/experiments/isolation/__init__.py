"""python -m ci.experiments.isolation OUT_DIR: do one GPU's timings move while another GPU is loaded? (2 GPUs; isolation.py)."""
