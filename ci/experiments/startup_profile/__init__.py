"""python -m ci.experiments.startup_profile OUT.json: where a GPU test worker's start-up goes (GPU; startup_profile.py)."""
