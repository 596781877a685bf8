#!/usr/bin/env bash
# Issue 28 on one GPU in one device call: this checkout's fused kernel against another kernel source
# (BASE_CU: e.g. main's fused_mla_cuda.cu, carried in .jitcache/), from a checkout holding the
# FlashInfer bundle and the packed caches (ci/experiments/sglang_h200/run.sh says how they are built):
#   bash ci/experiments/fused_variants/device_check.sh OUT BASE_CU
# 1. the fused GPU tests (float64 references, NaN, merges and their planted faults, graph replay), junit in OUT;
# 2. side by side, 5 interleaved rounds: GLM-5 under its table entries and under the grid merge, DeepSeek-V3
#    with its rows gathered by cp.async (BULK_ROWS=0) as a third variant; JSON in OUT/variants-*.json.
set -uo pipefail
OUT=${1:?usage: device_check.sh OUT BASE_CU}
BASE_CU=${2:?usage: device_check.sh OUT BASE_CU}
mkdir -p "$OUT"
. ci/gpu_env.sh .bundle/flashinfer-0.7.2.post1-py312.tar.xz "${JIT_TAR:-}" "${TRITON_TAR:-}"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-msgspec .whl/msgspec-*.whl  # the device lacks it
export PYTHONPATH=/tmp/site-msgspec:$PYTHONPATH
t0=$(date +%s)
timeout -k 5 "${TESTS_TIMEOUT:-240}" python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -m gpu -q -rfEs -p no:cacheprovider \
  --junitxml="$OUT/gpu-fused-junit.xml" 2>&1 | tee "$OUT/gpu-fused-pytest.log" | tail -30
echo "== tests: $(( $(date +%s) - t0 )) s"
variants() {  # NAME PRESET [ARGS...]
  local name=$1 preset=$2
  shift 2
  t0=$(date +%s)
  timeout -k 5 "${VARIANTS_TIMEOUT:-150}" python3 -m ci.experiments.fused_variants time "$OUT/variants-$name.json" \
    --preset "$preset" --variant "base_cu@$BASE_CU" --rounds "${ROUNDS:-5}" "$@" 2>&1 | grep -v round | tail -12
  echo "== variants $name: $(( $(date +%s) - t0 )) s"
}
variants glm5 glm5-tp8
variants glm5-grid glm5-tp8 --config cluster_merge=0,grid_merge=1
variants deepseek deepseek-v3-tp8 --variant gathers:BULK_ROWS=0
