"""python -m ci.experiments.shard_refit: time the GPU suite without xdist, -n 1 and -n 2 on 2 GPUs and refit ci/shard_model.json (run.sh)."""
