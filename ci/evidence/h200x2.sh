#!/usr/bin/env bash
# The committed H200 evidence (docs/h200/), in two calls on a 2x H200 machine, each under 9 minutes:
#   PHASE=1: GPU 0: the GPU suite with the binding proof, the four headline scenarios (all strategies,
#            fa3) and two with fa2; GPU 1 at the same time: the gate's A/A + planted-slowdown
#            experiment, then the model-shaped TPOT step (b1-l4096, b32-l4096) and its rotation check.
#   PHASE=2: GPU 0: the GPU suite again (after phase 1's fixes); GPU 1 at the same time: the gate
#            experiment again; then both GPUs: the suite sharded with -n 2 (binding proof), the TP2
#            NCCL all-reduce check of the one-GPU all-reduce model, the timing-isolation experiment.
#   PHASE=3: GPU 1: the gate experiment on all four headline scenarios; GPU 0 at the same time: the
#            GPU suite (its Triton cache goes to $OUT/triton-cache.tar.xz); then both GPUs: the TP2
#            step check and the timing-isolation experiment.
#   PHASE=4: the asv gate experiment's pairs (A/A on GPU 0, planted 10% on GPU 1; ASV_PAIRS, default 2).
#   PHASE=5: ci/evidence/shard_h200.sh (no xdist, -n 1, -n 2 timings and the sharding model refit).
# Every step has a time cap; a failing step is logged and the next one runs. Results land in
# $EVIDENCE (default /tmp/evidence) and are packed into $OUT/evidence-phase$PHASE.tar.gz.
#   . ci/gpu_env.sh BUNDLE JIT_TAR; PHASE=1 bash ci/evidence/h200x2.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
E=${EVIDENCE:-/tmp/evidence}
PHASE=${PHASE:?set PHASE=1 to 5}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
mkdir -p "$TRITON_CACHE_DIR"
mkdir -p "$E/results" "$E/logs"
log() { echo "[$(date +%T)] $*" | tee -a "$E/steps-phase$PHASE.txt"; }
step() {  # step NAME SECONDS CMD...: capped, logged, never fatal
    local name=$1 secs=$2; shift 2
    local t0; t0=$(date +%s)
    timeout -k 5 "$secs" "$@" > "$E/logs/$name.log" 2>&1
    log "$name: exit $? in $(( $(date +%s) - t0 )) s"
    tar -czf "$OUT/evidence-phase$PHASE.tar.gz" -C "$(dirname "$E")" "$(basename "$E")" 2>/dev/null  # a cut call keeps what was done
}

if [ "$PHASE" = 1 ]; then
    nvidia-smi > "$E/nvidia-smi.txt" 2>&1
    nvidia-smi topo -m >> "$E/nvidia-smi.txt" 2>&1
    (   # GPU 1: gate experiment, then the model-shaped step
        export CUDA_VISIBLE_DEVICES=1
        step gate-experiment 230 python3 ci/gate_experiment.py "$E/gate" --pairs 5 --repeats 20
        step tpot-b1-l4096 80 python3 -m harness tpot --scenario b1-l4096 --repeats 20 --profile --json "$E/results/tpot-b1-l4096.json"
        step tpot-b32-l4096 80 python3 -m harness tpot --scenario b32-l4096 --repeats 20 --json "$E/results/tpot-b32-l4096.json"
        step tpot-rotation 45 python3 -m harness tpot --scenario b32-l4096 --layers 12 --strategy native_fp8 --check-rotation \
            --repeats 20 --json "$E/results/tpot-rotation-b32-l4096.json"
    ) &
    side=$!
    export CUDA_VISIBLE_DEVICES=0
    step gpu-suite 170 python3 -m pytest suites/gpu -m gpu -q -p no:cacheprovider -rs --durations=10 \
        --binding-proof "$E/proof-n0" --junitxml="$E/gpu-junit.xml"
    for sc in b1-l500 b1-l4096 b32-l4096 b128-l2048; do
        step "run-fa3-$sc" 75 python3 -m harness run --scenario "$sc" --kernel fa3 --repeats 20 \
            --json "$E/results/glm5-tp8.prod.$sc.json"
    done
    for sc in b1-l4096 b32-l4096; do
        step "run-fa2-$sc" 45 python3 -m harness run --scenario "$sc" --kernel fa2 --repeats 10 \
            --strategy stock --strategy gather_cast --strategy shadow --strategy native_fp8 \
            --json "$E/results/glm5-tp8.prod.$sc.fa2.json"
    done
    wait "$side"
    unset CUDA_VISIBLE_DEVICES
elif [ "$PHASE" = 4 ]; then
    # the asv gate's remaining pairs: A/A on GPU 0 and planted 10% on GPU 1 at the same time (~150 s a
    # pair). Needs asv and its dependencies importable (the .whl folder: asv, asv_runner, virtualenv,
    # build, ... pip-installed with --target onto PYTHONPATH) and a git bundle of the checkout in
    # $ASV_SOURCE (here: git bundle create .scratch/repo.bundle HEAD main; carry .scratch)
    for role in aa planted; do
        gpu=$([ "$role" = aa ] && echo 0 || echo 1)
        ( export CUDA_VISIBLE_DEVICES=$gpu
          step "asv-$role" 540 python3 -m ci.asv_gate_experiment "$E/asv-gate/$role" --role "$role" \
              --source "${ASV_SOURCE:?a git bundle or path of this checkout}" --pairs "${ASV_PAIRS:-2}" --deadline 420 ) &
    done
    wait
    rm -rf "$E"/asv-gate/*/repo
elif [ "$PHASE" = 5 ]; then
    # the sharded-suite timings (refits ci/shard_model.json); Triton cache: pass it to ci/gpu_env.sh
    EVIDENCE=$E bash ci/evidence/shard_h200.sh > "$E/logs/shard.log" 2>&1
    log "shard: exit $?"
elif [ "$PHASE" = 3 ]; then
    nvidia-smi > "$E/nvidia-smi.txt" 2>&1
    (   # GPU 1: the gate experiment, all four headline scenarios
        export CUDA_VISIBLE_DEVICES=1
        step gate-experiment 330 python3 ci/gate_experiment.py "$E/gate" --pairs 5 --repeats 12
    ) &
    side=$!
    (   # GPU 0: the GPU suite (Triton cold: its cache is packed for later calls)
        export CUDA_VISIBLE_DEVICES=0
        step gpu-suite 200 python3 -m pytest suites/gpu -m gpu -q -p no:cacheprovider -rs --durations=15 \
            --binding-proof "$E/proof-n0" --junitxml="$E/gpu-junit.xml"
        tar -cJf "$OUT/triton-cache.tar.xz" -C "$TRITON_CACHE_DIR" . 2>/dev/null
    )
    wait "$side"
    step tp2 70 python3 -m torch.distributed.run --standalone --nproc-per-node 2 ci/tp2_allreduce.py --out "$E/tp2" \
        --layers 6 --repeats 15
    step isolation 150 python3 -m ci.isolation "$E/isolation" --gpus 0,1 --rounds 2 --repeats 10
else
    (
        export CUDA_VISIBLE_DEVICES=1
        step gate-experiment 200 python3 ci/gate_experiment.py "$E/gate" --pairs 5 --repeats 12
    ) &
    side=$!
    ( export CUDA_VISIBLE_DEVICES=0; step gpu-suite 160 python3 -m pytest suites/gpu -m gpu -q -p no:cacheprovider -rs --durations=10 \
        --binding-proof "$E/proof-n0" --junitxml="$E/gpu-junit.xml" )
    wait "$side"
    t0=$(date +%s)
    step gpu-suite-n2 90 python3 -m pytest suites/gpu -m gpu -q -p no:cacheprovider -n 2 \
        --binding-proof "$E/proof-n2" --junitxml="$E/gpu-junit-n2.xml"
    echo "$(( $(date +%s) - t0 ))" > "$E/wall-n2.txt"
    step tp2 50 python3 -m torch.distributed.run --standalone --nproc-per-node 2 ci/tp2_allreduce.py --out "$E/tp2" \
        --layers 6 --repeats 15
    step isolation 80 python3 -m ci.isolation "$E/isolation" --gpus 0,1 --rounds 2 --repeats 10
fi
log "phase $PHASE done"
tar -czf "$OUT/evidence-phase$PHASE.tar.gz" -C "$(dirname "$E")" "$(basename "$E")"
tail -n 40 "$E/steps-phase$PHASE.txt"
