#!/usr/bin/env bash
# Build the SGLang fixture repository the SGLang gate is proven on: a local git repo of sglang
# 0.5.23's released Python source with four commits, tagged
#   a  0.5.23 as released
#   b  a + ci/sglang_patches/0001 (forward_decode casts only the rows the decode plan reads)
#   c  b + 0002 (planted slowdown: that cast done twice)
#   d  b + 0003 (planted bug: the rows read one index off)
# Layout as in SGLang's own repository (python/sglang, python/pyproject.toml), so
# `python -m ci.sglang_gate --sglang-repo OUT a b` installs each commit like a user's checkout.
# The source is the released wheel's `sglang` package (`pip download --no-deps sglang==0.5.23`)
# without what the device bundle also drops: the cp311 Rust extension modules (*.so), and
# multimodal_gen/ and test/, which the decode path never imports. A wheel has no build file: commit a
# adds a minimal setuptools pyproject.toml (name, version, packages). Fixed author, committer and
# dates: the same input gives the same commit hashes.
#
# Usage: bash ci/make_sglang_fixture_repo.sh SGLANG_WHEEL_OR_PACKAGE_DIR OUT
set -euo pipefail
src=${1:?usage: bash ci/make_sglang_fixture_repo.sh SGLANG_WHEEL_OR_PACKAGE_DIR OUT}
out=${2:?usage: bash ci/make_sglang_fixture_repo.sh SGLANG_WHEEL_OR_PACKAGE_DIR OUT}
patches=$(cd "$(dirname "$0")" && pwd)/sglang_patches
if [ -e "$out" ]; then echo "make_sglang_fixture_repo: $out already exists (refusing to overwrite it)" >&2; exit 2; fi
if [ -d "$src" ]; then
    [ -f "$src/sglang/_version.py" ] || { echo "make_sglang_fixture_repo: $src holds no released sglang package (sglang/_version.py)" >&2; exit 2; }
elif [ "${src##*.}" != whl ] || ! [ -f "$src" ]; then
    echo "make_sglang_fixture_repo: $src is neither a .whl nor a folder holding the sglang package" >&2; exit 2
fi

mkdir -p "$out/python"
if [ -d "$src" ]; then
    cp -r "$src/sglang" "$out/python/sglang"
else
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2], [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.startswith("sglang/")])' "$src" "$out/python"
fi
cd "$out"
find python/sglang \( -name '*.so' -o -name '__pycache__' \) -prune -exec rm -rf {} +
rm -rf python/sglang/multimodal_gen python/sglang/test
version=$(sed -n "s/^__version__ = version = '\(.*\)'\$/\1/p" python/sglang/_version.py)
[ "$version" = 0.5.23 ] || { echo "make_sglang_fixture_repo: $src is sglang $version, not 0.5.23 (the patches are written against it)" >&2; exit 2; }
cat > python/pyproject.toml <<EOF
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
version = "$version"

[tool.setuptools.packages.find]
include = ["sglang*"]

[tool.setuptools.package-data]
"*" = ["*"]
EOF
chmod -R u+rwX,go+rX,go-w .

export GIT_AUTHOR_NAME=mla-harness GIT_AUTHOR_EMAIL=mla-harness@localhost
export GIT_COMMITTER_NAME=mla-harness GIT_COMMITTER_EMAIL=mla-harness@localhost
export GIT_AUTHOR_DATE="2026-01-01T00:00:00Z" GIT_COMMITTER_DATE="2026-01-01T00:00:00Z"
git init -q -b main .
git config core.autocrlf false
git add -A
git commit -q -m "sglang $version as released (python package of the wheel, no *.so, multimodal_gen, test)"
git tag a
git am -q --committer-date-is-author-date "$patches"/0001-*.patch && git tag b
git checkout -q -b slow b && git am -q --committer-date-is-author-date "$patches"/0002-*.patch && git tag c
git checkout -q -b bug b && git am -q --committer-date-is-author-date "$patches"/0003-*.patch && git tag d
git checkout -q main && git reset -q --hard b
for t in a b c d; do echo "$t $(git rev-parse "$t")"; done
