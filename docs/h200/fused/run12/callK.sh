set -u
E=$OUT/k; mkdir -p $E
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 120 python3 .scratch/cuda_check.py > $E/check.log 2>&1; echo "check exit $?"
  timeout 300 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -p no:cacheprovider -rfE --junitxml=$E/gpu-junit.xml > $E/gpu-tests.log 2>&1; echo "gpu tests exit $?"
  timeout 120 python3 .scratch/cuda_variants.py $E/variants15.json > $E/variants.log 2>&1; echo "variants exit $?"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 200 python3 ci/tune_fused.py --search cuda --out $E/fused_tuning.toml --json $E/tune.json > $E/tune.log 2>&1; echo "tune exit $?"
  cp $E/fused_tuning.toml harness/kernels/fused_tuning.toml
  for sc in b1-l4096 b32-l4096 b128-l2048; do timeout 100 python3 -m harness run --scenario $sc --strategy shadow --strategy fused_fp8 --repeats 10 --json $E/run-$sc.json > $E/run-$sc.log 2>&1; echo "run $sc exit $?"; done
) &
wait
grep -c FAIL $E/check.log; tail -1 $E/check.log; tail -2 $E/gpu-tests.log; cut -c1-700 $E/variants.log
grep -E "best|^  \(" $E/tune.log | cut -c1-260
for sc in b1-l4096 b32-l4096 b128-l2048; do grep -E "fused_fp8|shadow" $E/run-$sc.log | head -8; done
cd $OUT && tar czf k.tgz k && rm -rf k
