"""Experiments that are shell scripts: `python -m ci.experiments.<name> --help` prints run.sh's header
comment through the one entry point, ci/experiments/run_script.py."""

import subprocess
import sys
from pathlib import Path

import pytest

from suites.hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.parent.name for p in (ROOT / "ci" / "experiments").glob("*/run.sh")
                 if "run_script(__file__)" in (p.parent / "__main__.py").read_text())


def test_the_shell_experiments_are_found():
    assert {"tpot_h200", "shard_refit"} <= set(SCRIPTS), SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_prints_the_scripts_header(name):
    header = (ROOT / "ci" / "experiments" / name / "run.sh").read_text().splitlines()[1][2:]
    proc = subprocess.run([sys.executable, "-m", f"ci.experiments.{name}", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=HANG_GUARD_S)
    assert proc.returncode == 0 and proc.stdout.splitlines()[0] == header, proc.stdout + proc.stderr
