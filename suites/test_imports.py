"""The dependency rule: .importlinter's contracts hold (`lint-imports`), no module import cycle at all,
and planted twins (this tree with one forbidden import added) break them.

Imports inside functions count: grimp reads every import statement of a module, so a function-level
import cannot hide an upward dependency or a cycle.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suites.hang_guard import HANG_GUARD_S

grimp = pytest.importorskip("grimp", reason="import-linter is in the test extra (pip install -e '.[test]')")

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / ".importlinter"
LINT = Path(sys.executable).with_name("lint-imports")


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the `harness` package found in `tree` (PYTHONPATH: a console script's sys.path
    starts at its own folder, not the working directory, so it would find an installed harness)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "200"}
    return subprocess.run([str(LINT), "--config", str(CONFIG), "--no-cache"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


GRAPH = ("import grimp, json; g = grimp.build_graph('harness', cache_dir=None); "
         "print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}))")


def import_graph(tree: Path) -> dict[str, list[str]]:
    """module -> the modules it imports (anywhere in it), for the `harness` package in `tree` (its own process)."""
    proc = subprocess.run([sys.executable, "-c", GRAPH], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (a cycle), a package's __init__ and
    its own submodules included (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


@pytest.fixture(scope="module")
def lint_available():
    if not LINT.exists():
        pytest.fail(f"{LINT} missing: import-linter is in the test extra (pip install -e '.[test]')")


def test_import_contracts_hold(lint_available):
    proc = lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "3 kept, 0 broken" in proc.stdout, proc.stdout[-3000:]


def test_no_import_cycle():
    graph = import_graph(ROOT)
    assert "harness.strategies.base" in graph and "harness.tpot.tpot" in graph  # the whole tree was read
    assert cycles(graph) == []


# (what is planted, file, line appended, what lint-imports must say)
TWINS = [
    ("upward: the strategy base imports the verdict layer (the removed cycle)", "harness/strategies/base.py",
     "from harness.verify.check import check_contract  # planted", "harness.strategies is not allowed to import harness.verify"),
    ("upward: the spec knows the inputs built from it", "harness/spec/schedule.py",
     "import harness.inputs.pool  # planted", "harness.spec is not allowed to import harness.inputs"),
    ("upward: a backend knows a strategy", "harness/backends/torch_backend.py",
     "import harness.strategies  # planted", "harness.backends is not allowed to import harness.strategies"),
    ("sideways: one strategy imports another", "harness/strategies/shadow.py",
     "from harness.strategies import gather_cast  # planted",
     "harness.strategies.shadow is not allowed to import harness.strategies.gather_cast"),
]


@pytest.mark.parametrize("what, path, line, message", TWINS, ids=[t[0].split(":")[0] + "-" + Path(t[1]).stem for t in TWINS])
def test_planted_twin_breaks_the_contract(tmp_path, lint_available, what, path, line, message):
    """Negative control: a copy of this tree with one forbidden import added must fail `lint-imports`,
    naming the import."""
    shutil.copytree(ROOT / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    planted = tmp_path / path
    planted.write_text(planted.read_text() + f"\n{line}\n")
    proc = lint_imports(tmp_path)
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 1 and "BROKEN" in out, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert message in out, proc.stdout[-3000:]


def test_planted_cycle_is_found(tmp_path):
    """Negative control of test_no_import_cycle: the twin whose strategy base imports the verdict layer
    again, inside a function (check imports the registry), has the cycle this tree removed."""
    shutil.copytree(ROOT / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    base = tmp_path / "harness" / "strategies" / "base.py"
    base.write_text(base.read_text() + "\n\ndef _planted():\n    from harness.verify.check import check_contract  # noqa: F401\n")
    found = cycles(import_graph(tmp_path))
    assert any({"harness.verify.check", "harness.strategies", "harness.strategies.base"} <= set(c) for c in found), found
