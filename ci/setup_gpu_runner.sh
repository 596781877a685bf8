#!/usr/bin/env bash
# Set up a job on a self-hosted GPU runner: a venv that sees the runner's CUDA torch (--system-site-packages;
# $RUNNER_TEMP/venv under GitHub Actions, else .venv in the checkout), with the project and its test extra
# installed, and FlashInfer at the exact version ci/gpu-constraints.txt pins (a bundle's too: checked below).
# Under GitHub Actions the venv's bin/ (and PYTHONPATH, for a bundle) reach later steps, and so do the
# variables that keep a job off the state earlier jobs (pull requests' code among them) left on the runner:
# no user site-packages (PYTHONNOUSERSITE=1: a --system-site-packages venv would import ~/.local's), a home of
# the job's own ($RUNNER_TEMP/home: pip's download cache and asv's ~/.asv-machine.json lived in the runner user's
# home, where an earlier job could leave a wheel or a machine entry the next one used), and Triton's, FlashInfer's
# and the CUDA driver's JIT caches in this job's own $RUNNER_TEMP (emptied after each job).
#
# env: MLA_HARNESS_OFFLINE_BUNDLE  path of an archive made by ci/build_offline_bundle.sh,
#      for runners without a package index: flashinfer comes from it instead of pip.
set -euo pipefail
cd "$(dirname "$0")/.."

job_env() {  # NAME VALUE: set here and, under GitHub Actions, for the job's later steps
    export "$1=$2"
    echo "$1=$2" >> "${GITHUB_ENV:-/dev/null}"
}
job_env PYTHONNOUSERSITE 1
if [ -n "${RUNNER_TEMP:-}" ]; then
    job_env HOME "$RUNNER_TEMP/home"
    job_env TRITON_CACHE_DIR "$RUNNER_TEMP/triton-cache"
    job_env FLASHINFER_WORKSPACE_BASE "$RUNNER_TEMP/flashinfer-workspace"
    job_env CUDA_CACHE_PATH "$RUNNER_TEMP/cuda-cache"
    mkdir -p "$HOME" "$TRITON_CACHE_DIR" "$FLASHINFER_WORKSPACE_BASE" "$CUDA_CACHE_PATH"
fi

# The venv: in the job's $RUNNER_TEMP under GitHub Actions (outside the checkout, fresh each job), else .venv
venv=${RUNNER_TEMP:+$RUNNER_TEMP/venv}
venv=${venv:-$PWD/.venv}
python3 -m venv --system-site-packages "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
if [ -n "${MLA_HARNESS_OFFLINE_BUNDLE:-}" ]; then
    # an assignment first: eval "$(...)" would take eval's status and go on without the bundle
    exports=$(bash ci/install_offline_bundle.sh "$MLA_HARNESS_OFFLINE_BUNDLE")
    eval "$exports"
    python -m pip install --quiet -c ci/gpu-constraints.txt -e '.[test]'
    echo "PYTHONPATH=$PYTHONPATH" >> "${GITHUB_ENV:-/dev/null}"
else
    python -m pip install --quiet -c ci/gpu-constraints.txt -e '.[gpu,test]'
fi
FLASHINFER_PIN=$(sed -n 's/^flashinfer-python==//p' ci/gpu-constraints.txt) python - <<'PY'
import os
from importlib.metadata import version

import torch

assert torch.cuda.is_available(), f"torch {torch.__version__} on this runner has no CUDA"
flashinfer = version("flashinfer-python")
assert flashinfer == os.environ["FLASHINFER_PIN"], f"flashinfer-python {flashinfer}, not {os.environ['FLASHINFER_PIN']} (ci/gpu-constraints.txt)"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s), flashinfer-python {flashinfer}")
PY
echo "$venv/bin" >> "${GITHUB_PATH:-/dev/null}"
