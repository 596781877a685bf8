set -u
E=$OUT/mem; mkdir -p $E
timeout 120 python3 -m pytest suites/gpu/test_session_memory.py -q -p no:cacheprovider -rfE > $E/mem.log 2>&1; echo "mem test exit $?"
timeout 150 python3 -m pytest suites/gpu -m gpu -n 2 --dist loadgroup -q -p no:cacheprovider -rfEs --junitxml=$E/gpu-suite-junit.xml -k "session_memory or bucket_replay or correctness" > $E/suite-part.log 2>&1; echo "suite part exit $?"
tail -2 $E/mem.log; tail -1 $E/suite-part.log; grep -E "^(FAILED|ERROR)" $E/suite-part.log | head
cd $OUT && tar czf mem.tgz mem && rm -rf mem
