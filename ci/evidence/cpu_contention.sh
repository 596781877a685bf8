#!/usr/bin/env bash
# Where does -n 2 lose its time (issue 13)? The same prod GPU tests alone on GPU 0, then on GPU 0 and GPU 1 at
# once, each under cProfile; writes $OUT/diag/{alone,pairA,pairB}.{log,cum.txt,tot.txt}. Sourced env: ci/gpu_env.sh.
set -u
D=$OUT/diag; mkdir -p $D
T="suites/gpu/test_gpu_correctness.py"
K="prod_strategies_match_golden and (b128 or multistep)"
prof() {  # prof NAME GPU
  CUDA_VISIBLE_DEVICES=$2 timeout 120 python3 -m cProfile -o $D/$1.prof -m pytest $T -k "$K" -q -p no:cacheprovider --durations=0 > $D/$1.log 2>&1
  python3 -c "import pstats,sys; p=pstats.Stats(sys.argv[1]); p.sort_stats('cumulative').print_stats(45)" $D/$1.prof > $D/$1.cum.txt 2>&1
  python3 -c "import pstats,sys; p=pstats.Stats(sys.argv[1]); p.sort_stats('tottime').print_stats(30)" $D/$1.prof > $D/$1.tot.txt 2>&1
}
prof warm 0
prof alone 0
prof pairA 0 & prof pairB 1 & wait
( time nvidia-smi --query-gpu=clocks.sm --format=csv ) > $D/smi.txt 2>&1
nproc >> $D/smi.txt; python3 -c "import torch;print(torch.get_num_threads())" >> $D/smi.txt
for f in alone pairA pairB; do echo == $f; tail -2 $D/$f.log; grep -E "s (call|setup)" $D/$f.log | head -8; done
