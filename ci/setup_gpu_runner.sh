#!/usr/bin/env bash
# Set up a job on a self-hosted GPU runner: a venv that sees the runner's CUDA torch
# (--system-site-packages), with the project and its test extra installed.
# Under GitHub Actions the venv's bin/ (and PYTHONPATH, for a bundle) reach later steps.
#
# env: MLA_HARNESS_OFFLINE_BUNDLE  path of an archive made by ci/build_offline_bundle.sh,
#      for runners without a package index: flashinfer comes from it instead of pip.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv --system-site-packages .venv
# shellcheck disable=SC1091
. .venv/bin/activate
if [ -n "${MLA_HARNESS_OFFLINE_BUNDLE:-}" ]; then
    # an assignment first: eval "$(...)" would take eval's status and go on without the bundle
    exports=$(bash ci/install_offline_bundle.sh "$MLA_HARNESS_OFFLINE_BUNDLE")
    eval "$exports"
    python -m pip install --quiet -e '.[test]'
    echo "PYTHONPATH=$PYTHONPATH" >> "${GITHUB_ENV:-/dev/null}"
else
    python -m pip install --quiet -e '.[gpu,test]'
fi
python - <<'PY'
import torch

assert torch.cuda.is_available(), f"torch {torch.__version__} on this runner has no CUDA"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)")
PY
echo "$PWD/.venv/bin" >> "${GITHUB_PATH:-/dev/null}"
