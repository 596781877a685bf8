#!/usr/bin/env bash
# The SGLang gate experiment (python -m ci.experiments.sglang_gate) on an air-gapped GPU runner that has
# neither SGLang nor asv: from the checkout root, with .bundle/ holding the FlashInfer bundle
# (ci/build_offline_bundle.sh) and the SGLang bundle (ci/build_sglang_bundle.sh), and .whl/ the msgspec and
# asv wheels (asv, asv_runner, json5, virtualenv, distlib, platformdirs, pympler, importlib_metadata).
# The fixture repository is built from the SGLang bundle's sglang package (the same commit hashes as from
# the released wheel). Arguments go to the experiment.
#   OUT=DIR bash ci/experiments/sglang_gate/run.sh [--deadline SECONDS] ...
set -euo pipefail
out=${OUT:?set OUT to the output folder}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/wheels .whl/*.whl
export PYTHONPATH=/tmp/wheels${PYTHONPATH:+:$PYTHONPATH}
# shellcheck source=ci/gpu_env.sh
. ci/gpu_env.sh .bundle/flashinfer-0.7.2.post1-py312.tar.xz
eval "$(bash ci/install_offline_bundle.sh .bundle/sglang-0.5.23-py312.tar.xz /tmp/site-sglang)"
export MLA_ASV_REPEATS=${MLA_ASV_REPEATS:-20}
rm -rf /tmp/sglang-fixture
bash ci/make_sglang_fixture_repo.sh /tmp/site-sglang /tmp/sglang-fixture
python3 -m ci.experiments.sglang_gate "$out" --fixture /tmp/sglang-fixture "$@"
