#!/usr/bin/env bash
# Install real SGLang on a CPU-only machine into the virtual environment VENV (created if
# missing), for the `sglang` oracle tests (suites/sglang) and anything else that imports
# SGLang's pools, attention backends or kernels on CPU.
#
# `pip install sglang` resolves ~207 packages including a CUDA torch; instead this installs
# sglang and exactly the packages it needs at import time, pinned in ci/sglang-cpu-pins.txt
# and installed with --no-deps (~0.5 GB, about a minute), then the CPU torch, then the
# harness itself with its `oracle` extra. torchvision is not installed (its wheels need CUDA
# torch): suites/sglang/stubs/ holds the import-time stand-in, put on sys.path by
# suites/sglang/conftest.py. Nothing is byte-compiled at install time (--no-compile): the
# few modules the tests import compile on first import, the rest never.
#
# With TORCH_VENV (a venv holding torch==2.13.0, e.g. the main .venv), torch is not installed
# a second time: its files in TORCH_VENV are symlinked into VENV's site-packages (torch,
# torchgen, functorch and its dist-info; nothing else of TORCH_VENV becomes visible). The
# link waits for an flock on TORCH_VENV.lock, which a caller still installing that torch
# holds (.ci/run). Do not pip-uninstall or upgrade torch in such a VENV: it is TORCH_VENV's.
# A second run into the same VENV (.ci/run run again in one checkout) replaces the links: every
# link of VENV's site-packages into TORCH_VENV's, and any link where one is to go, is removed,
# then the current ones are made. A real torch in VENV (installed without TORCH_VENV) is left
# alone, and the run stops naming it.
#
# Usage: bash ci/install_sglang_cpu.sh VENV [TORCH_VENV]
# Then:  VENV/bin/python -m pytest suites/sglang -m sglang
set -euo pipefail
venv=${1:?usage: bash ci/install_sglang_cpu.sh VENV [TORCH_VENV]}
torch_venv=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet --no-compile --no-deps -r "$root/ci/sglang-cpu-pins.txt"  # needs no torch yet
if [ -n "$torch_venv" ]; then
    flock "$torch_venv.lock" true
    site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    "$torch_venv/bin/python" - "$site" <<'PY'
import importlib.metadata as md
import os
import sys

dist = md.distribution("torch")
assert dist.version.split("+")[0] == "2.13.0", f"TORCH_VENV has torch {dist.version}, not 2.13.0"
src, dst = os.path.realpath(dist.locate_file("")), os.path.realpath(sys.argv[1])
for name in os.listdir(dst):  # an earlier run's links (this torch's, or one since replaced)
    path = os.path.join(dst, name)
    if os.path.islink(path) and os.path.normpath(os.path.join(dst, os.readlink(path))).startswith(src + os.sep):
        os.remove(path)
for top in sorted({f.parts[0] for f in dist.files if f.parts[0] != ".."}):
    link = os.path.join(dst, top)
    if os.path.islink(link):  # a link made from another TORCH_VENV
        os.remove(link)
    elif os.path.lexists(link):
        sys.exit(f"{link} is no link: VENV has a torch of its own; remove it or use a fresh VENV")
    os.symlink(os.path.relpath(os.path.join(src, top), dst), link)
PY
else
    "$py" -m pip install --quiet --no-compile torch==2.13.0
fi
"$py" -m pip install --quiet --no-compile -e "${root}[oracle]"
"$py" -c "import sglang, torch; print('sglang', sglang.__version__, 'with torch', torch.__version__, 'installed in $venv')"
