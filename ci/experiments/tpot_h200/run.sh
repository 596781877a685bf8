#!/usr/bin/env bash
# Issue 12's remaining H200 evidence in ~150 s on ONE H200 (a 2x H200 machine works too: GPU 0 only).
#   E=/some/dir python -m ci.experiments.tpot_h200   (caller has sourced ci/gpu_env.sh)
# Steps, in order (each with its own timeout, all capped by a 170 s deadline; a step never aborts the rest):
#   rotation-b32  the crashed command (12 layers, native_fp8, --check-rotation) at b32, then
#   tpot-b32 / tpot-b1  GLM-5 TP8 rank, prod pool, stock/gather_cast/shadow/native_fp8, all-reduce from the
#                 default H200 TP2 table, with where-the-time-goes (component graphs + byte floors) and the memory plan,
#   rotation-b1   the rotation check at b1, then the report (CPU).
# No CUDA_LAUNCH_BLOCKING: the FP8 GEMM probe runs in a child process (its choice and note are in each JSON's
# kernels.gemm_choice), so a faulting probe kernel can't poison the timed process; a fault anywhere else
# surfaces with its step's log.
# Commit: $E/*.json, $E/*.log, $E/summary.txt, $E/gpus.txt, $E/report/.
set -uo pipefail
E="${E:-${EVIDENCE:-/tmp/evidence}/tpot-h200}"
mkdir -p "$E"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
deadline=$(( $(date +%s) + 170 ))
left() { echo $(( deadline - $(date +%s) )); }
step() {  # step NAME SECONDS CMD...: run with a timeout (capped by what is left), log, never abort
  local name=$1 secs=$2; shift 2
  local cap; cap=$(left)
  if [ "$cap" -le 5 ]; then echo "SKIP $name: out of time" | tee -a "$E/summary.txt"; return; fi
  [ "$secs" -gt "$cap" ] && secs=$cap
  local t0; t0=$(date +%s)
  timeout -k 5 "$secs" "$@" > "$E/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$E/summary.txt"
  tail -40 "$E/$name.log"
}
: > "$E/summary.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$E/gpus.txt" 2>&1
git rev-parse HEAD >> "$E/gpus.txt" 2>&1

ROT=(--preset glm5-tp8 --layers 12 --strategy native_fp8 --check-rotation --no-breakdown --repeats 10)
step rotation-b32 30 python3 -m harness tpot "${ROT[@]}" --scenario b32-l4096 --json "$E/rotation-b32-l4096.json"
for sc in b32-l4096 b1-l4096; do
  step "tpot-$sc" 55 python3 -m harness tpot --preset glm5-tp8 --scenario "$sc" --repeats 10 --json "$E/tpot-glm5-tp8-$sc.json"
done
step rotation-b1 25 python3 -m harness tpot "${ROT[@]}" --scenario b1-l4096 --json "$E/rotation-b1-l4096.json"

deadline=$(( $(date +%s) + 20 ))  # the report is CPU work: it always gets its 20 s
step report 20 python3 -m harness.tpot.report "$E"/tpot-*.json "$E"/rotation-*.json --out "$E/report"
echo "--- summary"; cat "$E/summary.txt"
exit 0
