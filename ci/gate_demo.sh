#!/usr/bin/env bash
# Proves the regression gates on a GPU box: on a clone of the repo, an unchanged commit and a
# commit that makes gather_cast launch its kernel twice (a >= 20% slowdown of its cast) are
# compared with main by ci/asv_gate.py (asv continuous) and by `harness compare`.
# Expected: unchanged -> exit 0, slowed -> exit 1, for both gates.
#   OUT=dir bash ci/gate_demo.sh REPO_BUNDLE ASV_WHEELS_DIR
set -uo pipefail
REPO_BUNDLE=$1
WHEELS=$2
. ci/gpu_env.sh "" ""  # explicit: a sourced script would see this script's arguments
rm -rf /tmp/asvsite /tmp/repo /tmp/gate
python3 -m pip install -q --no-index --no-deps --target /tmp/asvsite "$WHEELS"/*.whl
# asv itself runs from these; per-commit environments see them through the runner-virtualenv
# .pth. (Not ASV_PYTHONPATH: asv turns it into PYTHONPATH, whose entries asv's benchmark
# runner then strips from sys.path again.)
export PYTHONPATH=/tmp/asvsite:/tmp/site
export MLA_ASV_SCENARIOS=${MLA_ASV_SCENARIOS:-b1-l4096} MLA_ASV_STRATEGIES=${MLA_ASV_STRATEGIES:-gather_cast,shadow}
export MLA_ASV_REPEATS=${MLA_ASV_REPEATS:-30}
E=/tmp/gate
mkdir -p "$E"
git clone -q -b main "$REPO_BUNDLE" /tmp/repo && cd /tmp/repo || exit 2
git config user.email ci@localhost && git config user.name "gate demo"
git checkout -q -b same main && echo >> README.md && git commit -qam "docs only: no code change"
git checkout -q -b slow main
sed -i 's/^    if n:$/    for _ in range(2 if n else 0):  # planted: every gather runs twice/' harness/kernels/gather_cast.py
git diff --stat | tee "$E/slow.diff"
git commit -qam "planted regression: gather_cast launches its kernel twice"
git checkout -q main
python3 -m asv machine --yes --machine h200 > /dev/null
for head in same slow; do
  python3 -m ci.asv_gate main "$head" --factor 1.10 --machine h200 --bench "${ASV_BENCH:-.}" --show-stderr > "$E/asv-gate-$head.log" 2>&1
  echo "asv gate main..$head: exit $?" | tee -a "$E/summary.txt"
  for py in .asv/env/*/bin/python; do
    env -u PYTHONPATH "$py" -c "import torch; from harness.backends.flashinfer import _import_error as e; print('asv env:', torch.cuda.is_available(), e())" 2>&1 | tail -2
  done
  tail -25 "$E/asv-gate-$head.log"
done
[ -n "${SKIP_COMPARE:-}" ] || for ref in main same slow; do
  git checkout -q "$ref"
  python3 -m harness run --scenario b1-l4096 --strategy gather_cast --strategy shadow --json "$E/run-$ref.json" > "$E/run-$ref.log" 2>&1
done
[ -n "${SKIP_COMPARE:-}" ] || for head in same slow; do
  python3 -m harness compare "$E/run-main.json" "$E/run-$head.json" --max-regression 10% > "$E/compare-$head.log" 2>&1
  echo "harness compare main..$head: exit $?" | tee -a "$E/summary.txt"
  cat "$E/compare-$head.log"
done
tar -czf "$OUT/gate.tar.gz" -C /tmp gate
