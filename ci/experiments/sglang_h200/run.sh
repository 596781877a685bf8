#!/usr/bin/env bash
# Issue 26's (and with `fused` issue 28's) H200 evidence on ONE H200, from a checkout holding .bundle/flashinfer-0.7.2.post1-py312.tar.xz,
# .bundle/sglang-0.5.23-py312.tar.xz (ci/build_sglang_bundle.sh) and .whl/msgspec-*.whl:
#   bash ci/experiments/sglang_h200/run.sh OUT [env|tests|suite|runs|fused|launch|tune]...   (default: env tests runs)
# env    the environment: GPU, torch, the time `import flashinfer_mla_backend` takes, the sgl_kernel stand-in
# tests  python -m pytest suites/gpu -m gpu -k sglang  (junit: OUT/gpu-sglang-junit.xml)
# suite  the whole GPU suite as a GPU runner runs it (--gpu-runner: an undeclared skip fails), SGLang-backed tests included, in one process (no xdist: one worker per GPU is the
#        rule, and on one GPU several workers each building a production pool ran out of memory; junit:
#        OUT/gpu-junit.xml; a suite past SUITE_TIMEOUT is interrupted, so its junit still holds what ran). JIT_TAR= / TRITON_TAR= name packed FlashInfer JIT and Triton caches (cold: minutes)
# runs   python -m ci.experiments.sglang_h200 OUT/runs  (8 prod runs: stock, sglang_flashinfer, sglang_fa3; RUNS= and
#        REPEATS= override its --runs and --repeats)
# fused  python -m ci.experiments.fused_runs: issue 28's fused_fp8 production runs (2 per case, ~200 s) and its
#        targets judged (OUT/fused-summary.md; the run files in OUT/fused.tar.gz); a checkout without .git sets
#        MLA_HARNESS_GIT_COMMIT, else the judgement refuses runs that name no commit
# launch issue 28's timer agreement: python -m ci.experiments.ncu_fused.launch measure (the harness's attn_us beside CUPTI's
#        kernel records of the same graph) at GLM-5 b32-l4096 and b128-l2048 (OUT/launch-glm5-S.json)
# tune   python -m ci.experiments.tune_fused for DeepSeek-V3 at b32-l4096 and b128-l2048, entries for this GPU only
#        (--gpu-entries; OUT/tune-dsv3.json and the table it wrote, OUT/fused_tuning.toml)
set -uo pipefail
OUT=${1:?usage: run.sh OUT [env|tests|suite|runs|fused|launch|tune]...}
shift
steps=${*:-env tests runs}
for step in $steps; do
  case $step in env|tests|suite|runs|fused|launch|tune) ;; *) echo "run.sh: unknown step $step" >&2; exit 2 ;; esac
done
mkdir -p "$OUT"
. ci/gpu_env.sh .bundle/flashinfer-0.7.2.post1-py312.tar.xz "${JIT_TAR:-}" "${TRITON_TAR:-}" .bundle/sglang-0.5.23-py312.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-msgspec .whl/msgspec-*.whl
export PYTHONPATH=/tmp/site-msgspec:$PYTHONPATH
for step in $steps; do
  t0=$(date +%s)
  case $step in
    env) { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
           python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
           python3 -c "
import time; t = time.time()
from harness.integrations.sglang import runtime, stand_in
print('import_reason:', runtime.import_reason(runtime.MLA_BACKEND), f'({time.time() - t:.1f} s)')
print('sglang', runtime.version(), 'sgl_kernel stand-in:', stand_in.is_stand_in('sgl_kernel'))
print('fa3 backend:', runtime.import_reason(runtime.FA3_BACKEND))"; } 2>&1 | tee "$OUT/env.txt" ;;
    tests) timeout -s INT -k 20 "${TESTS_TIMEOUT:-300}" python3 -m pytest suites/gpu -m gpu -k sglang -q -rs -p no:cacheprovider \
             --junitxml="$OUT/gpu-sglang-junit.xml" 2>&1 | tee "$OUT/gpu-sglang-pytest.log" | tail -40 ;;
    suite) timeout -s INT -k 20 "${SUITE_TIMEOUT:-480}" python3 -m pytest suites/gpu -m gpu --gpu-runner -q -rfEs -p no:cacheprovider \
             --junitxml="$OUT/gpu-junit.xml" 2>&1 | tee "$OUT/gpu-pytest.log" | tail -40 ;;
    runs) timeout -k 5 "${RUNS_TIMEOUT:-500}" python3 -m ci.experiments.sglang_h200 /tmp/sglang-runs --repeats "${REPEATS:-20}" \
             ${RUNS:+--runs $RUNS} 2>&1 | tee "$OUT/runs.log" | grep -v '^\s*$' | tail -60
          tar -czf "$OUT/runs.tar.gz" -C /tmp sglang-runs ;;  # one file back (a device call returns at most 8)
    fused) python3 -m ci.experiments.fused_runs /tmp/fused-runs 2>&1 | tee "$OUT/fused.log" | tail -20
           cp /tmp/fused-runs/summary.md "$OUT/fused-summary.md"
           tar -czf "$OUT/fused.tar.gz" -C /tmp fused-runs ;;
    launch) for s in b32-l4096 b128-l2048; do
              python3 -m ci.experiments.ncu_fused.launch measure --preset glm5-tp8 --scenario "$s" --strategy fused_fp8 \
                --repeats 20 --out "$OUT/launch-glm5-$s.json" 2>&1 | tail -3
            done ;;
    tune) python3 -m ci.experiments.tune_fused --search cuda --preset deepseek-v3-tp8 --gpu-entries --shapes 32x4096,128x2048 \
            --json "$OUT/tune-dsv3.json" > "$OUT/tune-dsv3.log" 2>&1; echo "tune exit $?"; tail -6 "$OUT/tune-dsv3.log"
          cp harness/kernels/fused_tuning.toml "$OUT/" ;;
  esac
  echo "== $step: $(( $(date +%s) - t0 )) s"
done
