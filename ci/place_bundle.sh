# shellcheck shell=bash
# Sourced by ci/build_offline_bundle.sh and ci/build_sglang_bundle.sh: place_bundle SCRIPT PART OUT moves the finished
# archive PART to OUT. Without FORCE=1 a file made at OUT while the bundle was built is kept (one line, exit 2): a hard
# link fails when OUT exists; where the file system has none, OUT is checked right before the rename.
place_bundle() {
    local script=$1 part=$2 out=$3
    if [ "${FORCE:-}" = 1 ]; then
        mv -f "$part" "$out"
    elif ! ln "$part" "$out" 2>/dev/null; then
        if [ -e "$out" ] || [ -L "$out" ]; then
            echo "$script: $out appeared while the bundle was built; it was kept and nothing was written (FORCE=1 replaces it)" >&2
            exit 2
        fi
        mv "$part" "$out"
    fi
}
