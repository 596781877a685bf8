#!/usr/bin/env bash
# hostile (issue 10) on GPU: the dtype contract asserted at every attention call holds for the
# FlashInfer backend (bf16 [B,H,512] out, fp32 LSE, bf16 / e4m3 KV), the planted-fault checks
# behave on CUDA, and the GPU correctness suite stays green. About 3 minutes of GPU time.
# Writes $EVIDENCE/hostile/{run_b1-l500.log,run_nan.log,faults.log,gpu_correctness.log,summary.md}.
set -u
OUT="$EVIDENCE/hostile"
mkdir -p "$OUT"
status() { echo "| $1 | exit $2 (want $3) | $([ "$2" = "$3" ] && echo ok || echo MISMATCH) |" >> "$OUT/summary.md"; }
echo "| check | result | |" > "$OUT/summary.md"; echo "|---|---|---|" >> "$OUT/summary.md"

python -m harness run --scenario b1-l500 --repeats 0 --json "$OUT/run_b1-l500.json" > "$OUT/run_b1-l500.log" 2>&1
status "run b1-l500 (contract on flashinfer)" $? 0
python -m harness run --scenario b1-l500 --repeats 0 --plant-fault nan-in-pool > "$OUT/run_nan.log" 2>&1
status "nan-in-pool on flashinfer" $? 1
python -m harness run --scenario b1-l500 --repeats 0 --plant-fault stale-after-reuse > "$OUT/faults.log" 2>&1
status "stale-after-reuse without reuse" $? 2
timeout 900 python -m pytest suites/gpu/test_gpu_correctness.py -x -q -p no:cacheprovider > "$OUT/gpu_correctness.log" 2>&1
status "suites/gpu/test_gpu_correctness.py" $? 0
grep -h "contract" "$OUT"/*.log | head -5 >> "$OUT/summary.md" || true
cat "$OUT/summary.md"
