set -u
E=$OUT/r19l; mkdir -p $E
timeout 75 python3 .scratch/r19l.py $E/redux.json > $E/redux.log 2>&1; echo "ab exit $?"
grep -E "^r[0-1] " $E/redux.log | cut -c1-100
timeout 55 python3 .scratch/cuda_check.py > $E/check.log 2>&1; echo "check exit $?"
grep -c "^FAIL" $E/check.log; grep -E "FAILS" $E/check.log | tail -1
timeout 100 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -x -p no:cacheprovider -rfE --junitxml=$E/gpu-junit.xml > $E/gpu-tests.log 2>&1; echo "gpu tests exit $?"
tail -1 $E/gpu-tests.log; grep -E "^(FAILED|ERROR)" $E/gpu-tests.log | head -3
