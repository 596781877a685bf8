"""The committed ruff configuration (pyproject.toml [tool.ruff]) holds on the tree, and it can fail."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suites.hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parent.parent


def _ruff(*args, cwd=ROOT):
    exe = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(exe).exists():
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    return subprocess.run([exe, "check", *args], cwd=cwd, capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_tree_is_ruff_clean():
    proc = _ruff("harness", "suites", "ci", "conftest.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_flags_a_planted_unused_import(tmp_path):
    """Negative control: the same configuration rejects an unused import."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "bad.py").write_text("import os\n")
    proc = _ruff("bad.py", cwd=tmp_path)
    assert proc.returncode == 1 and "F401" in proc.stdout
