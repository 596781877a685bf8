"""The GPU node's perf workflows and runner set-up (.github/workflows/perf-gate.yml, asv-publish.yml, sglang-gate.yml,
ci/setup_gpu_runner.sh, ci/asv_runner_env.py), each against the defect that was found in it:

* the perf gate timed `origin/<base branch>` as fetched when the job started, not the base the merge commit holds;
* the perf workflows shared one node-wide concurrency group, where a newer pending run cancels an older pending one
  (any pull request's push cancelled a pending gate, publish or manual SGLang gate);
* the perf gate passed a benchmark the harness rule found INCONCLUSIVE;
* the pull request under test supplied its own gate (asv config, benchmarks, ci/asv_gate.py and the harness it judges
  with), so a change to the gate judged itself;
* asv's per-commit environments could not see a venv inside the checkout (the runner's asv_runner, FlashInfer), and
  saw the runner user's ~/.local site-packages, which every job (a pull request's code too) can write;
* the runner set-up shared Triton's and FlashInfer's caches and the user site between jobs, and took whatever
  flashinfer-python <0.8 was newest.

The jobs' steps run here for real in bash, in a throwaway repository (a merge commit whose base branch moved on), with
the GPU commands (set-up, asv) stood in for.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suites.hang_guard import HANG_GUARD_S
from suites.workflow_files import GIT_ENV
from suites.workflow_files import workflows as _workflows

REPO = Path(__file__).resolve().parents[1]
PERF = ("perf-gate.yml", "asv-publish.yml", "sglang-gate.yml")
PER_PR_OR_REF = "${{ github.workflow }}-${{ github.event.pull_request.number || github.ref }}"


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, env={"PATH": "/usr/bin:/bin", "HOME": str(repo), **GIT_ENV},
                          check=True, capture_output=True, text=True, timeout=HANG_GUARD_S)
    return proc.stdout.strip()


# --- concurrency ------------------------------------------------------------------------------------------------------

EVENTS = {  # the github context of a pull request's runs (two of them), a push to main and a manual run on main
    "pull request 7": {"github.event.pull_request.number": "7", "github.ref": "refs/pull/7/merge"},
    "pull request 8": {"github.event.pull_request.number": "8", "github.ref": "refs/pull/8/merge"},
    "push to main": {"github.ref": "refs/heads/main"},
    "dispatch on main": {"github.ref": "refs/heads/main"},
}


def _group(doc: dict, context: dict[str, str]) -> str | None:
    """The workflow's concurrency group as GitHub evaluates it in `context` (`a || b`: the first non-empty)."""
    concurrency = doc.get("concurrency")
    if concurrency is None:
        return None
    group = concurrency["group"] if isinstance(concurrency, dict) else concurrency
    context = {"github.workflow": doc["name"], **context}

    def value(m: re.Match) -> str:
        return next((context[t.strip()] for t in m.group(1).split("||") if context.get(t.strip())), "")

    return re.sub(r"\$\{\{(.*?)\}\}", value, str(group))


def test_no_concurrency_group_is_shared_between_workflows():
    """GitHub keeps one pending run per concurrency group: a group shared by perf-gate, asv-publish and sglang-gate let
    a newer pending run (another pull request's, a fork's skipped one) cancel an older pending one. Each perf workflow's
    group, if any, is its own per pull request or ref; the node's one runner agent queues their jobs."""
    docs = _workflows()
    for event, context in EVENTS.items():
        owners: dict[str, list[str]] = {}
        for name, doc in docs.items():
            if (group := _group(doc, context)) is not None:
                owners.setdefault(group, []).append(name)
        shared = {group: names for group, names in owners.items() if len(names) > 1}
        assert not shared, f"{event}: concurrency groups shared between workflows: {shared}"
    for name in ("perf-gate.yml", "asv-publish.yml"):
        assert _group(docs[name], EVENTS["pull request 7"]) != _group(docs[name], EVENTS["pull request 8"]), name
    assert docs["perf-gate.yml"]["concurrency"] == {"group": PER_PR_OR_REF, "cancel-in-progress": True}
    assert docs["asv-publish.yml"]["concurrency"] == {"group": PER_PR_OR_REF, "cancel-in-progress": False}
    assert "concurrency" not in docs["sglang-gate.yml"]  # manual: no dispatch supersedes another


def test_the_one_runner_agent_rule_is_documented():
    text = (REPO / "docs" / "ci-runners.md").read_text()
    assert re.search(r"one runner agent", text) and "perf-node-gpu-8x-sm120" not in text


# --- the perf gate's job, step by step ---------------------------------------------------------------------------------

FAKE_GATE = '''import json, os, sys

from harness.gate import decision

VERSION = "@VERSION@"


def main(argv=None):
    record = {"who": "asv_gate", "version": VERSION, "file": os.path.realpath(__file__), "decision": decision.VERSION,
              "argv": sys.argv[1:] if argv is None else argv, "cwd": os.getcwd(), "conf": open("asv.conf.json").read(),
              "benchmarks": {n: open(os.path.join("suites/asv", n)).read() for n in sorted(os.listdir("suites/asv"))
                             if n.endswith(".py")},
              "runner_env": open("ci/asv_runner_env.py").read()}
    with open(os.environ["RECORD"], "a") as f:
        f.write(json.dumps(record) + "\\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''
FAKE_SHARED = '''import json, os, sys

with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps({"who": "shared_strategies", "version": "@VERSION@", "argv": sys.argv[1:]}) + "\\n")
print("stock")
'''


def _project_files(version: str) -> dict[str, str]:
    return {
        "asv.conf.json": json.dumps({"project": "fake", "benchmark_dir": "suites/asv", "which": version}) + "\n",
        "suites/__init__.py": "",
        "suites/asv/__init__.py": "",
        "suites/asv/benchmarks.py": f'VERSION = "{version}"\n',
        "ci/__init__.py": "",
        "ci/asv_gate.py": FAKE_GATE.replace("@VERSION@", version),
        "ci/shared_strategies.py": FAKE_SHARED.replace("@VERSION@", version),
        "ci/asv_runner_env.py": f'VERSION = "{version}"\n',
        "ci/setup_gpu_runner.sh": "exit 0  # the GPU set-up, stood in for\n",
        "harness/__init__.py": "",
        "harness/gate/__init__.py": "",
        "harness/gate/decision.py": f'VERSION = "{version}"\n',
        "harness/strategy.py": f'VERSION = "{version}"\n',
    }


def _write(repo: Path, files: dict[str, str | None]) -> None:
    for rel, text in files.items():
        path = repo / rel
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _merge_repo(root: Path) -> dict[str, str]:
    """main: B0, then M1 (edits the gate's plugin); the pull request from B0 edits the gate (config, benchmarks, gate,
    decision rule), adds a benchmark file and edits the harness; X merges it into M1, as GitHub's refs/pull/N/merge;
    then main moves on to M2 (origin/main), which edits the gate again. HEAD is X, detached, as actions/checkout leaves it."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _write(repo, _project_files("base"))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "B0")
    _git(repo, "checkout", "-qb", "pr")
    pr = _project_files("pr")
    _write(repo, {k: pr[k] for k in ("asv.conf.json", "suites/asv/benchmarks.py", "ci/asv_gate.py", "harness/gate/decision.py",
                                      "harness/strategy.py")} | {"suites/asv/new_bench.py": 'VERSION = "pr"\n'})
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "pr: faster and a gate of its own")
    _git(repo, "checkout", "-q", "main")
    _write(repo, {"ci/asv_runner_env.py": 'VERSION = "main1"\n'})
    _git(repo, "commit", "-qam", "M1")
    m1 = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "--detach", m1)
    _git(repo, "merge", "-q", "--no-ff", "-m", "Merge pr into main", "pr")
    merge = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "main")
    _write(repo, {"ci/asv_runner_env.py": 'VERSION = "main2"\n', "ci/asv_gate.py": FAKE_GATE.replace("@VERSION@", "main2"),
                  "suites/asv/benchmarks.py": 'VERSION = "main2"\n'})
    _git(repo, "commit", "-qam", "M2: main moved on after the merge was computed")
    m2 = _git(repo, "rev-parse", "HEAD")
    _git(repo, "update-ref", "refs/remotes/origin/main", m2)
    _git(repo, "checkout", "-q", "--detach", merge)
    return {"repo": str(repo), "m1": m1, "m2": m2, "merge": merge, "pr": _git(repo, "rev-parse", "pr")}


CONTEXT = {"github.base_ref": "main", "github.event.pull_request.number": "7", "github.run_attempt": "1"}


def _expand(value) -> str:
    return re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", lambda m: CONTEXT[m.group(1)], str(value))


def _run_job(workflow: str, job: str, repo: Path, root: Path) -> tuple[list[subprocess.CompletedProcess], list[dict]]:
    """Every `run` step of the job, in order, as GitHub runs one (bash -e, in the checkout), with what a step appends
    to $GITHUB_ENV reaching the later ones; `python` is this interpreter, `asv` a stand-in. Stops at a failing step."""
    bin_dir, temp, record = root / "bin", root / "runner-temp", root / "record.jsonl"
    for folder in (bin_dir, temp, root / "home"):
        folder.mkdir(exist_ok=True)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "asv").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("python", "asv"):
        (bin_dir / tool).chmod(0o755)
    record.write_text("")
    github_env = root / "github_env"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(root / "home"), "RUNNER_TEMP": str(temp), "RECORD": str(record),
           "GITHUB_ENV": str(github_env), "GITHUB_PATH": str(root / "github_path"), "GITHUB_WORKSPACE": str(repo),
           "GITHUB_SHA": _git(repo, "rev-parse", "HEAD"), "PYTHONDONTWRITEBYTECODE": "1", **GIT_ENV}
    exported: dict[str, str] = {}
    done = []
    for step in _workflows()[workflow]["jobs"][job]["steps"]:
        if "run" not in step:
            continue
        github_env.write_text("")
        step_env = {**env, **exported, **{k: _expand(v) for k, v in step.get("env", {}).items()}}
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-e", "-c", step["run"]], cwd=repo, env=step_env,
                              capture_output=True, text=True, timeout=HANG_GUARD_S)
        done.append(proc)
        if proc.returncode != 0:
            break
        exported.update(line.split("=", 1) for line in github_env.read_text().splitlines() if "=" in line)
    return done, [json.loads(line) for line in record.read_text().splitlines()]


@pytest.fixture(scope="module")
def gate_job(tmp_path_factory):
    root = tmp_path_factory.mktemp("perf-gate-job")
    commits = _merge_repo(root)
    steps, records = _run_job("perf-gate.yml", "asv-continuous", Path(commits["repo"]), root)
    return commits, root, steps, records


def _ran(steps) -> str:
    return "\n".join(f"[exit {p.returncode}]\n{p.stdout}{p.stderr}" for p in steps)


def _gate_record(steps, records) -> dict:
    assert all(p.returncode == 0 for p in steps), _ran(steps)
    gates = [r for r in records if r["who"] == "asv_gate"]
    assert len(gates) == 1, (records, _ran(steps))
    return gates[0]


def test_the_perf_gate_times_the_merge_commits_first_parent_not_the_moved_base_branch(gate_job):
    """HEAD is the merge commit GitHub computed when the event fired; origin/main, fetched when the job starts, had
    moved on (M2): the gate compared the head with base commits it does not contain. The base is HEAD^1 (M1)."""
    commits, root, steps, records = gate_job
    gate = _gate_record(steps, records)
    assert gate["argv"][0] == commits["m1"] != commits["m2"], f"the gate's base is {gate['argv'][0]!r}, not the merge's first parent"
    assert gate["argv"][1] in ("HEAD", commits["merge"])
    base_tree = root / "runner-temp" / "perf-base"
    assert _git(base_tree, "rev-parse", "HEAD") == commits["m1"]  # the strategies are listed from the same base
    shared = [r for r in records if r["who"] == "shared_strategies"]
    assert [r["argv"] for r in shared] == [[str(base_tree)], [str(base_tree), "--presets"]]  # the strategies, the presets


def test_the_perf_gate_refuses_a_head_that_is_no_merge_commit(tmp_path):
    """HEAD^1 is the base only of a merge commit: a checkout of the pull request's own head (HEAD^1, its previous
    commit) stops the job before anything is timed. Its twin is the merge above."""
    commits = _merge_repo(tmp_path)
    repo = Path(commits["repo"])
    _git(repo, "checkout", "-q", "--detach", commits["pr"])
    steps, records = _run_job("perf-gate.yml", "asv-continuous", repo, tmp_path)
    assert steps[-1].returncode == 2 and "no merge commit" in steps[-1].stdout, _ran(steps)
    assert not [r for r in records if r["who"] == "asv_gate"]


def test_the_perf_gate_fails_an_inconclusive_benchmark(gate_job):
    """At the GPU default of 30 samples, 129 of 300 true 10% slowdowns with two clock states passed the gate with
    only an INCONCLUSIVE line (docs/gating.md): the workflow passes --inconclusive fail (the CLI default stays pass)."""
    commits, root, steps, records = gate_job
    argv = _gate_record(steps, records)["argv"]
    assert "--inconclusive" in argv and argv[argv.index("--inconclusive") + 1] == "fail", argv
    assert ["--factor", "1.05"] == argv[argv.index("--factor"):argv.index("--factor") + 2]


def test_the_perf_gate_judges_a_pull_request_with_the_bases_gate(gate_job):
    """The pull request's asv.conf.json and suites/asv/, and its ci/asv_gate.py with the harness it judges with
    (harness/gate/), were the gate: a pull request that narrowed the benchmarks or edited the rule judged itself. Now
    every one of them is the base's (M1's: its edited plugin too, not M2's), a benchmark file the pull request adds is
    not run, and one line names the gate files the pull request changed."""
    commits, root, steps, records = gate_job
    gate = _gate_record(steps, records)
    base = _project_files("base")
    assert (gate["version"], gate["decision"]) == ("base", "base"), gate
    assert Path(gate["file"]).is_relative_to(root / "runner-temp" / "perf-base"), gate["file"]
    assert Path(gate["cwd"]) == Path(commits["repo"])  # asv runs in the checkout, its results where the upload looks
    assert gate["conf"] == base["asv.conf.json"]
    assert gate["benchmarks"] == {"__init__.py": "", "benchmarks.py": base["suites/asv/benchmarks.py"]}
    assert gate["runner_env"] == 'VERSION = "main1"\n'
    assert [r["version"] for r in records if r["who"] == "shared_strategies"] == ["base", "base"]
    printed = [line for p in steps for line in p.stdout.splitlines() if line.startswith("gate files changed by this PR:")]
    assert printed == ["gate files changed by this PR: asv.conf.json, ci/asv_gate.py, harness/gate/decision.py, "
                       "suites/asv/benchmarks.py, suites/asv/new_bench.py; judged with the base's"], _ran(steps)
    # the pull request's harness itself is what asv benchmarks at HEAD: the checkout keeps it
    assert (Path(commits["repo"]) / "harness" / "strategy.py").read_text() == 'VERSION = "pr"\n'


def _one_pr_merged(tmp_path: Path, base: dict[str, str], pr: dict[str, str]) -> Path:
    """A repository whose main holds the base project (and `base`'s files), with a pull request writing `pr`'s files
    merged into it: HEAD the merge, detached."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _write(repo, _project_files("base") | base)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "B0")
    _git(repo, "checkout", "-qb", "pr")
    _write(repo, pr)
    _git(repo, "commit", "-qam", "pr")
    _git(repo, "checkout", "-q", "--detach", "main")
    _git(repo, "merge", "-q", "--no-ff", "-m", "merge", "pr")
    return repo


def test_a_pull_request_that_leaves_the_gate_alone_prints_no_gate_line(tmp_path):
    """The twin of the line above: only a pull request that changes the gate's files is told so."""
    repo = _one_pr_merged(tmp_path, {}, {"harness/strategy.py": 'VERSION = "pr"\n'})
    steps, records = _run_job("perf-gate.yml", "asv-continuous", repo, tmp_path)
    assert _gate_record(steps, records)["version"] == "base"
    assert not [line for p in steps for line in p.stdout.splitlines() if line.startswith("gate files changed")]


def test_a_pull_request_that_edits_the_perf_gate_workflow_is_named(tmp_path):
    """The workflow holds the factor and --inconclusive, and GitHub runs the pull request's copy of it: a pull request
    that set --factor 1.5 printed no gate line. Now it is named (a reviewer sees it); twin: the test above."""
    workflow = ".github/workflows/perf-gate.yml"
    repo = _one_pr_merged(tmp_path, {workflow: "# the base's\n"}, {workflow: "# --factor 1.5\n"})
    steps, records = _run_job("perf-gate.yml", "asv-continuous", repo, tmp_path)
    printed = [line for p in steps for line in p.stdout.splitlines() if line.startswith("gate files changed")]
    assert printed == ["gate files changed by this PR: .github/workflows/perf-gate.yml; judged with the base's"], _ran(steps)


# --- asv's per-commit environment -----------------------------------------------------------------------------------

ASV_ENV_CHILD = '''import json, os, sys

from asv.config import Config

import asv_runner_env

conf = Config()
conf.env_dir, conf.project, conf.repo = os.path.join(os.getcwd(), ".asv", "env"), "mla-harness", "."
env = asv_runner_env.RunnerVirtualenv(conf, f"{sys.version_info.major}.{sys.version_info.minor}", {}, {})
env.create()  # what asv does per commit: the plugin's _setup writes the .pth of the runner's folders
print(json.dumps({"env": env._path, "python": os.path.join(env._path, "bin", "python")}))
'''
PROBE = '''import importlib.util, json
found = {name: (s.origin if (s := importlib.util.find_spec(name)) else None) for name in ("runner_pkg", "user_pkg", "harness")}
print(json.dumps(found))
'''


@pytest.fixture(scope="module")
def asv_env(tmp_path_factory):
    """A checkout (harness/ sources) with its venv inside it (`python -m venv --system-site-packages .venv`, as
    ci/setup_gpu_runner.sh makes one outside GitHub Actions and the README's set-up does), holding the runner's packages
    (runner_pkg) and a .pth that puts the checkout on that venv's sys.path (as a path-based editable install does); the
    runner user's site-packages (user_pkg) exists. From the checkout, as asv runs it, the plugin (this tree's
    ci/asv_runner_env.py) makes one commit's environment; PYTHONNOUSERSITE=1 as the GPU jobs set it."""
    asv = pytest.importorskip("asv")
    virtualenv = pytest.importorskip("virtualenv")
    root = tmp_path_factory.mktemp("asv-runner-env")
    checkout = root / "checkout"
    (checkout / "harness").mkdir(parents=True)
    (checkout / "harness" / "__init__.py").write_text('SOURCE = "the checkout"\n')
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(checkout / ".venv")],
                   check=True, capture_output=True, timeout=HANG_GUARD_S)
    venv_python = checkout / ".venv" / "bin" / "python"
    purelib = Path(subprocess.run([str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True, timeout=HANG_GUARD_S).stdout.strip())
    (purelib / "runner_pkg").mkdir()
    (purelib / "runner_pkg" / "__init__.py").write_text("")
    (purelib / "checkout_src.pth").write_text(f"{checkout}\n")
    userbase = root / "userbase"
    user_site = Path(subprocess.run([str(venv_python), "-c", "import site; print(site.getusersitepackages())"],
                                    env={"PYTHONUSERBASE": str(userbase), "PATH": "/usr/bin:/bin"},
                                    check=True, capture_output=True, text=True, timeout=HANG_GUARD_S).stdout.strip())
    (user_site / "user_pkg").mkdir(parents=True)
    (user_site / "user_pkg" / "__init__.py").write_text("")
    plugin = root / "plugin"
    plugin.mkdir()
    shutil.copy(REPO / "ci" / "asv_runner_env.py", plugin / "asv_runner_env.py")
    (plugin / "child.py").write_text(ASV_ENV_CHILD)
    libs = dict.fromkeys(str(Path(m.__file__).resolve().parents[1]) for m in (asv, virtualenv))  # asv's own site folder(s)
    env = {"PATH": f"{venv_python.parent}:/usr/bin:/bin", "HOME": str(root), "PYTHONUSERBASE": str(userbase),
           "PYTHONNOUSERSITE": "1", "PYTHONPATH": os.pathsep.join([str(plugin), *libs])}
    made = subprocess.run([str(venv_python), str(plugin / "child.py")], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)
    assert made.returncode == 0, made.stderr
    made = json.loads(made.stdout.splitlines()[-1])
    pth = next(Path(made["env"]).rglob("asv_runner_site.pth")).read_text().split()
    probe = subprocess.run([made["python"], "-c", PROBE], cwd=root, env={"PATH": "/usr/bin:/bin", "HOME": str(root)},
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert probe.returncode == 0, probe.stderr
    return {"checkout": checkout.resolve(), "venv_site": purelib.resolve(), "user_site": user_site.resolve(), "pth": pth,
            "found": json.loads(probe.stdout)}


def test_asvs_environment_sees_a_venv_inside_the_checkout(asv_env):
    """ci/setup_gpu_runner.sh's venv lived in the checkout, and the plugin left out every folder under the checkout, its
    site-packages too: the commits' environments had no asv_runner (`No module named 'asv_runner'`), no FlashInfer."""
    assert str(asv_env["venv_site"]) in asv_env["pth"], asv_env["pth"]
    assert asv_env["found"]["runner_pkg"] is not None, asv_env


def test_asvs_environment_never_sees_the_checkouts_sources(asv_env):
    """The reason the checkout is left out: a commit's environment imports that commit's installed harness, never the
    checkout's (here on the runner venv's sys.path through a .pth, as a path-based editable install puts it)."""
    checkout = asv_env["checkout"]
    assert str(checkout) not in asv_env["pth"]
    assert all(Path(d) == asv_env["venv_site"] or not Path(d).is_relative_to(checkout) or Path(d).is_relative_to(checkout / ".venv")
               for d in asv_env["pth"]), asv_env["pth"]
    harness = asv_env["found"]["harness"]
    assert harness is None or not Path(harness).is_relative_to(checkout), harness


def test_asvs_environment_never_sees_the_runner_users_site_packages(asv_env):
    """The plugin added ~/.local's site-packages to every commit's environment explicitly: what any job (a pull
    request's code among them) installed there reached the next trusted job's benchmarks."""
    assert str(asv_env["user_site"]) not in asv_env["pth"], asv_env["pth"]
    assert asv_env["found"]["user_pkg"] is None, asv_env


# --- the runner set-up ------------------------------------------------------------------------------------------------

FAKE_TORCH = "class cuda:\n    is_available = staticmethod(lambda: True)\n    device_count = staticmethod(lambda: 8)\n" \
             "class version:\n    cuda = '13.0'\n__version__ = '0.0-stand-in'\n"


def _setup(tmp_path: Path, flashinfer: str) -> tuple[subprocess.CompletedProcess, Path]:
    """ci/setup_gpu_runner.sh under GitHub Actions' variables, with python3 (the venv), pip and CUDA torch stood in for
    and `flashinfer` as the FlashInfer the runner ends up with. The pip commands and their environment are recorded."""
    (tmp_path / "ci").mkdir()
    for path in (REPO / "ci").glob("*"):
        if path.name in ("setup_gpu_runner.sh", "install_offline_bundle.sh") or re.search(r"constraints.*\.txt$", path.name):
            shutil.copy(path, tmp_path / "ci" / path.name)
    stubs, bin_dir, temp = tmp_path / "stubs", tmp_path / "bin", tmp_path / "runner-temp"
    for folder in (stubs / "torch", stubs / f"flashinfer_python-{flashinfer}.dist-info", bin_dir, temp):
        folder.mkdir(parents=True)
    (stubs / "torch" / "__init__.py").write_text(FAKE_TORCH)
    (stubs / f"flashinfer_python-{flashinfer}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: {flashinfer}\n")
    log = tmp_path / "pip.log"
    fakes = {  # python3 -m venv --system-site-packages VENV: the venv; python -m pip ...: recorded; python -: the check
        "python3": 'for a; do v=$a; done; mkdir -p "$v/bin" && : > "$v/bin/activate"',
        "python": f'if [ "$1" = - ]; then PYTHONPATH={stubs} exec "{sys.executable}" "$@"; fi\n'
                  f'echo "$* | PYTHONNOUSERSITE=${{PYTHONNOUSERSITE:-}} HOME=$HOME" >> {log}',
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    log.write_text("")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "RUNNER_TEMP": str(temp),
           "GITHUB_ENV": str(tmp_path / "github_env"), "GITHUB_PATH": str(tmp_path / "github_path")}
    proc = subprocess.run(["bash", str(tmp_path / "ci" / "setup_gpu_runner.sh")], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    return proc, log


def _pinned_flashinfer() -> str | None:
    for path in sorted((REPO / "ci").glob("*constraints*.txt")):
        for line in path.read_text().splitlines():
            if m := re.fullmatch(r"flashinfer-python==([\w.+!-]+)", line.split("#")[0].strip()):
                return m.group(1)
    return None


def test_the_runner_set_up_keeps_each_job_off_earlier_jobs_state(tmp_path):
    """A --system-site-packages venv imports the runner user's ~/.local site-packages, and Triton's and FlashInfer's JIT
    caches defaulted to ~/.triton and ~/.cache/flashinfer, pip's download cache and asv's machine file were the runner
    user's home's: a pull request's job could leave compiled kernels, wheels, packages or a machine entry that main's
    next job used. The set-up exports PYTHONNOUSERSITE=1 and a home in the job's $RUNNER_TEMP (pip too runs under
    both) and puts the caches and the venv there."""
    proc, log = _setup(tmp_path, _pinned_flashinfer() or "0.7.2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    temp = tmp_path / "runner-temp"
    github_env = tmp_path / "github_env"
    exported = dict(line.split("=", 1) for line in (github_env.read_text() if github_env.exists() else "").splitlines())
    assert exported.get("PYTHONNOUSERSITE") == "1", exported
    for name in ("HOME", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"):
        assert name in exported and Path(exported[name]).is_relative_to(temp), (name, exported)
        assert Path(exported[name]).is_dir()
    assert (tmp_path / "github_path").read_text().splitlines() == [str(temp / "venv" / "bin")]
    pips = log.read_text().splitlines()
    assert pips and all(line.endswith(f"PYTHONNOUSERSITE=1 HOME={exported['HOME']}") for line in pips), pips


def test_the_runner_set_up_installs_one_pinned_flashinfer(tmp_path):
    """`flashinfer-python>=0.7.2,<0.8` resolved afresh on every job: a FlashInfer release moved the numbers without a
    commit. A constraints file in ci/ pins it exactly, pip installs with it, and a runner that ends up with another
    FlashInfer (a bundle of another version, one the runner carries) fails the set-up, naming both."""
    pinned = _pinned_flashinfer()
    assert pinned, "no ci/*constraints*.txt pins flashinfer-python with =="
    proc, log = _setup(tmp_path, pinned)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"flashinfer-python {pinned}" in proc.stdout
    (install,) = [line for line in log.read_text().splitlines() if " install " in line]
    constraints = re.search(r"(?:-c|--constraint)[ =](\S+)", install)
    assert constraints and (tmp_path / constraints.group(1)).is_file(), install
    other = tmp_path / "other"
    other.mkdir()
    proc, _ = _setup(other, "0.7.4")
    assert proc.returncode != 0 and f"flashinfer-python 0.7.4, not {pinned}" in proc.stderr, proc.stderr
