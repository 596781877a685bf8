#!/usr/bin/env bash
# Gate-trust evidence (issue 9), on one H200: about 6 minutes of GPU time.
#   1. ci/gate_experiment.py: the four headline scenarios at glm5-tp8 prod scale, 5 A/A pairs
#      each (no gating metric may regress) and 5 pairs each with a planted 10% and 5% step
#      slowdown (a calibrated torch.cuda._sleep kernel after the graph replay): ~4-5 min.
#   2. one cross-process A/A pair: two `harness run --scenario b1-l500 --strategy gather_cast`
#      processes and `harness compare` (exit code and table): ~1 min, capped at 240 s.
#   3. the clock guard's reading of this GPU and the control row (a few seconds).
# Writes $EVIDENCE/gate/: gate-experiment.{md,json}, *.log, aa-*.json. Never aborts on one failure.
# Caller: EVIDENCE=/some/dir bash ci/evidence/gate.sh (ci/gpu_env.sh already sourced).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
E="${EVIDENCE:?set EVIDENCE}/gate"
mkdir -p "$E"
start=$(date +%s)

python3 - > "$E/clock-guard.log" 2>&1 <<'PY' || echo "clock guard check failed (see clock-guard.log)"
import torch
from harness import clocks
from harness.control import control_row
dev = torch.device("cuda")
print("state:", clocks.read_state(dev))
row = control_row(dict(preset="glm5-tp8", scale="prod", scenario="-", backend="-"), dev)
print("control_copy_gbps median", round(row.value), "iqr", round(row.iqr, 1), "guard", row.detail["guard"])
PY
cat "$E/clock-guard.log"

timeout 420 python3 ci/gate_experiment.py "$E" > "$E/gate-experiment.log" 2>&1
echo "gate_experiment exit $? ($(( $(date +%s) - start )) s)" | tee -a "$E/gate-experiment.log"
sed -n '/^## A\/A/,$p' "$E/gate-experiment.md" 2>/dev/null | head -60

for side in a b; do
  timeout 120 python3 -m harness run --scenario b1-l500 --strategy gather_cast --json "$E/aa-$side.json" \
    > "$E/aa-run-$side.log" 2>&1 || echo "harness run $side: exit $? (see aa-run-$side.log)"
done
python3 -m harness compare "$E/aa-a.json" "$E/aa-b.json" > "$E/aa-compare.log" 2>&1
echo "cross-process A/A harness compare: exit $?" | tee -a "$E/aa-compare.log"
tail -8 "$E/aa-compare.log"
echo "gate evidence: $(( $(date +%s) - start )) s, files in $E"
