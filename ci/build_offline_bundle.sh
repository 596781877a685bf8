#!/usr/bin/env bash
# Build the compact offline archive of the GPU Python deps for air-gapped runners:
# the flashinfer-python and apache-tvm-ffi wheels, unpacked into one folder and
# packed as a deterministic tar.xz. Everything else flashinfer's FA2/FA3 MLA path
# needs (torch, numpy, jinja2, filelock, cuda-python, nvidia-ml-py, einops, click,
# tqdm, requests, tabulate, packaging, ninja) is expected on the runner already.
#
# usage: ci/build_offline_bundle.sh [OUT]
#   OUT          default .bundle/flashinfer-<version>-py<pyver without dot>.tar.xz
# env:
#   PY_VERSION   target Python version        (default 3.12)
#   PLATFORM     target wheel platform tag    (default manylinux_2_28_x86_64)
#   FLASHINFER   flashinfer-python version    (default 0.7.2.post1)
#   TVM_FFI      apache-tvm-ffi requirement   (default apache-tvm-ffi==0.1.15.post2,
#                                              within flashinfer's >=0.1.11,<0.2)
#   PYTHON       interpreter that runs pip    (default python3)
#   FORCE        1: replace an existing OUT (else an existing OUT is kept: exit 2, before any download, or
#                after it when OUT was made meanwhile)
set -euo pipefail

PY_VERSION=${PY_VERSION:-3.12}
PLATFORM=${PLATFORM:-manylinux_2_28_x86_64}
FLASHINFER=${FLASHINFER:-0.7.2.post1}
TVM_FFI=${TVM_FFI:-apache-tvm-ffi==0.1.15.post2}
PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/.bundle/flashinfer-$FLASHINFER-py${PY_VERSION//./}.tar.xz}

if [ -e "$OUT" ] || [ -L "$OUT" ]; then
    [ "${FORCE:-}" = 1 ] || { echo "build_offline_bundle: $OUT exists; nothing was built (choose another OUT, or FORCE=1 replaces it)" >&2; exit 2; }
fi
work=$(mktemp -d)
part=
trap 'rm -rf "$work" ${part:+"$part"}' EXIT

"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version "$PY_VERSION" --implementation cp --platform "$PLATFORM" \
    -d "$work/wheels" "flashinfer-python==$FLASHINFER" "$TVM_FFI"

mkdir -p "$work/site"
for wheel in "$work"/wheels/*.whl; do
    "$PYTHON" -m zipfile -e "$wheel" "$work/site"
done

mkdir -p "$(dirname "$OUT")"
part=$(mktemp "$OUT.part.XXXXXX")  # a new file beside OUT (never one already there), moved to OUT once complete
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
    -cf - -C "$work/site" . | xz -6 -T0 > "$part"
chmod a+r "$part"
. "$ROOT/ci/place_bundle.sh"
place_bundle build_offline_bundle "$part" "$OUT"
echo "$OUT $(du -h "$OUT" | cut -f1)"
