"""python -m ci.experiments.asv_gate OUT_DIR --role aa|planted --source REPO: A/A and planted pairs through ci/asv_gate.py (GPU; asv_gate.py)."""
