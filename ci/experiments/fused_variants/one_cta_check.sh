#!/usr/bin/env bash
# Issue 28 on one GPU in one device call: per preset, the table's b32 and b128 launches (base) beside the launches of
# one CTA per SM, 5 interleaved rounds, from a checkout holding the FlashInfer bundle, msgspec wheel and packed caches
# (ci/experiments/sglang_h200/run.sh says how they are built):
#   bash ci/experiments/fused_variants/one_cta_check.sh OUT [PRESET ...]
# pp: ping_pong (16 warps as two groups of 8 on alternate tiles); s3: one 3-stage 8-warp ring; at b32 4 splits in
# clusters of 4, at b128 no split. JSON in OUT/one-cta-PRESET-SHAPE.json. The fused GPU tests: device_check.sh.
set -uo pipefail
OUT=${1:?usage: one_cta_check.sh OUT [PRESET ...]}
shift
mkdir -p "$OUT"
. ci/gpu_env.sh .bundle/flashinfer-0.7.2.post1-py312.tar.xz "${JIT_TAR:-}" "${TRITON_TAR:-}"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-msgspec .whl/msgspec-*.whl  # the device lacks it
export PYTHONPATH=/tmp/site-msgspec:$PYTHONPATH
pp="ping_pong=1,num_warps=16,num_stages=2,cluster_merge=0,grid_merge=0,pdl_merge=0"
s3="ping_pong=0,num_warps=8,num_stages=3,cluster_merge=0,grid_merge=0,pdl_merge=0"
for preset in "${@:-glm5-tp8}"; do
  for shape in 32x4096 128x2048; do
    case $shape in
      32x4096) split="num_splits=4,cluster_merge=1" ;;
      *) split="num_splits=1" ;;
    esac
    t0=$(date +%s)
    timeout -k 5 "${VARIANTS_TIMEOUT:-150}" python3 -m ci.experiments.fused_variants time "$OUT/one-cta-$preset-$shape.json" \
      --preset "$preset" --shapes "$shape" --rounds "${ROUNDS:-5}" --variant "pp:$pp,$split" --variant "s3:$s3,$split" \
      2>&1 | grep -v round | tail -4
    echo "== $preset $shape: $(( $(date +%s) - t0 )) s"
  done
done
