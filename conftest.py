"""Top-level pytest configuration: GPU tests skip on CPU with a reason; per-GPU binding under xdist;
one xdist group per case pool (suites/plugins/pool_groups.py);
in CI (MLA_HARNESS_STRICT_SKIPS=1, set by .ci/run) a skipped test that is neither GPU- nor
sglang-marked fails the session unless it passed elsewhere (the Triton interpreter child); on a GPU runner
(--gpu-runner, set by gpu-correctness.yml) a skipped gpu test fails the session unless suites/gpu/expected_skips.toml
declares it (suites/plugins/gpu_skips.py)."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from harness import envvars
from harness.errors import HarnessError

pytest_plugins = ["suites.plugins.gpu_binding", "suites.plugins.gpu_skips", "suites.plugins.pool_groups",
                  "suites.plugins.triton_interpreter"]

STRICT = False  # MLA_HARNESS_STRICT_SKIPS, read in pytest_configure
PASSED_ELSEWHERE = "MLA_HARNESS_PASSED_ELSEWHERE"  # folder where child pytest runs list what passed
ALLOWED_SKIP_MARKERS = ("gpu", "sglang")  # gpu: skips on CPU by design; on a GPU runner gpu_skips accounts for them
_skipped: dict[str, str] = {}
_passed: list[str] = []
_role = {"top": False}


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    """The top session makes the folder; xdist workers and child pytest runs inherit its path."""
    global STRICT
    try:
        STRICT = bool(envvars.read("MLA_HARNESS_STRICT_SKIPS"))
    except HarnessError as exc:  # e.g. "true": one line, not a session that silently is not strict
        raise pytest.UsageError(str(exc)) from None
    if STRICT and not hasattr(config, "workerinput") and PASSED_ELSEWHERE not in os.environ:
        os.environ[PASSED_ELSEWHERE] = tempfile.mkdtemp(prefix="mla-harness-passed-")
        _role["top"] = True


def pytest_runtest_logreport(report):
    if report.passed and report.when == "call":
        _passed.append(report.nodeid)
    elif report.skipped and not any(m in report.keywords for m in ALLOWED_SKIP_MARKERS):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped[report.nodeid] = reason


def pytest_sessionfinish(session, exitstatus):
    folder = os.environ.get(PASSED_ELSEWHERE)
    if not STRICT or folder is None or hasattr(session.config, "workerinput"):
        return
    if not _role["top"]:  # a child pytest run: report what passed there
        (Path(folder) / f"{os.getpid()}.json").write_text(json.dumps(_passed))
        return
    elsewhere = {n for p in Path(folder).glob("*.json") for n in json.loads(p.read_text())}
    shutil.rmtree(folder, ignore_errors=True)  # the top session made it: nothing else reads it now
    never_run = {n: r for n, r in _skipped.items() if n not in elsewhere}
    if never_run:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.ensure_newline()
        reporter.write_line(f"ERROR: {len(never_run)} test(s) skipped here and run nowhere else:", red=True)
        for nodeid, reason in sorted(never_run.items()):
            reporter.write_line(f"  {nodeid}: {reason}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
