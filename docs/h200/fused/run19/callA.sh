set -u
E=$OUT/r19a; mkdir -p $E
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 .scratch/overlap_check.py > $E/check.log 2>&1; echo "check exit $?"
  timeout 300 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -p no:cacheprovider -rfE --junitxml=$E/gpu-junit.xml > $E/gpu-tests.log 2>&1; echo "gpu tests exit $?"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 420 python3 ci/tune_fused.py --search cuda --shapes 32x4096,128x2048,1x4096 --out $E/fused_tuning.toml --json $E/tune.json > $E/tune.log 2>&1; echo "tune exit $?"
) &
wait
grep -c "^FAIL" $E/check.log; grep -E "FAIL|EXC|compile|FAILS" $E/check.log | head -20 | cut -c1-400; tail -2 $E/gpu-tests.log; grep -E "^(FAILED|ERROR)" $E/gpu-tests.log | head
grep -E "best" $E/tune.log | sed -E "s/block_n=64, //; s/reload_v=False, pv_fp16=True, prefetch=False, dv_split=1, qk_chunk=0, contig=False, tokens_m=False, cuda=True, //" | cut -c1-300
python3 -c "import json; d=json.load(open(\"$E/tune.json\")); [print(s[\"batch\"], s[\"kv_len\"], round(t[\"us\"],1), t[\"num_splits\"], t[\"num_stages\"], t[\"num_warps\"], \"ov\" if t.get(\"overlap\") else \"--\", \"pdl\" if t[\"pdl_merge\"] else \"clu\" if t[\"cluster_merge\"] else \"cta\") for s in d[\"shapes\"] for t in s[\"top\"]]"
cd $OUT && tar czf r19a.tgz r19a && rm -rf r19a
