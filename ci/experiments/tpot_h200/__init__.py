"""python -m ci.experiments.tpot_h200: the model-shaped TPOT evidence on one H200 in ~150 s (run.sh)."""
