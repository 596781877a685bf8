set -u
E=$OUT/r19e; mkdir -p $E
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 .scratch/wt_check.py > $E/check.log 2>&1; echo "check exit $?"
  timeout 300 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -p no:cacheprovider -rfE --junitxml=$E/gpu-junit.xml > $E/gpu-tests.log 2>&1; echo "gpu tests exit $?"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 330 python3 ci/tune_fused.py --search cuda --out $E/fused_tuning.toml --json $E/tune.json > $E/tune.log 2>&1; echo "tune exit $?"
  cp $E/fused_tuning.toml harness/kernels/fused_tuning.toml
  for sc in b32-l4096 b128-l2048 b1-l4096; do timeout 70 python3 -m harness run --scenario $sc --strategy shadow --strategy fused_fp8 --repeats 20 --json $E/run-$sc.json > $E/run-$sc.log 2>&1; echo "run $sc exit $?"; done
) &
wait
grep -c "^FAIL" $E/check.log; grep -E "FAIL|EXC|compile|FAILS|Error" $E/check.log | head -20 | cut -c1-400; tail -2 $E/gpu-tests.log; grep -E "^(FAILED|ERROR)" $E/gpu-tests.log | head
grep -E "best" $E/tune.log | sed -E "s/block_n=64, //; s/reload_v=False, pv_fp16=True, prefetch=False, dv_split=1, qk_chunk=0, contig=False, tokens_m=False, cuda=True, //" | cut -c1-220
python3 -c "import json; d=json.load(open(\"$E/tune.json\")); [print(s[\"batch\"], s[\"kv_len\"], round(t[\"us\"],1), t[\"num_splits\"], t[\"num_stages\"], t[\"num_warps\"], \"pdl\" if t[\"pdl_merge\"] else \"clu\" if t[\"cluster_merge\"] else \"cta\") for s in d[\"shapes\"] for t in s[\"top\"][:5]]"
for sc in b1-l4096 b32-l4096 b128-l2048; do grep -E "fused_fp8|shadow" $E/run-$sc.log | tail -2 | cut -c1-250; done
cd $OUT && tar czf r19e.tgz r19e && rm -rf r19e
