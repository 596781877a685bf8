#!/usr/bin/env bash
# Unpack an offline bundle made by ci/build_offline_bundle.sh and print the
# PYTHONPATH line that makes it importable.
#
# usage: ci/install_offline_bundle.sh ARCHIVE [TARGET]     (TARGET default /tmp/site)
#        eval "$(ci/install_offline_bundle.sh .bundle/flashinfer-0.7.2.post1-py312.tar.xz)"
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 ARCHIVE [TARGET=/tmp/site]" >&2
    exit 2
fi
ARCHIVE=$1
TARGET=${2:-/tmp/site}
if [ ! -f "$ARCHIVE" ]; then
    echo "install_offline_bundle: no such archive: $ARCHIVE" >&2
    exit 2
fi

mkdir -p "$TARGET"
xz -dc -T0 "$ARCHIVE" | tar -xf - -C "$TARGET"
TARGET=$(cd "$TARGET" && pwd)
echo "export PYTHONPATH=$TARGET\${PYTHONPATH:+:\$PYTHONPATH}"
