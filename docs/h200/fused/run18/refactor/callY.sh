set -u
E=$OUT/y; mkdir -p $E
git log --oneline -1 > $E/commit.txt 2>/dev/null
timeout 90 python3 .scratch/cuda_check.py > $E/check.log 2>&1; echo "check exit $?"
timeout 300 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -p no:cacheprovider -rfE --junitxml=$E/gpu-junit.xml > $E/gpu-tests.log 2>&1; echo "gpu tests exit $?"
sed -i 's/for batch, kv_len, splits in ((32, 4096, 8), (40, 4096, 8)):/for batch, kv_len, splits in ((32, 4096, 8),):/' .scratch/split_wave.py
timeout 120 python3 .scratch/split_wave.py $E/split_wave.json > $E/split.log 2>&1; echo "split exit $?"
grep -c "^FAIL" $E/check.log; tail -2 $E/gpu-tests.log; grep -E "^(FAILED|ERROR)" $E/gpu-tests.log | head
python3 -c "
import json; from harness.kernels.fused_tuning import load_table; print(json.load(open('$E/split_wave.json')))"
cd $OUT && tar czf y.tgz y && rm -rf y
