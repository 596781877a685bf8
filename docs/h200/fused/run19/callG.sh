set -u
E=$OUT/run19; mkdir -p $E
git log --oneline -1 > $E/commit.txt 2>/dev/null
( export CUDA_VISIBLE_DEVICES=0; timeout 200 python3 ci/tune_fused.py --search cuda --out $E/fused_tuning.toml --json $E/tune.json > $E/tune.log 2>&1; echo "tune exit $?" )
cp $E/fused_tuning.toml harness/kernels/fused_tuning.toml
timeout 260 python3 -m pytest suites/gpu -m gpu -n 2 --dist loadgroup -q -p no:cacheprovider -rfEs --junitxml=$E/gpu-suite-junit.xml > $E/gpu-suite-full.log 2>&1; echo "gpu suite exit $?"
tail -1 $E/gpu-suite-full.log; grep -E "^(FAILED|ERROR)" $E/gpu-suite-full.log | head
(export CUDA_VISIBLE_DEVICES=0; for sc in b32-l4096 b1-l4096; do timeout 100 python3 -m harness run --scenario $sc --strategy shadow --strategy fused_fp8 --repeats 20 --json $E/run-$sc.json > $E/run-$sc.log 2>&1; echo "run $sc exit $?"; done) &
(export CUDA_VISIBLE_DEVICES=1; for sc in b128-l2048; do timeout 100 python3 -m harness run --scenario $sc --strategy shadow --strategy fused_fp8 --repeats 20 --json $E/run-$sc.json > $E/run-$sc.log 2>&1; echo "run $sc exit $?"; done) &
wait
grep -E "best" $E/tune.log | sed -E "s/block_n=64, //; s/reload_v=False, pv_fp16=True, prefetch=False, dv_split=1, qk_chunk=0, contig=False, tokens_m=False, cuda=True, //" | cut -c1-200
for sc in b1-l4096 b32-l4096 b128-l2048; do grep -E "fused_fp8|shadow" $E/run-$sc.log | tail -2 | cut -c1-260; done
cd $OUT && tar czf run19.tgz run19 && rm -rf run19
