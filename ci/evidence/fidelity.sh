#!/usr/bin/env bash
# GPU evidence for the SGLang-faithful presets (helper "fidelity", issue 8 items 1, 2 and 5).
# Time: about 4 minutes on one H200 (two production pool builds + one timed prod run).
# Proves: (1) the Triton fill of a 64-token-page pool equals the CPU fill (first page zero),
# and the production GLM-5 pool with its DSA index-K cache builds on the GPU (25.49 GiB);
# (2) every strategy still matches the refreshed prod golden at page size 64, with step_ms
# for glm5-tp8.prod.b1-l4096 and deepseek-v3-tp8 (YaRN sm_scale) at ci scale.
# Writes logs and results JSON under $EVIDENCE/fidelity/; never aborts on a single failure.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out="${EVIDENCE:?set EVIDENCE}/fidelity"
mkdir -p "$out"
summary=()
step() {  # name, command...
    local name=$1; shift
    if "$@" >"$out/$name.log" 2>&1; then summary+=("PASS $name"); else summary+=("FAIL($?) $name"); fi
}
step gpu-inputs python -m pytest suites/gpu/test_gpu_inputs.py -m gpu -q
step glm5-prod-b1-l4096 python -m harness run --preset glm5-tp8 --scale prod --scenario b1-l4096 --json "$out/glm5-prod-b1-l4096.json"
step deepseek-ci-b1-l500 python -m harness run --preset deepseek-v3-tp8 --scale ci --scenario b1-l500 --json "$out/deepseek-ci-b1-l500.json"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
