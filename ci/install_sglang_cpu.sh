#!/usr/bin/env bash
# Install real SGLang on a CPU-only machine into the virtual environment VENV (created if
# missing), for the `sglang` oracle tests (suites/sglang) and anything else that imports
# SGLang's pools, attention backends or kernels on CPU.
#
# `pip install sglang` resolves ~207 packages including a CUDA torch; instead this installs
# the CPU torch, then sglang and exactly the packages it needs at import time, pinned in
# ci/sglang-cpu-pins.txt and installed with --no-deps (~0.5 GB, 2-3 minutes), then the
# harness itself with its `oracle` extra. torchvision is not installed (its wheels need CUDA
# torch): suites/sglang/stubs/ holds the import-time stand-in, put on sys.path by
# suites/sglang/conftest.py.
#
# Usage: bash ci/install_sglang_cpu.sh VENV
# Then:  VENV/bin/python -m pytest suites/sglang -m sglang
set -euo pipefail
venv=${1:?usage: bash ci/install_sglang_cpu.sh VENV}
root=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet torch==2.13.0
"$py" -m pip install --quiet --no-deps -r "$root/ci/sglang-cpu-pins.txt"
"$py" -m pip install --quiet -e "${root}[oracle]"
"$py" -m pip check >/dev/null 2>&1 || true  # sglang's declared CUDA-side requirements stay unmet on purpose
"$py" -c "import sglang; print('sglang', sglang.__version__, 'installed in $venv')"
