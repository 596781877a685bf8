"""The machinery of the mutation tests (suites/test_mutations*.py): a fault planted in a copy of the
source tree (one exact text replaced) must make the tests that pin that behaviour fail. A check that
silently stops failing is noticed here. One child process runs a file's mutations (torch imported
once), each on a fresh copy with freshly imported modules:

    python -m suites.mutation MODULE WORKDIR [MUTATION_ID ...]
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("harness", "suites", "ci", "golden", "docs/environment.md", "conftest.py", "pyproject.toml")
STALE = ("harness", "suites", "ci")  # packages of the previous copy (suites: its plugins and helpers)


def mutated_copy(dest: Path, file: str, original: str, mutated: str) -> None:
    """A copy of the tree with `original` (which must occur exactly once in `file`) replaced."""
    for name in COPIED:
        src, to = ROOT / name, dest / name
        to.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, to, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, to)
    path = dest / file
    text = path.read_text()
    assert text.count(original) == 1, f"{file} no longer holds {original!r} exactly once: update this mutation"
    path.write_text(text.replace(original, mutated))


def run_all(workdir: Path, mutations) -> dict[str, int]:
    """In this (child) process: for each mutation, a mutated copy, fresh modules, and pytest.main on its tests."""
    codes = {}
    for name, file, original, mutated, tests in mutations:
        copy = workdir / name
        mutated_copy(copy, file, original, mutated)
        for mod in [m for m in sys.modules if m in STALE or m.startswith(tuple(f"{p}." for p in STALE) + ("test_",)) or m == "conftest"]:
            del sys.modules[mod]
        sys.path.insert(0, str(copy))
        os.chdir(copy)
        gc.freeze()  # what is imported so far (torch) is never garbage: pytest's two gc.collect() per session skip it
        codes[name] = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly",
                                       "--basetemp", str(workdir / f"{name}.tmp"), *tests]))
        sys.path.remove(str(copy))
    gc.unfreeze()
    return codes


def assert_caught(module: str, mutations, workdir: Path, timeout: int = 900) -> None:
    """Run `mutations` (each an (id, file, original, mutated, tests) of `module`'s MUTATIONS) in a child:
    every one must make its tests fail."""
    names = [m[0] for m in mutations]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLA_HARNESS_", "MLA_ASV_"))}  # no CI guards in the copies
    proc = subprocess.run([sys.executable, "-m", "suites.mutation", module, str(workdir), *names], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    missed = [name for name, code in codes.items() if code != pytest.ExitCode.TESTS_FAILED]
    assert not missed and sorted(codes) == sorted(names), f"mutations not caught: {missed}\n{proc.stdout[-3000:]}"


if __name__ == "__main__":
    module, workdir, chosen = sys.argv[1], Path(sys.argv[2]), set(sys.argv[3:])
    print(json.dumps(run_all(workdir, [m for m in importlib.import_module(module).MUTATIONS if m[0] in chosen])))
