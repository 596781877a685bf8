"""torchrun --nproc-per-node 2 -m ci.experiments.tp2_allreduce --out DIR: NCCL all-reduce table and the TPOT stand-in check (2 GPUs; tp2_allreduce.py)."""
