set -u
E=$OUT/z; mkdir -p $E
timeout 90 python3 .scratch/cuda_check.py > $E/check.log 2>&1; echo "check exit $?"
timeout 300 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -p no:cacheprovider -rfE --junitxml=$E/gpu-junit.xml > $E/gpu-tests.log 2>&1; echo "gpu tests exit $?"
timeout 120 python3 .scratch/split_wave.py $E/split_wave.json > $E/split.log 2>&1; echo "split exit $?"
grep -c "^FAIL" $E/check.log; tail -1 $E/gpu-tests.log; grep -E "^(FAILED|ERROR)" $E/gpu-tests.log | head
python3 -c "import json; print(json.load(open('$E/split_wave.json')))"
cd $OUT && tar czf z.tgz z && rm -rf z
