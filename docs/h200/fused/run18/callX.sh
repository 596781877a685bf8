set -u
E=$OUT/run18; mkdir -p $E
git log --oneline -1 > $E/commit.txt 2>/dev/null
timeout 300 python3 -m pytest suites/gpu -m gpu -n 2 --dist loadgroup -q -p no:cacheprovider -rfEs --junitxml=$E/gpu-suite-junit.xml > $E/gpu-suite-full.log 2>&1; echo "gpu suite exit $?"
tail -1 $E/gpu-suite-full.log
(export CUDA_VISIBLE_DEVICES=0; for sc in b32-l4096 b1-l4096; do timeout 100 python3 -m harness run --scenario $sc --strategy shadow --strategy fused_fp8 --repeats 10 --json $E/run-$sc.json > $E/run-$sc.log 2>&1; echo "run $sc exit $?"; done) &
(export CUDA_VISIBLE_DEVICES=1; for sc in b128-l2048; do timeout 100 python3 -m harness run --scenario $sc --strategy shadow --strategy fused_fp8 --repeats 10 --json $E/run-$sc.json > $E/run-$sc.log 2>&1; echo "run $sc exit $?"; done) &
wait
for sc in b1-l4096 b32-l4096 b128-l2048; do grep -E "fused_fp8|shadow" $E/run-$sc.log | tail -2 | cut -c1-250; done
tar -cJf $OUT/triton-cache.tar.xz -C $TRITON_CACHE_DIR . 2>/dev/null
cd $OUT && tar czf run18.tgz run18 && rm -rf run18
