"""python -m ci.experiments.sglang_gate OUT_DIR --fixture REPO: the SGLang gate on the fixture commits a-d (GPU; sglang_gate.py)."""
