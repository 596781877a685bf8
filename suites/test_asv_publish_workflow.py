"""asv-publish's results history (.github/workflows/asv-publish.yml), against the defect that was found in it: the
history (asv's results_dir: the per-commit timings the published site plots and NEW reads) lived in the GPU runner
user's home (~/.cache/mla-harness/asv-results), where every job on the node, pull requests' code among them, runs as
the same user: a pull request could rewrite or delete it, and main's next publish published the tampered history.

It now lives on the `asv-results` branch of the repository: the self-hosted job fetches it into its RUNNER_TEMP with a
read-only token, and only the store job (GitHub-hosted, contents: write, pushes to protected main alone) pushes to
it, adding files and never rewriting a stored one. The jobs' history steps run here for real in bash against a bare
repository standing in for GitHub's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from suites.hang_guard import HANG_GUARD_S
from suites.workflow_files import GIT_ENV, WORKFLOWS
from suites.workflow_files import load as _load
from suites.workflow_files import triggers as _triggers
from suites.workflow_files import workflows as _workflows

REPO = Path(__file__).resolve().parents[1]
PUBLISH = WORKFLOWS / "asv-publish.yml"
PR_TRIGGERS = {"pull_request", "pull_request_target"}
MACHINE = "gpu-8x-sm120"
# a path every job on the runner shares: the runner user's home, its caches, a cache GitHub restores across runs
SHARED_PATH = re.compile(r"\$HOME\b|\$\{HOME\}|(?<![\w.-])~(?=/|\s|$)|/home/|\.cache/|XDG_\w+|actions/cache\b|"
                         r"\bhashFiles\(")


def _self_hosted(job: dict) -> bool:
    runs_on = job.get("runs-on", [])
    return "self-hosted" in ([runs_on] if isinstance(runs_on, str) else runs_on)


def _scopes(doc: dict, job: dict):
    """The job's token scopes as GitHub grants them: its own `permissions`, else the workflow's."""
    return job.get("permissions", doc.get("permissions"))


def _writes(scopes) -> bool:
    """Whether `scopes` may write anything: a missing block (the repository default may be write), write-all, a write."""
    if scopes is None or scopes == "write-all":
        return True
    return isinstance(scopes, dict) and "write" in scopes.values()


def _step(job: dict, name: str) -> dict:
    found = [s for s in job["steps"] if s.get("name", "").startswith(name)]
    assert len(found) == 1, f"no single step named {name!r}: {[s.get('name', s.get('uses')) for s in job['steps']]}"
    return found[0]


def _jobs() -> tuple[dict, dict, dict | None]:
    """(the workflow, the job that runs `asv run`, the store job or None)."""
    doc = _load(PUBLISH)
    (benchmark,) = [job for job in doc["jobs"].values() if any("asv run" in s.get("run", "") for s in job["steps"])]
    return doc, benchmark, doc["jobs"].get("store")


# --- where the history lives ------------------------------------------------------------------------------------------

def _shared_paths(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()
            if not line.lstrip().startswith("#") and SHARED_PATH.search(line.split(" # ")[0])]


def test_the_history_is_not_kept_where_another_job_can_write_it():
    """The history lived in `$HOME/.cache/mla-harness/asv-results`, linked as .asv/results: every job on the runner (a
    pull request's too) could rewrite it. No line of the workflow names the runner's home, a cache or ~ any more, and
    the history is this repository's `asv-results` branch."""
    assert _shared_paths(PUBLISH.read_text()) == []
    doc, benchmark, store = _jobs()
    assert doc["env"]["ASV_HISTORY_BRANCH"] == "asv-results"
    assert doc["env"]["ASV_HISTORY_REMOTE"] == "${{ github.server_url }}/${{ github.repository }}.git"
    upload = _step(benchmark, "Upload the results")
    assert upload["with"]["path"] == "${{ runner.temp }}/asv-history/results/", upload


def test_negative_control_the_old_home_store_is_found():
    old = '          store="$HOME/.cache/mla-harness/asv-results"\n          ln -sfn "$store" .asv/results\n'
    assert _shared_paths(old) == ['store="$HOME/.cache/mla-harness/asv-results"']
    assert _shared_paths("      - uses: actions/cache@v4\n") and _shared_paths('        run: cp -r x ~/results\n')
    assert _shared_paths('        run: ln -s "$RUNNER_TEMP/asv-history/results" .asv/results  # not ~ or $HOME\n') == []


# --- who can write ----------------------------------------------------------------------------------------------------

def test_pull_request_workflows_hold_no_write_token():
    """A pull request's jobs run its code on the shared runner: their token must not write, so nothing they run can
    push to the history branch. Each such workflow sets its permissions explicitly (a missing block takes the
    repository's default, which may be write) and no job of it asks for a write scope."""
    checked = []
    for name, doc in _workflows().items():
        if not _triggers(doc) & PR_TRIGGERS:
            continue
        assert isinstance(doc.get("permissions"), dict), f"{name}: no explicit permissions"
        for job_name, job in doc["jobs"].items():
            assert not _writes(_scopes(doc, job)), f"{name}: job {job_name} can write"
        checked.append(name)
    assert {"perf-gate.yml", "gpu-correctness.yml"} <= set(checked), checked


def test_only_the_store_job_can_write_and_never_on_the_gpu_runner():
    """The history's one writer is asv-publish's store job, contents: write and nothing else, on a GitHub-hosted runner:
    no write token is ever handed to the GPU node, where pull requests' code runs as the same user. No job anywhere
    that can write runs on a self-hosted runner or in a pull request's workflow."""
    doc, benchmark, store = _jobs()
    assert doc["permissions"] == {"contents": "read"}
    writers = [name for name, job in doc["jobs"].items() if _writes(_scopes(doc, job))]
    assert writers == ["store"], writers
    assert set(doc["jobs"]) == {"benchmark", "store"}, sorted(doc["jobs"])
    assert store["permissions"] == {"contents": "write"}
    assert benchmark["permissions"] == {"contents": "read"}
    assert not _self_hosted(store) and store["runs-on"] == "ubuntu-latest"
    for name, other in _workflows().items():
        for job_name, job in other["jobs"].items():
            if _writes(_scopes(other, job)):
                assert not _self_hosted(job), f"{name}: {job_name} can write on a self-hosted runner"
                assert not _triggers(other) & PR_TRIGGERS, f"{name}: {job_name} can write in a pull request's run"


def test_the_store_job_runs_only_for_pushes_to_protected_main():
    """asv-publish is triggered by pushes to main alone, and the store job's own condition says so again (push, main,
    a protected ref): a workflow_dispatch or pull_request trigger added later does not reach the write token. It pushes
    fast-forward only, to the history branch alone; the self-hosted job pushes nothing."""
    doc, benchmark, store = _jobs()
    assert _triggers(doc) == {"push"} and doc["on"]["push"] == {"branches": ["main"]}, doc["on"]
    assert store is not None, f"no store job: {sorted(doc['jobs'])}"
    condition = store["if"]
    for term in ("github.event_name == 'push'", "github.ref == 'refs/heads/main'", "github.ref_protected"):
        assert term in condition, (term, condition)
    assert " || " not in condition, condition
    assert store["needs"] == "benchmark"
    script = _step(store, "Add the new results")["run"]
    pushes = [line.strip() for line in script.splitlines() if re.search(r"\bgit\b.*\bpush\b", line)]
    assert pushes == ['if git push -q "$ASV_HISTORY_REMOTE" "HEAD:refs/heads/$ASV_HISTORY_BRANCH"; then'], pushes
    assert not re.search(r"--force|--mirror|--delete|\s-f\b|[\s\"']\+(HEAD|refs/)", pushes[0])
    assert all(not re.search(r"\bpush\b", step.get("run", "")) for step in benchmark["steps"])


def test_one_publish_at_a_time_per_ref_and_none_is_cancelled():
    """Two publishes of main never hold the history at once (one group per ref, for the whole run), and a running one
    is never cancelled mid-store; another ref's group is another group."""
    doc, benchmark, store = _jobs()
    concurrency = doc["concurrency"]
    assert concurrency["cancel-in-progress"] is False
    assert "github.ref" in concurrency["group"]

    def group(ref: str) -> str:
        context = {"github.workflow": doc["name"], "github.ref": ref}
        return re.sub(r"\$\{\{(.*?)\}\}", lambda m: next((context[t.strip()] for t in m.group(1).split("||")
                                                          if context.get(t.strip())), ""), concurrency["group"])

    assert group("refs/heads/main") == group("refs/heads/main") != group("refs/heads/other")
    assert all("concurrency" not in job for job in doc["jobs"].values())


# --- the history steps, run -------------------------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, env={"PATH": "/usr/bin:/bin", "HOME": str(repo), **GIT_ENV},
                          check=True, capture_output=True, text=True, timeout=HANG_GUARD_S)
    return proc.stdout.strip()


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`script` as GitHub runs a step without `shell:` (bash -e)."""
    return subprocess.run(["bash", "--noprofile", "--norc", "-e", "-c", script], cwd=cwd, capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env={"PATH": "/usr/bin:/bin", **GIT_ENV, **env})


class Site:
    """A bare repository standing in for GitHub's, and the publish run's two history steps run against it."""

    def __init__(self, root: Path):
        self.root, self.runs = root, 0
        self.remote = root / "remote.git"
        _git(root, "init", "-q", "--bare", "-b", "main", str(self.remote))
        self.doc, self.benchmark, self.store = _jobs()
        env = self.doc.get("env", {})
        assert "ASV_HISTORY_BRANCH" in env, f"the workflow names no history branch (ASV_HISTORY_BRANCH): {env}"
        self.branch = env["ASV_HISTORY_BRANCH"]
        self.hooks: dict[str, str] = {}

    def _env(self, temp: Path, **extra: str) -> dict[str, str]:
        temp.mkdir(parents=True)
        return {"HOME": str(self.root / "home"), "RUNNER_TEMP": str(temp), "GH_TOKEN": "",
                "ASV_HISTORY_BRANCH": self.branch, "ASV_HISTORY_REMOTE": str(self.remote), **self.hooks, **extra}

    def fetch(self) -> tuple[subprocess.CompletedProcess, Path]:
        """The benchmark job's fetch step in a fresh workspace and RUNNER_TEMP: (process, the .asv/results link)."""
        self.runs += 1
        workspace = self.root / f"workspace-{self.runs}"
        workspace.mkdir()
        temp = self.root / f"bench-temp-{self.runs}"
        proc = _bash(_step(self.benchmark, "Fetch the results history")["run"], workspace, self._env(temp))
        upload = _step(self.benchmark, "Upload the results")["with"]["path"].replace("${{ runner.temp }}", str(temp))
        link = workspace / ".asv" / "results"
        if proc.returncode == 0:
            assert link.is_symlink() and link.resolve() == Path(upload).resolve(), (link, upload)
        return proc, link

    def store_results(self, results: Path) -> subprocess.CompletedProcess:
        """The store job: the artifact (a copy of `results`) downloaded where the job says, then its store step."""
        assert self.store is not None, f"no store job: {sorted(self.doc['jobs'])}"
        self.runs += 1
        temp = self.root / f"store-temp-{self.runs}"
        download = _step(self.store, "Add the new results")["env"]["NEW_RESULTS"]
        (got,) = [s for s in self.store["steps"] if s.get("uses", "").startswith("actions/download-artifact@")]
        assert got["with"]["path"] == download and got["with"]["name"] == _step(self.benchmark, "Upload the results")[
            "with"]["name"]
        env = self._env(temp, SOURCE_SHA="0" * 40)
        shutil.copytree(results, download.replace("${{ runner.temp }}", str(temp)))
        env["NEW_RESULTS"] = download.replace("${{ runner.temp }}", str(temp))
        return _bash(_step(self.store, "Add the new results")["run"], self.root, env)

    def tip(self) -> str | None:
        out = _git(self.remote, "for-each-ref", "--format=%(objectname)", f"refs/heads/{self.branch}")
        return out or None

    def files(self, ref: str | None = None) -> dict[str, str]:
        ref = ref or self.tip()
        names = _git(self.remote, "ls-tree", "-r", "--name-only", ref).split()
        return {n: _git(self.remote, "show", f"{ref}:{n}") for n in names}


def _asv_writes(results: Path, commit: str, value: str, benchmarks: str = "v1") -> None:
    """What `asv run` leaves in its results_dir for one new commit."""
    (results / MACHINE).mkdir(parents=True, exist_ok=True)
    (results / MACHINE / "machine.json").write_text('{"machine": "gpu-8x-sm120"}')
    (results / "benchmarks.json").write_text(benchmarks)
    (results / MACHINE / f"{commit}-runner-virtualenv.json").write_text(value)


def _ran(*procs: subprocess.CompletedProcess) -> str:
    return "\n".join(f"rc={p.returncode}\n{p.stdout}{p.stderr}" for p in procs)


def test_a_first_run_starts_the_branch_and_later_runs_add_to_it(tmp_path):
    """No branch yet: the fetch step starts an empty history in RUNNER_TEMP and the store job creates the branch. The
    next run fetches it, asv adds a commit's file beside the stored ones, and the store adds it on top (a fast-forward:
    the earlier commit is the new one's parent). A rerun with nothing new stores nothing."""
    site = Site(tmp_path)
    proc, link = site.fetch()
    assert proc.returncode == 0 and "first run" in proc.stdout, _ran(proc)
    assert link.resolve().is_relative_to((tmp_path / "bench-temp-1").resolve()) and not any(link.iterdir())
    _asv_writes(link, "aaaaaaaa", "A")
    stored = site.store_results(link)
    assert stored.returncode == 0, _ran(stored)
    first = site.tip()
    assert site.files() == {"results/benchmarks.json": "v1", f"results/{MACHINE}/machine.json": '{"machine": "gpu-8x-sm120"}',
                            f"results/{MACHINE}/aaaaaaaa-runner-virtualenv.json": "A"}

    proc, link = site.fetch()
    assert proc.returncode == 0 and (link / MACHINE / "aaaaaaaa-runner-virtualenv.json").read_text() == "A", _ran(proc)
    _asv_writes(link, "bbbbbbbb", "B", benchmarks="v2")  # asv rewrites benchmarks.json on every run
    stored = site.store_results(link)
    assert stored.returncode == 0, _ran(stored)
    assert _git(site.remote, "rev-parse", f"{site.tip()}^") == first
    files = site.files()
    assert files[f"results/{MACHINE}/aaaaaaaa-runner-virtualenv.json"] == "A"
    assert files[f"results/{MACHINE}/bbbbbbbb-runner-virtualenv.json"] == "B"
    assert files["results/benchmarks.json"] == "v2"

    tip = site.tip()
    again = site.store_results(link)  # the same artifact again: a rerun of the store
    assert again.returncode == 0 and "nothing new" in again.stdout and site.tip() == tip, _ran(again)


def test_a_stored_result_is_never_rewritten_or_dropped(tmp_path):
    """asv's NEW benchmarks only commits without results, so a stored commit's file that comes back changed is no
    rerun asv would make: the store refuses it, names it, and pushes nothing (the new file beside it neither). A file
    the artifact lacks stays on the branch."""
    site = Site(tmp_path)
    proc, link = site.fetch()
    _asv_writes(link, "aaaaaaaa", "A")
    assert site.store_results(link).returncode == 0
    tip = site.tip()

    proc, link = site.fetch()
    (link / MACHINE / "aaaaaaaa-runner-virtualenv.json").write_text("A, rewritten")
    _asv_writes(link, "bbbbbbbb", "B")
    refused = site.store_results(link)
    assert refused.returncode == 1 and f"{MACHINE}/aaaaaaaa-runner-virtualenv.json" in refused.stdout, _ran(refused)
    assert site.tip() == tip and site.files()[f"results/{MACHINE}/aaaaaaaa-runner-virtualenv.json"] == "A"

    only_new = tmp_path / "only-new"
    _asv_writes(only_new, "cccccccc", "C")
    (only_new / MACHINE / "machine.json").write_text('{"machine": "gpu-8x-sm120"}')
    (only_new / "benchmarks.json").write_text("v1")
    stored = site.store_results(only_new)
    assert stored.returncode == 0, _ran(stored)
    assert {f"results/{MACHINE}/aaaaaaaa-runner-virtualenv.json", f"results/{MACHINE}/cccccccc-runner-virtualenv.json"} \
        <= set(site.files())


@pytest.mark.parametrize("branch_exists", [False, True], ids=["first-run", "later-run"])
def test_a_push_racing_the_store_loses_no_results(tmp_path, branch_exists):
    """Should the branch move between the store's fetch and its push (another writer, a first run racing a first run),
    the fast-forward push is refused and the store fetches the branch again and adds its files on top: both the other
    push's results and this run's are on the branch, the other push's commit an ancestor of the tip."""
    site = Site(tmp_path)
    if branch_exists:
        proc, link = site.fetch()
        _asv_writes(link, "aaaaaaaa", "A")
        assert site.store_results(link).returncode == 0
    other = tmp_path / "other"
    _git(tmp_path, "init", "-q", "-b", site.branch, str(other))
    if branch_exists:
        _git(other, "fetch", "-q", str(site.remote), site.branch)
        _git(other, "reset", "-q", "--hard", "FETCH_HEAD")
    (other / "results" / MACHINE).mkdir(parents=True, exist_ok=True)
    (other / "results" / MACHINE / "dddddddd-runner-virtualenv.json").write_text("D")
    _git(other, "add", "-A")
    _git(other, "commit", "-qm", "another writer")
    raced = _git(other, "rev-parse", "HEAD")
    hooks, mark = tmp_path / "hooks", tmp_path / "raced"
    hooks.mkdir()
    (hooks / "pre-push").write_text(  # the first push the store makes finds the branch moved under it
        f'#!/bin/sh\n[ -e "{mark}" ] && exit 0\n: > "{mark}"\nunset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE\n'
        f'git -C "{other}" push -q "{site.remote}" "HEAD:refs/heads/{site.branch}"\n')
    (hooks / "pre-push").chmod(0o755)

    proc, link = site.fetch()
    _asv_writes(link, "bbbbbbbb", "B")
    site.hooks = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.hooksPath", "GIT_CONFIG_VALUE_0": str(hooks)}
    stored = site.store_results(link)
    assert mark.exists(), "the race was not staged"
    assert stored.returncode == 0 and "moved" in stored.stdout, _ran(stored)
    files = site.files()
    assert files[f"results/{MACHINE}/dddddddd-runner-virtualenv.json"] == "D"
    assert files[f"results/{MACHINE}/bbbbbbbb-runner-virtualenv.json"] == "B"
    assert _git(site.remote, "merge-base", "--is-ancestor", raced, site.tip()) == ""


def test_a_fetch_that_fails_stops_the_job(tmp_path):
    """Only a missing branch is a first run: a remote that cannot be read stops the job, rather than benchmarking and
    publishing from an empty history."""
    site = Site(tmp_path)
    site.remote = tmp_path / "no-such-remote.git"
    proc, link = site.fetch()
    assert proc.returncode not in (0, 2) and "cannot list" in proc.stdout and not link.exists(), _ran(proc)


# --- the docs ---------------------------------------------------------------------------------------------------------

def test_the_docs_say_where_the_history_lives():
    text = (REPO / "docs" / "ci-runners.md").read_text()
    assert "~/.cache/mla-harness/asv-results" not in text
    assert re.search(r"^.*results history.*`asv-results` branch.*$", text, re.M), "docs/ci-runners.md: no history line"
    home = re.search(r"`HOME` is the job's own `\$RUNNER_TEMP/home`[^;]*;", text)  # nothing is kept in the runner user's
    assert home and "history" not in home.group(0) and "asv-results" not in home.group(0), home
