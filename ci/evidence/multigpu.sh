#!/usr/bin/env bash
# Two-GPU evidence (issue 13 items 1-2): about 6 minutes on 2x H200 with the FlashInfer JIT cache
# warm (run the GPU suite once before). Caller has sourced ci/gpu_env.sh and set EVIDENCE.
#   (a) `pytest suites/ -m gpu` without xdist, with -n 1 and with -n 2, each timed, each with the
#       binding proof (--binding-proof: per-worker records + the controller's check) and junit;
#       the sharding model refitted from the three runs (shard_model.json, for ci/shard_model.json)
#   (b) where a worker's start-up goes (ci/startup_profile.py)
#   (c) timing isolation: GPU 0 idle vs GPU 1 under a memory-bound neighbour (ci/isolation.py)
# Writes $EVIDENCE/multigpu/; a failing step is logged and the next one still runs.
# Knobs: ISO_ROUNDS (3), ISO_REPEATS (15).
set -uo pipefail
E="${EVIDENCE:?set EVIDENCE}/multigpu"
mkdir -p "$E"
status=()
step() {  # step NAME CMD...: run, log to $E/NAME.log, remember the exit code
    local name=$1; shift
    "$@" > "$E/$name.log" 2>&1
    local rc=$?
    status+=("$name: exit $rc")
    return 0
}
now() { date +%s.%N; }

nvidia-smi topo -m > "$E/topo.txt" 2>&1
nvidia-smi --query-gpu=index,uuid,pci.bus_id,name --format=csv > "$E/gpus.csv" 2>&1
python3 -c "import pytest, xdist, torch; print('pytest', pytest.__version__, 'xdist', xdist.__version__, 'torch', torch.__version__)" > "$E/versions.txt" 2>&1

declare -A wall
for mode in 0 1 2; do
    xdist=()
    [ "$mode" -gt 0 ] && xdist=(-n "$mode")
    t0=$(now)
    step "suite-n$mode" python3 -m pytest suites/ -m gpu -p no:cacheprovider "${xdist[@]}" --durations=15 \
        --binding-proof "$E/proof-n$mode" --junitxml="$E/junit-n$mode.xml"
    wall[$mode]=$(python3 -c "print(round($(now) - $t0, 1))")
    echo "${wall[$mode]}" > "$E/wall-n$mode.txt"
done
step shard-model python3 -m ci.shard_plan fit --out "$E/shard_model.json" \
    "0:${wall[0]}:$E/junit-n0.xml" "1:${wall[1]}:$E/junit-n1.xml" "2:${wall[2]}:$E/junit-n2.xml"
step startup-profile python3 -m ci.startup_profile "$E/startup_profile.json"
step isolation python3 -m ci.isolation "$E" --gpus 0,1 --rounds "${ISO_ROUNDS:-3}" --repeats "${ISO_REPEATS:-15}"

{
    echo "== multigpu evidence summary"
    for mode in 0 1 2; do
        printf -- "-n %s: %s s wall; %s; binding proof: %s\n" "$mode" "${wall[$mode]}" \
            "$(grep -E ' in [0-9.]+s' "$E/suite-n$mode.log" | tail -1)" \
            "$(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(('ok ' if c['ok'] else 'FAILED ') + json.dumps(c['ran_on']) + ' ' + '; '.join(c['problems'] + c['notes']))" "$E/proof-n$mode/check.json" 2>&1 | tail -1)"
    done
    python3 - "$E" <<'PY' 2>&1 | tail -10
import json, sys
from pathlib import Path
e = Path(sys.argv[1])
for mode in (0, 1, 2):
    try:
        t = json.loads((e / f"proof-n{mode}" / "check.json").read_text())["timeline"]
        print(f"-n {mode} per process: " + "; ".join(f"{w} start-up {v['startup_s']} s, tests {v['test_s']} s" for w, v in sorted(t.items())))
    except Exception as exc:
        print(f"-n {mode}: no timeline ({exc})")
try:
    from ci.shard_plan import junit_durations
    runs = {m: junit_durations(e / f"junit-n{m}.xml") for m in (0, 1, 2)}
    print("summed test time: " + ", ".join(f"-n {m} {sum(d.values()):.1f} s" for m, d in runs.items()))
    grown = sorted(runs[0], key=lambda t: runs[0][t] - runs[1].get(t, 0))[:4]
    print("tests slower under -n 1 than without xdist: " + "; ".join(
        f"{t.split('::')[-1]} {runs[0][t]:.2f} -> {runs[1].get(t, float('nan')):.2f} s" for t in grown))
except Exception as exc:
    print(f"no per-test comparison ({exc})")
PY
    echo "-- start-up profile (fresh process)"; grep -E " s  " "$E/startup-profile.log" | head -14
    echo "-- isolation"; tail -2 "$E/isolation.log"
    echo "-- shard decision from this run's model"
    python3 -m ci.shard_plan choose --model "$E/shard_model.json" --gpus 2 suites/ -m gpu 2>&1 | head -2
    printf '%s\n' "${status[@]}"
} | tee "$E/summary.txt"
