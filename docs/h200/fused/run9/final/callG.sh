set -u
E=$OUT/g; mkdir -p $E
( export CUDA_VISIBLE_DEVICES=0; timeout 200 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -p no:cacheprovider -rfE --junitxml=$E/gpu-junit.xml > $E/gpu-tests.log 2>&1; echo "gpu tests exit $?" ) &
( export CUDA_VISIBLE_DEVICES=1; for sc in b32-l4096 b128-l2048; do timeout 90 python3 -m harness run --scenario $sc --strategy shadow --strategy fused_fp8 --repeats 10 --json $E/run-$sc.json > $E/run-$sc.log 2>&1; echo "run $sc exit $?"; done ) &
wait
tail -2 $E/gpu-tests.log
for sc in b32-l4096 b128-l2048; do grep -E "fused_fp8|shadow" $E/run-$sc.log | tail -2; done
cd $OUT && tar czf g.tgz g && rm -rf g
