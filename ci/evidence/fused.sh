#!/usr/bin/env bash
# fused_fp8 evidence on a CUDA GPU (H200): the four headline scenarios at production scale with
# fused_fp8 beside shadow (roofline rows in the JSON), and the fused GPU tests (prod goldens,
# negative controls, hidden shapes, NaN codes, graph re-planning). About 4 minutes of GPU time
# (FlashInfer's FA3 JIT for shadow comes from the caller's cache). Sourced env: ci/gpu_env.sh.
#   EVIDENCE=/some/dir bash ci/evidence/fused.sh
set -uo pipefail
E="${EVIDENCE:-/tmp/evidence}/fused"
mkdir -p "$E"
for sc in b1-l500 b1-l4096 b32-l4096 b128-l2048; do
  timeout 120 python3 -m harness run --scenario "$sc" --strategy shadow --strategy fused_fp8 --repeats 20 \
    --json "$E/glm5-tp8.prod.$sc.json" > "$E/run-$sc.log" 2>&1 || echo "run $sc: exit $?" | tee -a "$E/failures.txt"
done
timeout 300 python3 -m pytest suites/gpu/test_fused_fp8_gpu.py -q -p no:cacheprovider --junitxml="$E/gpu-junit.xml" \
  > "$E/gpu-tests.log" 2>&1 || echo "gpu tests: exit $?" | tee -a "$E/failures.txt"
python3 -m harness report "$E"/glm5-tp8.prod.*.json --out "$E/report" > "$E/report.log" 2>&1 || echo "report: exit $?" >> "$E/failures.txt"
echo "== fused_fp8 vs shadow (attn_us per layer, step_ms, floor_ratio) =="
python3 - "$E" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/glm5-tp8.prod.*.json")):
    rows = json.load(open(f))["rows"]
    m = {(r["strategy"], r["metric"]): r for r in rows}
    for s in ("shadow", "fused_fp8"):
        get = lambda k: (m.get((s, k)) or {}).get("value")
        ratio = (m.get((s, "floor_ratio")) or {}).get("detail") or {}
        print(f"{rows[0]['scenario']:11} {s:9} verdict={get('verdict')} attn_us={get('attn_us')} step_ms={get('step_ms')} "
              f"step/floor={get('floor_ratio')} attn/floor={ratio.get('attn_ratio')}")
PY
tail -3 "$E/gpu-tests.log"
