# Source me on an air-gapped GPU runner: unpack the offline FlashInfer bundle and a carried
# JIT cache (and a Triton cache), and set the variables the harness and FlashInfer need; with an
# SGLang bundle (ci/build_sglang_bundle.sh; 4th argument or SGLANG_BUNDLE) unpack SGLang too.
#   . ci/gpu_env.sh [BUNDLE] [JIT_CACHE_TAR] [TRITON_CACHE_TAR] [SGLANG_BUNDLE]
FI_BUNDLE=${1:-.bundle/flashinfer-0.7.2.post1-py312.tar.xz}
JIT_TAR=${2:-.jitcache/flashinfer-jit.tar}
# assignments first: eval "$(...)" would take eval's status and go on without the bundle
exports=$(bash ci/install_offline_bundle.sh "$FI_BUNDLE" /tmp/site) || return 2
eval "$exports"
SGLANG_BUNDLE=${4:-${SGLANG_BUNDLE:-}}
if [ -n "$SGLANG_BUNDLE" ]; then
  exports=$(bash ci/install_offline_bundle.sh "$SGLANG_BUNDLE" /tmp/site-sglang) || return 2
  eval "$exports"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-ws}
mkdir -p "$FLASHINFER_WORKSPACE_BASE"
if [ -f "$JIT_TAR" ]; then tar -xf "$JIT_TAR" -C "$FLASHINFER_WORKSPACE_BASE"; fi
# One Triton cache for every process (xdist workers too): warm when a packed one is given.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
mkdir -p "$TRITON_CACHE_DIR"
if [ -n "${3:-}" ] && [ -f "$3" ]; then tar -xf "$3" -C "$TRITON_CACHE_DIR"; fi
export PYTHONUNBUFFERED=1
