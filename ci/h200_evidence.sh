#!/usr/bin/env bash
# The GPU evidence run (H200 or any CUDA runner): GPU suite, the four headline scenarios at
# production scale, independent timing cross-check, SM120 build proofs. Everything lands in
# /tmp/evidence/ and is packed into $OUT/evidence.tar.gz (with the FlashInfer JIT cache as
# $OUT/flashinfer-jit.tar for the next call).
#   OUT=/some/dir bash ci/h200_evidence.sh
set -uo pipefail
. ci/gpu_env.sh
E=/tmp/evidence
mkdir -p "$E/results"
nvidia-smi > "$E/nvidia-smi.txt"
python3 -c "import cupti" 2>/dev/null && echo "cupti: available" >> "$E/nvidia-smi.txt" || echo "cupti: not installed (timing uses CUDA events / graphs)" >> "$E/nvidia-smi.txt"
start=$(date +%s)
python3 -m pytest suites/ -m gpu -q -p no:cacheprovider --junitxml="$E/gpu-junit.xml" 2>&1 | tee "$E/gpu-suite.log" | tail -15
echo "gpu suite wall: $(( $(date +%s) - start )) s" | tee -a "$E/gpu-suite.log"
for sc in b1-l500 b1-l4096 b32-l4096 b128-l2048; do
  python3 -m harness run --scenario "$sc" --json "$E/results/glm5-tp8.prod.$sc.json" 2>&1 | grep -v Warning | tee "$E/run-$sc.log" | tail -12
done
python3 -m ci.independent_timing "$E/independent.json" > "$E/independent.log" 2>&1; tail -12 "$E/independent.log"
python3 -m ci.sm120_build_check > "$E/sm120-flashinfer.log" 2>&1; tail -3 "$E/sm120-flashinfer.log"
python3 -c "from harness.kernels.sm120_compile import compile_all_for; print('triton sm_120 kernels:', compile_all_for(120))" > "$E/sm120-triton.log" 2>&1; tail -2 "$E/sm120-triton.log"
tar -czf "$OUT/evidence.tar.gz" -C /tmp evidence
tar -cf "$OUT/flashinfer-jit.tar" -C "$FLASHINFER_WORKSPACE_BASE" .
