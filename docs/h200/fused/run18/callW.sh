set -u
E=$OUT/x; mkdir -p $E
git log --oneline -1 > $E/commit.txt 2>/dev/null; git diff --stat > $E/diffstat.txt 2>/dev/null
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 60 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -x -p no:cacheprovider -rfE -k "past_one_wave" > $E/wave-test.log 2>&1; echo "wave test exit $?"
  timeout 90 python3 .scratch/cuda_check.py > $E/check.log 2>&1; echo "check exit $?"
  timeout 300 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -p no:cacheprovider -rfE --junitxml=$E/gpu-junit.xml > $E/gpu-tests.log 2>&1; echo "gpu tests exit $?"
  tar -cJf $E/triton-cache.tar.xz -C $TRITON_CACHE_DIR . 2>/dev/null
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 60 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -x -p no:cacheprovider -rfE -k "past_one_wave" > $E/wave-test1.log 2>&1; rc=$?; echo "wave test (gpu1) exit $rc"
  if [ $rc = 0 ]; then
  timeout 280 python3 ci/tune_fused.py --search cuda --out $E/fused_tuning.toml --json $E/tune.json > $E/tune.log 2>&1; echo "tune exit $?"
  cp $E/fused_tuning.toml harness/kernels/fused_tuning.toml
  for sc in b1-l4096 b32-l4096 b128-l2048; do timeout 100 python3 -m harness run --scenario $sc --strategy shadow --strategy fused_fp8 --repeats 10 --json $E/run-$sc.json > $E/run-$sc.log 2>&1; echo "run $sc exit $?"; done
  fi
) &
wait
tail -3 $E/wave-test.log | cut -c1-600
grep -c "^FAIL" $E/check.log; tail -1 $E/check.log | cut -c1-400; tail -2 $E/gpu-tests.log; grep -E "^(FAILED|ERROR)" $E/gpu-tests.log | head
grep -E "best" $E/tune.log | sed -E "s/block_n=64, //; s/reload_v=False, pv_fp16=True, prefetch=False, dv_split=1, qk_chunk=0, contig=False, tokens_m=False, cuda=True, //" | cut -c1-300
for sc in b1-l4096 b32-l4096 b128-l2048; do grep -E "fused_fp8|shadow" $E/run-$sc.log | tail -2 | cut -c1-250; done
