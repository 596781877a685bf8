#!/usr/bin/env bash
# Issue 28, convert_once and ping_pong on one GPU in one device call (a checkout holding the FlashInfer bundle, msgspec wheel and
# packed caches; ci/experiments/sglang_h200/run.sh says how they are built):
#   bash ci/experiments/fused_variants/convert_once_check.sh OUT [PRESET ...]
# 1. per preset and shape, the table's launch (base) beside one-CTA-per-SM launches: convert_once, ping_pong (two
#    groups of 8 warps on alternate tiles), and at b128 the plain kernel with one split; 5 interleaved rounds;
#    JSON in OUT/once-PRESET-SHAPE.json;
# 2. the fused GPU tests (float64 references, NaN, merges and their planted faults, graph replay), junit in OUT.
set -uo pipefail
OUT=${1:?usage: convert_once_check.sh OUT [PRESET ...]}
shift
mkdir -p "$OUT"
. ci/gpu_env.sh .bundle/flashinfer-0.7.2.post1-py312.tar.xz "${JIT_TAR:-}" "${TRITON_TAR:-}"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-msgspec .whl/msgspec-*.whl  # the device lacks it
export PYTHONPATH=/tmp/site-msgspec:$PYTHONPATH
variants() {  # PRESET SHAPE VARIANT...
  local preset=$1 shape=$2
  shift 2
  local args=()
  for v in "$@"; do args+=(--variant "$v"); done
  t0=$(date +%s)
  timeout -k 5 "${VARIANTS_TIMEOUT:-150}" python3 -m ci.experiments.fused_variants time "$OUT/once-$preset-$shape.json" \
    --preset "$preset" --shapes "$shape" --rounds "${ROUNDS:-5}" "${args[@]}" 2>&1 | grep -v round | tail -8
  echo "== $preset $shape: $(( $(date +%s) - t0 )) s"
}
one_cta="num_stages=3,cluster_merge=0,grid_merge=0,pdl_merge=0"
pp="ping_pong=1,num_warps=16,num_stages=2,cluster_merge=0,grid_merge=0,pdl_merge=0"
for preset in "${@:-glm5-tp8}"; do
  variants "$preset" 32x4096 "once4c:convert_once=1,$one_cta,num_splits=4,cluster_merge=1" \
    "pp4c:$pp,num_splits=4,cluster_merge=1" "pp4g:$pp,num_splits=4,grid_merge=1"
  variants "$preset" 128x2048 "once1:convert_once=1,$one_cta,num_splits=1" "pp1:$pp,num_splits=1" \
    "plain1:$one_cta,num_splits=1,num_stages=4"
done
if [ "${TESTS:-1}" = 1 ]; then
  t0=$(date +%s)
  timeout -k 5 "${TESTS_TIMEOUT:-240}" python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -m gpu -q -rfEs -p no:cacheprovider \
    --junitxml="$OUT/gpu-fused-junit.xml" 2>&1 | tee "$OUT/gpu-fused-pytest.log" | tail -15
  echo "== tests: $(( $(date +%s) - t0 )) s"
fi
