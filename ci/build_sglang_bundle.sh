#!/usr/bin/env bash
# Build the offline archive of SGLang for a GPU runner that lacks it: the sglang wheel plus the
# packages it needs at import time (ci/sglang-cpu-pins.txt) that the runner image does not hold
# already (RUNNER_HAS below: torch, triton, transformers, numpy, ... ; FlashInfer comes from
# ci/build_offline_bundle.sh, msgspec from the harness's own wheels). Wheels for the runner's
# Python, unpacked into one folder, packed as a deterministic tar.xz (sorted names, owner 0,
# mtime 0). sglang's release wheel is tagged for one CPython (SGLANG_WHEEL_PY) only because of its
# Rust extension modules; they are dropped (*.so, unused by the decode path), with multimodal_gen/
# and test/, and the rest is plain Python. sgl_kernel is not included (373 MB,
# built against its own torch): harness/integrations/sglang/stand_in.py replaces it at import.
#
# usage: ci/build_sglang_bundle.sh [OUT]
#   OUT          default .bundle/sglang-<version>-py<pyver without dot>.tar.xz; never the pins file (exit 2)
# env:
#   PY_VERSION   target Python version        (default 3.12)
#   PLATFORM     target wheel platform tag    (default manylinux_2_28_x86_64; older manylinux tags accepted)
#   PYTHON       interpreter that runs pip    (default python3)
#   FORCE        1: replace an existing OUT (else an existing OUT is kept: exit 2, before any download, or
#                after it when OUT was made meanwhile)
#   SGLANG_WHEEL_PY, SGLANG_WHEEL_PLATFORM   the tags of sglang's own wheel (default 3.11, manylinux_2_34_x86_64)
# install on the runner: . ci/gpu_env.sh FLASHINFER_BUNDLE JIT_TAR TRITON_TAR SGLANG_BUNDLE
set -euo pipefail

PY_VERSION=${PY_VERSION:-3.12}
PLATFORM=${PLATFORM:-manylinux_2_28_x86_64}
PYTHON=${PYTHON:-python3}
SGLANG_WHEEL_PY=${SGLANG_WHEEL_PY:-3.11}
SGLANG_WHEEL_PLATFORM=${SGLANG_WHEEL_PLATFORM:-manylinux_2_34_x86_64}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PINS=$ROOT/ci/sglang-cpu-pins.txt
SGLANG=$(grep -E '^sglang==' "$PINS" | cut -d= -f3)
OUT=${1:-$ROOT/.bundle/sglang-$SGLANG-py${PY_VERSION//./}.tar.xz}
# what the GPU runner image already holds (docs/ci-runners.md); apache-tvm-ffi travels with FlashInfer
RUNNER_HAS="aiohappyeyeballs aiohttp aiosignal annotated-doc anyio apache-tvm-ffi attrs certifi charset-normalizer click
einops filelock frozenlist fsspec h11 httpcore httpx huggingface-hub idna jinja2 llvmlite lxml markupsafe mpmath msgspec
multidict networkx numba numpy packaging pillow prometheus-client propcache psutil pygments pyyaml regex requests
safetensors scipy sentencepiece sympy tiktoken tokenizers tqdm transformers triton typing-extensions urllib3 uvloop
xxhash yarl"

normalize() { tr 'A-Z_.' 'a-z--'; }
has=" $(echo $RUNNER_HAS | normalize) "
wanted=()
while IFS= read -r line; do
    case "$line" in ''|'#'*) continue ;; esac
    name=$(echo "${line%%==*}" | normalize)
    [ "$name" = sglang ] && continue
    [[ "$has" == *" $name "* ]] || wanted+=("$line")
done < "$PINS"

if [ "$OUT" -ef "$PINS" ]; then  # the same file (a link too): FORCE=1 would write the bundle over the pins it read
    echo "build_sglang_bundle: $OUT is the pins file $PINS, an input; nothing was built (choose another OUT)" >&2
    exit 2
fi
if [ -e "$OUT" ] || [ -L "$OUT" ]; then
    [ "${FORCE:-}" = 1 ] || { echo "build_sglang_bundle: $OUT exists; nothing was built (choose another OUT, or FORCE=1 replaces it)" >&2; exit 2; }
fi
work=$(mktemp -d)
part=
trap 'rm -rf "$work" ${part:+"$part"}' EXIT
platforms=()
for tag in "$PLATFORM" manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
done
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    "${platforms[@]}" -d "$work/wheels" "${wanted[@]}"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$SGLANG_WHEEL_PY" --implementation cp \
    --platform "$SGLANG_WHEEL_PLATFORM" -d "$work/wheels" "sglang==$SGLANG"

mkdir -p "$work/site"
for wheel in "$work"/wheels/*.whl; do
    "$PYTHON" -m zipfile -e "$wheel" "$work/site"
done
rm -rf "$work/site/sglang/multimodal_gen" "$work/site/sglang/test"
find "$work/site/sglang" -name '*.so' -delete
find "$work/site" -name '__pycache__' -prune -exec rm -rf {} +

mkdir -p "$(dirname "$OUT")"
part=$(mktemp "$OUT.part.XXXXXX")  # a new file beside OUT (never one already there), moved to OUT once complete
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
    -cf - -C "$work/site" . | xz -6 -T0 > "$part"
chmod a+r "$part"
. "$ROOT/ci/place_bundle.sh"
place_bundle build_sglang_bundle "$part" "$OUT"
echo "$OUT $(du -h "$OUT" | cut -f1) (sglang==$SGLANG and ${#wanted[@]} packages: ${wanted[*]})"
