set -u
E=$OUT/q; mkdir -p $E
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 90 python3 .scratch/cuda_check.py > $E/check.log 2>&1; echo "check exit $?"
  timeout 240 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -x -p no:cacheprovider -rfE --junitxml=$E/gpu-junit.xml > $E/gpu-tests.log 2>&1; echo "gpu tests exit $?"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 60 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -x -p no:cacheprovider -rfE -k "paged_indices" > $E/paged.log 2>&1; rc=$?; echo "paged exit $rc"
  if [ $rc = 0 ]; then
  timeout 120 python3 .scratch/cuda_variants.py $E/variants20.json > $E/variants.log 2>&1; echo "variants exit $?"
  timeout 260 python3 ci/tune_fused.py --search cuda --out $E/fused_tuning.toml --json $E/tune.json > $E/tune.log 2>&1; echo "tune exit $?"
  cp $E/fused_tuning.toml harness/kernels/fused_tuning.toml
  for sc in b1-l4096 b32-l4096 b128-l2048; do timeout 100 python3 -m harness run --scenario $sc --strategy shadow --strategy fused_fp8 --repeats 10 --json $E/run-$sc.json > $E/run-$sc.log 2>&1; echo "run $sc exit $?"; done
  fi
) &
wait
tail -2 $E/paged.log | cut -c1-400
grep -c "^FAIL" $E/check.log; tail -1 $E/check.log | cut -c1-600; tail -2 $E/gpu-tests.log; grep -E "^(FAILED|ERROR)" $E/gpu-tests.log | head
python3 -c "
import json; rows=json.load(open('$E/variants20.json'))
keys=[k for k in rows[0] if k.startswith('b')]
print('variant'.ljust(18), ' '.join(k.replace('-l','/').replace(' ','')[:16].rjust(16) for k in keys))
for r in rows: print(r['variant'].ljust(18), ' '.join(str(r.get(k)).rjust(16) for k in keys))
print({k: v for k, v in rows[0].items() if k.startswith('err')})
"
grep -E "best" $E/tune.log | cut -c1-40,190-260
for sc in b1-l4096 b32-l4096 b128-l2048; do grep -E "fused_fp8|shadow" $E/run-$sc.log | tail -2; done
cd $OUT && tar czf q.tgz q && rm -rf q
