"""ci/sglang_gate.py, the SGLang gate's driver: bad input (one line, exit 2, before anything runs), the asv
configuration it writes (asv loads it and resolves its environment plugin), the per-commit install that
the --json mode hands `harness run`, and the plugin's .pth. On a fake SGLang repository (two commits whose
sglang/__init__.py differ), so no real SGLang is needed; the real one is suites/sglang/test_sglang_patches.py
and the H200 evidence (docs/evidence/sglang-gate/)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import json5
import pytest

from ci import asv_sglang_env, sglang_gate
from suites.hang_guard import HANG_GUARD_S
from suites.helpers import interrupt_when_marked

ROOT = Path(__file__).resolve().parents[1]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def fake_sglang(tmp_path: Path, subdir: str = "python") -> Path:
    """A git repo in SGLang's layout with commits tagged a and b; sglang.MARK names the commit."""
    repo = tmp_path / "sglang"
    pkg = repo / subdir / "sglang"
    pkg.mkdir(parents=True)
    (repo / subdir / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
                                                 '[project]\nname = "sglang"\nversion = "0.5.23"\n')
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for tag in ("a", "b"):
        (pkg / "__init__.py").write_text(f"MARK = {tag!r}\n")
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(repo), "commit", "-qm", tag], check=True, env=env)
        subprocess.run(["git", "-C", str(repo), "tag", tag], check=True)
    return repo


@pytest.fixture(scope="module")
def sglang_results(tmp_path_factory) -> dict[str, str]:
    """Results texts of a real `harness run` with stock and sglang_flashinfer, no SGLang installed: "unsupported" as
    written (sglang_flashinfer unsupported: no SGLang checked), "ran" with its verdict turned into a fail."""
    out = tmp_path_factory.mktemp("sglang-results") / "r.json"
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "--device", "cpu", "--scenario", "b1-l500", "--repeats", "0",
                           "--strategy", "stock", "--strategy", "sglang_flashinfer", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-800:]
    doc = json.loads(out.read_text())
    (row,) = [r for r in doc["rows"] if r["strategy"] == "sglang_flashinfer" and r["metric"] == "verdict"]
    assert row["value"] == "unsupported"
    unsupported = json.dumps(doc)
    row.update(value="fail", detail={**row["detail"], "status": "fail", "reason": "planted: outputs differ"})
    return {"unsupported": unsupported, "ran": json.dumps(doc)}


@pytest.fixture
def wrote_out(sglang_results):
    """A stand-in `harness run --json OUT` that exits 0 having written results in which SGLang ran (the gate fails one
    that wrote nothing, or checked no SGLang)."""
    def run(cmd: list[str]) -> subprocess.CompletedProcess:
        Path(cmd[cmd.index("--json") + 1]).write_text(sglang_results["ran"])
        return subprocess.CompletedProcess(cmd, 0)
    return run


def stub_runs(monkeypatch, run) -> None:
    """`run` stands in for subprocess.run, and for the `harness run` child (sglang_gate.run_harness) as well."""
    monkeypatch.setattr(sglang_gate.subprocess, "run", run)
    monkeypatch.setattr(sglang_gate, "run_harness", lambda cmd, **kwargs: run(cmd, **kwargs).returncode)


def run_main(capsys, *argv: str) -> tuple[int, list[str]]:
    code = sglang_gate.main(list(argv))
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.fixture
def no_asv(monkeypatch, tmp_path_factory):
    """Stand-ins for asv: `asv machine` and the gate record their arguments instead of running (under a HOME
    with no asv machine file)."""
    calls = {"machine": [], "gate": []}
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    real_run = subprocess.run

    def run(cmd, *args, **kwargs):
        if "asv" in cmd and "machine" in cmd:
            calls["machine"].append(cmd)
            return subprocess.CompletedProcess(cmd, 0)
        return real_run(cmd, *args, **kwargs)

    from ci import asv_gate

    monkeypatch.setattr(sglang_gate.subprocess, "run", run)
    monkeypatch.setattr(asv_gate, "main", lambda argv: calls["gate"].append(argv) or 0)
    for name in ("MLA_ASV_STRATEGIES", "MLA_ASV_SCENARIOS", *sglang_gate.BUILD_ENV):  # the gate's setdefault is undone after the test
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    monkeypatch.chdir(ROOT)
    return calls


@pytest.mark.parametrize("case", ["no-such-folder", "not-a-repo", "bare-repo", "unknown-base", "unknown-head", "no-project", "no-repo-given",
                                  "work-is-a-file", "work-holds-your-config", "env-repo-empty", "env-repo-missing", "no-asv"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, no_asv, case):
    repo = fake_sglang(tmp_path)
    monkeypatch.delenv("MLA_SGLANG_REPO", raising=False)
    argv, names = {
        "no-such-folder": (["--sglang-repo", str(tmp_path / "nope"), "a", "b"], "no such folder"),
        "not-a-repo": (["--sglang-repo", str(tmp_path / "plain"), "a", "b"], "not a git repository"),
        "bare-repo": (["--sglang-repo", str(tmp_path / "bare.git"), "a", "b"], "a bare repository: give a checkout"),
        "unknown-base": (["--sglang-repo", str(repo), "nope", "b"], "BASE 'nope': unknown commit"),
        "unknown-head": (["--sglang-repo", str(repo), "a", "v9.9"], "HEAD 'v9.9': unknown commit"),
        "no-project": (["--sglang-repo", str(tmp_path), "a", "b"], "no SGLang project"),
        "no-repo-given": (["a", "b"], "--sglang-repo: not given"),
        "env-repo-empty": (["a", "b"], "MLA_SGLANG_REPO: is set but empty"),
        "env-repo-missing": (["a", "b"], "no such folder"),
        "work-is-a-file": (["--sglang-repo", str(repo), "--work", str(tmp_path / "plain" / "f"), "a", "b"], "--work"),
        "work-holds-your-config": (["--sglang-repo", str(repo), "--work", str(tmp_path / "plain"), "a", "b"],
                                   "asv.conf.json exists and is not the gate's"),
        "no-asv": (["--sglang-repo", str(repo), "--work", str(tmp_path / "w"), "a", "b"], "cannot import asv"),
    }[case]
    if case == "no-asv":  # the gate's Python has SGLang's packages but not the test extra's asv
        monkeypatch.setitem(sys.modules, "asv", None)
    if case.startswith("env-repo"):  # the checkout named by the variable instead of --sglang-repo
        monkeypatch.setenv("MLA_SGLANG_REPO", "" if case == "env-repo-empty" else str(tmp_path / "nope"))
    (tmp_path / "plain").mkdir()
    subprocess.run(["git", "init", "-q", "--bare", str(tmp_path / "bare.git")], check=True)
    (tmp_path / "plain" / "f").write_text("a file")
    (tmp_path / "plain" / "asv.conf.json").write_text('{"my": "config"}')  # the user's: never replaced
    if case == "no-project":  # a git repo whose commits hold no SGLang project
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
        git(repo, "tag", "-d", "a")
        (tmp_path / "x").write_text("x")
        subprocess.run(["git", "-C", str(tmp_path), "add", "x"], check=True)
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"], check=True)
        git(tmp_path, "tag", "a")
        git(tmp_path, "tag", "b")
    code, lines = run_main(capsys, *argv)
    assert code == 2 and len(lines) == 1 and names in lines[0] and lines[0].startswith("sglang-gate: "), lines
    assert no_asv == {"machine": [], "gate": []}, "asv ran on bad input"
    assert (tmp_path / "plain" / "asv.conf.json").read_text() == '{"my": "config"}'
    assert not (tmp_path / "w").exists(), "the gate wrote its configuration before refusing"


@pytest.mark.parametrize("factor", ["3", "1.0", "nan"])
def test_a_factor_outside_1_2_is_refused_before_anything_runs(tmp_path, capsys, no_asv, factor):
    repo = fake_sglang(tmp_path)
    with pytest.raises(SystemExit) as exc:
        sglang_gate.main(["--sglang-repo", str(repo), "--work", str(tmp_path / "w"), "--factor", factor, "a", "b"])
    assert exc.value.code == 2 and "factor must lie in (1, 2)" in capsys.readouterr().err
    assert no_asv == {"machine": [], "gate": []} and not (tmp_path / "w").exists()
    code, _ = run_main(capsys, "--sglang-repo", str(repo), "--work", str(tmp_path / "w"), "--factor", "5%", "a", "b")
    assert code == 0 and no_asv["gate"][0][2:4] == ["--factor", "1.05"]  # twin: 5% is 1.05, as for ci.asv_gate


def test_json_mode_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    repo = fake_sglang(tmp_path)
    code, lines = run_main(capsys, "--sglang-repo", str(repo), "--json", str(tmp_path / "o.json"), "nope")
    assert code == 2 and lines == [f"sglang-gate: COMMIT 'nope': unknown commit in {repo.resolve()}"]
    assert not (tmp_path / "o.json").exists()
    (tmp_path / "o.json").write_text("base")  # an earlier result: kept, refused before anything is installed
    code, lines = run_main(capsys, "--sglang-repo", str(repo), "--json", str(tmp_path / "o.json"), "a")
    assert code == 2 and len(lines) == 1 and "o.json exists" in lines[0] and "--force" in lines[0], lines
    assert (tmp_path / "o.json").read_text() == "base"


def test_good_input_reaches_the_asv_gate_with_the_sglang_config(tmp_path, capsys, no_asv):
    """The twin of the bad-input cases: valid input is not refused, and asv gets the generated config."""
    repo = fake_sglang(tmp_path)
    work = tmp_path / "work"
    code, lines = run_main(capsys, "--sglang-repo", str(repo), "--work", str(work), "a", "b", "--", "--show-stderr")
    assert code == 0 and lines == []
    (argv,) = no_asv["gate"]
    config = work / "asv.conf.json"
    assert argv == [git(repo, "rev-parse", "a"), git(repo, "rev-parse", "b"), "--factor", "1.05", "--config", str(config), "--show-stderr"]
    assert no_asv["machine"] and str(config) in no_asv["machine"][0]
    conf = json5.loads(config.read_text())  # as asv reads it (the first line says who wrote it)
    assert conf["repo"] == str(repo.resolve()) and conf["repo_subdir"] == "python"
    assert conf["environment_type"] == "sglang-runner-virtualenv" and conf["plugins"] == [".ci.asv_sglang_env"]
    assert "--no-deps" in conf["install_command"][0] and "{build_dir}" in conf["install_command"][0]
    assert Path(conf["benchmark_dir"]) == ROOT / "ci" / "asv_sglang_bench" and Path(conf["env_dir"]).parent == work
    assert os.environ["MLA_ASV_STRATEGIES"] == ",".join(sglang_gate.sglang_strategies())
    assert "sglang_flashinfer" in sglang_gate.sglang_strategies() and "stock" not in sglang_gate.sglang_strategies()


def test_the_users_asv_machine_file_is_kept(tmp_path, capsys, monkeypatch):
    """`asv machine --yes` without --machine replaces this host's entry in ~/.asv-machine.json with asv's guesses:
    the gate leaves an entry the user wrote as it is (real asv, only the gate itself stubbed)."""
    from asv.machine import Machine

    from ci import asv_gate

    monkeypatch.setattr(asv_gate, "main", lambda argv: 0)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(ROOT)
    host = Machine.get_unique_machine_name()
    entry = {"arch": "x86_64", "cpu": "my curated CPU", "machine": host, "num_cpu": "99", "os": "my os", "ram": "1"}
    (tmp_path / ".asv-machine.json").write_text(json.dumps({host: entry, "version": 1}))
    before = (tmp_path / ".asv-machine.json").read_bytes()
    repo = fake_sglang(tmp_path)
    assert sglang_gate.main(["--sglang-repo", str(repo), "--work", str(tmp_path / "w"), "a", "b"]) == 0
    assert (tmp_path / ".asv-machine.json").read_bytes() == before


@pytest.mark.parametrize("runnable", [False, True])
def test_the_default_list_leaves_out_what_no_commit_can_run(tmp_path, capsys, monkeypatch, no_asv, runnable):
    """sglang_fa3 has no adapter: at every commit its benchmarks would be n/a, which fails the gate (seen on the
    H200), so the default list leaves it out and says why; the twin: a runnable one stays in."""
    from harness.strategies import REGISTRY

    if runnable:
        monkeypatch.setattr(REGISTRY["sglang_fa3"], "runner_reason", classmethod(lambda cls: None))
    repo = fake_sglang(tmp_path)
    sglang_gate.main(["--sglang-repo", str(repo), "--work", str(tmp_path / "w"), "a", "b"])
    out = capsys.readouterr().out
    assert ("sglang_fa3" in os.environ["MLA_ASV_STRATEGIES"].split(",")) is runnable
    assert ("sglang-gate: left out: sglang_fa3: no adapter" in out) is not runnable
    assert "sglang_flashinfer" in os.environ["MLA_ASV_STRATEGIES"].split(",")


def test_a_root_level_project_is_found(tmp_path, capsys, no_asv):
    repo = fake_sglang(tmp_path, subdir="")
    assert run_main(capsys, "--sglang-repo", str(repo), "--work", str(tmp_path / "w"), "a", "b")[0] == 0
    assert json5.loads((tmp_path / "w" / "asv.conf.json").read_text())["repo_subdir"] == ""


def test_asv_loads_the_config_and_resolves_its_environment(tmp_path, monkeypatch):
    """asv itself reads the generated file and finds the plugin's environment class; a config naming an
    environment type no plugin provides is refused (the twin)."""
    from asv import config, environment
    from asv.plugin_manager import plugin_manager

    repo = fake_sglang(tmp_path)
    monkeypatch.chdir(ROOT)
    path = sglang_gate.write_config(repo, "python", tmp_path / "work")
    conf = config.Config.load(str(path))
    for plugin in conf.plugins:
        plugin_manager.import_plugin(plugin)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert environment.get_environment_class(conf, python) is asv_sglang_env.SGLangRunnerVirtualenv
    conf.environment_type = "no-such-virtualenv"
    with pytest.raises(environment.EnvironmentUnavailable, match="no-such-virtualenv"):
        environment.get_environment_class(conf, python)


def test_pth_lists_the_harness_first_and_never_the_sglang_checkout(tmp_path, monkeypatch):
    repo = fake_sglang(tmp_path)
    inside, outside = repo / "python", tmp_path / "deps"
    outside.mkdir()
    monkeypatch.setenv("ASV_PYTHONPATH", os.pathsep.join([str(inside), str(outside)]))
    lines = asv_sglang_env.pth_lines(str(repo))
    assert lines[0] == str(ROOT) and lines.count(str(ROOT)) == 1
    assert str(outside.resolve()) in lines, "a runner directory outside the checkout must be listed (the twin)"
    assert not any(line.startswith(str(repo.resolve())) for line in lines), lines


def test_a_commit_pip_cannot_install_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """A commit whose SGLang project does not build: one line naming the commit, exit 2, harness never run."""
    repo = fake_sglang(tmp_path)
    real_run, ran = subprocess.run, []

    def run(cmd, *args, **kwargs):
        if "pip" in cmd[1:3]:
            return subprocess.CompletedProcess(cmd, 1)  # pip printed its own error
        ran.append(cmd)
        return real_run(cmd, *args, **kwargs)

    stub_runs(monkeypatch, run)
    code, lines = run_main(capsys, "--sglang-repo", str(repo), "--json", str(tmp_path / "r.json"), "a")
    assert code == 2 and lines[-1].startswith("sglang-gate: COMMIT ") and "could not install" in lines[-1], lines
    assert not any(cmd[1:4] == ["-m", "harness", "run"] for cmd in ran) and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("commit", ["a", "b"])
def test_json_mode_runs_harness_with_that_commits_sglang(tmp_path, capsys, monkeypatch, commit, wrote_out):
    """--json installs the commit --no-deps and runs `harness run --json OUT` with it first on sys.path: the
    process it starts imports that commit's sglang (a and b differ, so each check is the other's twin), and the
    environment its results record names that commit (the install has no .git)."""
    repo = fake_sglang(tmp_path)
    seen = {}
    real_run = subprocess.run

    def run(cmd, *args, **kwargs):
        if cmd[1:4] == ["-m", "harness", "run"]:
            seen["cmd"] = cmd
            probe = [sys.executable, "-c", "import sglang, torch; from harness.measure.environment import environment; "
                                           "print(sglang.MARK, environment(torch.device('cpu'))['sglang_commit'])"]
            seen["mark"] = real_run(probe, env=kwargs["env"], cwd=kwargs["cwd"], capture_output=True, text=True).stdout.strip()
            return wrote_out(cmd)
        return real_run(cmd, *args, **kwargs)

    stub_runs(monkeypatch, run)
    out = tmp_path / "r.json"
    code, _ = run_main(capsys, "--sglang-repo", str(repo), "--json", str(out), commit, "--", "--scenario", "b1-l500")
    assert code == 0 and seen["mark"] == f"{commit} {git(repo, 'rev-parse', commit)}"
    defaults = [x for s in sglang_gate.sglang_strategies() for x in ("--strategy", s)]
    private = seen["cmd"][5]  # the run writes a private file, which the gate checks and then copies to OUT
    assert seen["cmd"][4:] == ["--json", private, "--scenario", "b1-l500", *defaults] and private != os.path.abspath(out)
    assert not Path(private).exists() and json.loads(out.read_text())["rows"]


DESCRIBE = """import subprocess
def git(*a):
    return subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
print(git("describe", "--tags", "--exact-match", "--match", "v*") or git("describe", "--tags", "--long", "--match", "v*"))
"""
RUST_HOOK = """import os
from pathlib import Path
if os.environ.get("SGLANG_BUILD_RUST_EXTS", "").strip().lower() != "none":
    rust = Path(__file__).resolve().parent.parent / "rust" / "Cargo.toml"
    raise RuntimeError(f"cargo build of {rust} (crates.io: no network here)" if rust.is_file() else
                       f"no cargo workspace at {rust}; set SGLANG_BUILD_RUST_EXTS=none to build without Rust extensions")
"""
SCM_VERSION = """import subprocess
root = Path(__file__).resolve().parent.parent
if (root / ".git").exists():  # setuptools-scm: git_describe_command run at root, else fallback_version
    tag = subprocess.run(["python3", "scripts/get_version_tag.py"], cwd=root, capture_output=True, text=True).stdout.strip()
    version = tag.lstrip("v")
else:
    version = "0.0.0.dev0"
(Path(__file__).parent / "sglang" / "_version.py").write_text(f"__version__ = {version!r}\\n")
from setuptools import setup
setup(version=version)
"""


def sglang_built_like_sglang(tmp_path: Path, scm: bool) -> Path:
    """A git repo whose python/ project builds the way SGLang's does (python/pyproject.toml and setup.py since
    0.5.1x): a dynamic version from setuptools-scm (root "..", git_describe_command a script at the repo root,
    fallback_version "0.0.0.dev0" without .git, written to sglang/_version.py) and setup.py building the Rust
    extensions of ../rust unless SGLANG_BUILD_RUST_EXTS=none (as it does with setuptools-rust installed).
    Commits a and b are tagged v0.5.22 and v0.5.23. scm: the real setuptools-scm, else setup.py stands in for it."""
    repo = tmp_path / "sglang"
    (repo / "python" / "sglang").mkdir(parents=True)
    (repo / "rust").mkdir()
    (repo / "scripts").mkdir()
    (repo / "rust" / "Cargo.toml").write_text('[workspace]\nmembers = ["sglang-mm"]\n')
    (repo / "scripts" / "get_version_tag.py").write_text(DESCRIBE)
    (repo / "python" / "sglang" / "__init__.py").write_text("from sglang._version import __version__\n")
    (repo / "python" / ".gitignore").write_text("sglang/_version.py\nbuild/\n*.egg-info/\n")
    (repo / "python" / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61.0", "setuptools-rust>=1.10", "setuptools-scm>=8.0", "wheel"]\n'
        'build-backend = "setuptools.build_meta"\n[project]\nname = "sglang"\ndynamic = ["version"]\n'
        '[tool.setuptools.packages.find]\ninclude = ["sglang*"]\n'
        + ('[tool.setuptools_scm]\nroot = ".."\nversion_file = "sglang/_version.py"\n'
           'git_describe_command = ["python3", "scripts/get_version_tag.py"]\nfallback_version = "0.0.0.dev0"\n' if scm else ""))
    (repo / "python" / "setup.py").write_text(RUST_HOOK + ("from setuptools import setup\nsetup()\n" if scm else SCM_VERSION))
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for tag, version in (("a", "v0.5.22"), ("b", "v0.5.23")):
        (repo / "python" / "sglang" / "mark.py").write_text(f"MARK = {tag!r}\n")
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(repo), "commit", "-qm", tag], check=True, env=env)
        for name in (tag, version):
            subprocess.run(["git", "-C", str(repo), "tag", name], check=True)
    return repo


@pytest.mark.parametrize("scm", [False, pytest.param(True, id="setuptools-scm")])
@pytest.mark.parametrize("commit, version", [("a", "0.5.22"), ("b", "0.5.23")])
def test_a_commit_builds_as_sglang_builds_it(tmp_path, capsys, monkeypatch, scm, commit, version, wrote_out):
    """SGLang's real build (setuptools-scm version from the commit's tags, Rust extensions from ../rust): --json
    installs the commit with the version SGLang's own build gives it, not setuptools-scm's fallback 0.0.0.dev0 of
    a tree without .git, and without the Rust extensions (SGLANG_BUILD_RUST_EXTS=none), which would need cargo and
    crates.io, or fail outright where the tree lacks ../rust."""
    if scm:
        pytest.importorskip("setuptools_scm", reason="SGLang's build backend setuptools-scm is not installed here")
    monkeypatch.delenv("SGLANG_BUILD_RUST_EXTS", raising=False)
    repo = sglang_built_like_sglang(tmp_path, scm)
    seen, real_run = {}, subprocess.run

    def run(cmd, *args, **kwargs):
        if cmd[1:4] == ["-m", "harness", "run"]:
            probe = [sys.executable, "-c", "import sglang, sglang.mark; print(sglang.mark.MARK, sglang.__version__)"]
            seen["probe"] = real_run(probe, env=kwargs["env"], capture_output=True, text=True).stdout.strip()
            return wrote_out(cmd)
        return real_run(cmd, *args, **kwargs)

    stub_runs(monkeypatch, run)
    code = sglang_gate.main(["--sglang-repo", str(repo), "--json", str(tmp_path / "r.json"), commit])
    assert code == 0 and seen["probe"] == f"{commit} {version}", seen
    assert f"(sglang {version}); running" in capsys.readouterr().out
    assert not git(repo, "status", "--porcelain", "--ignored"), "the build ran in the user's checkout"


def test_the_asv_gate_builds_without_rust_extensions(tmp_path, capsys, monkeypatch, no_asv):
    """asv builds each commit in a clone of the checkout (../rust there): its install_command inherits the
    gate's environment, SGLANG_BUILD_RUST_EXTS=none unless you set it."""
    repo = fake_sglang(tmp_path)
    assert run_main(capsys, "--sglang-repo", str(repo), "--work", str(tmp_path / "w"), "a", "b")[0] == 0
    assert os.environ["SGLANG_BUILD_RUST_EXTS"] == "none"
    monkeypatch.setenv("SGLANG_BUILD_RUST_EXTS", "all")
    assert run_main(capsys, "--sglang-repo", str(repo), "--work", str(tmp_path / "w"), "a", "b")[0] == 0
    assert os.environ["SGLANG_BUILD_RUST_EXTS"] == "all"


def test_the_gates_benchmarks_are_the_harness_classes_plus_a_gating_verdict():
    """ci/asv_sglang_bench keeps every benchmark class of suites/asv under its name (the gate reads the
    metric from it) and adds Verdict, whose metric gates everywhere."""
    import inspect

    from ci.asv_gate import metric_of
    from ci.asv_sglang_bench import benchmarks as sgl_bench
    from harness.results.metrics import METRICS
    from suites.asv import benchmarks as harness_bench

    ours = {n for n, c in inspect.getmembers(sgl_bench, inspect.isclass) if not n.startswith("_") and c.__module__ == sgl_bench.__name__}
    theirs = {n for n, c in inspect.getmembers(harness_bench, inspect.isclass) if not n.startswith("_") and c.__module__ == harness_bench.__name__}
    assert ours == theirs | {"Verdict"}
    assert all(getattr(sgl_bench, n).setup_cache is sgl_bench._measure_and_check for n in ours)
    assert metric_of("benchmarks.Verdict.track_verdict('b32-l4096', 'sglang_flashinfer')") == "verdict"
    assert METRICS["verdict"].gates("cuda") and METRICS["verdict"].gates("cpu")


@pytest.mark.parametrize("before, after, code", [("0", "1", 1), ("0", "0", 0)])
def test_a_failing_verdict_fails_the_asv_gate(monkeypatch, before, after, code):
    """track_verdict 0 -> 1 (pass -> fail) as asv prints it is a regression of the gate; 0 -> 0 is its twin. An
    unsupported verdict is n/a, not 1: 1 is a failing head, which the gate fails whatever the base had
    (suites/test_asv_gate.py::test_a_verdict_that_does_not_pass_in_the_head_fails_whatever_the_base_had)."""
    from ci import asv_gate
    from ci.asv_sglang_bench import benchmarks as sgl_bench

    verdicts = {"pass": 0, "fail": 1, "error": 1}
    for status, value in verdicts.items():
        cache, verdict = json.dumps({"p": {"s": {"verdicts": {"x": status}}}}), sgl_bench.Verdict()
        verdict.setup(cache, "s", "x", "p")
        assert verdict.track_verdict(cache, "s", "x", "p") == value
    with pytest.raises(NotImplementedError, match="unsupported"):  # n/a (asv: NaN, raised by setup), as its timings: not a fail at both commits
        sgl_bench.Verdict().setup(json.dumps({"p": {"s": {"verdicts": {"x": "unsupported"}}}}), "s", "x", "p")
    mark = "+" if after != before else " "
    table = ("| Change | Before | After | Ratio | Benchmark (Parameter) |\n|---|---|---|---|---|\n"
             f"| {mark} | {before} | {after} | n/a | benchmarks.Verdict.track_verdict('b32-l4096', 'sglang_flashinfer') |\n")
    summary = "PERFORMANCE DECREASED." if code else "BENCHMARKS NOT SIGNIFICANTLY CHANGED."
    assert asv_gate.classify(code, table + summary + "\n").code == code


@pytest.mark.parametrize("requested", [["sglang_flashinfer", "sglang_fa3"], ["stock", "sglang_flashinfer", "sglang_fa3"]])
def test_nothing_checked_fails_the_benchmarks_setup(monkeypatch, requested):
    """Every SGLang-backed strategy unsupported (the commit's SGLang does not import) is a failed setup_cache (the
    asv gate's exit 2), never an unchanged verdict, by the --json mode's rule (sglang_gate.unchecked): also with stock
    in a hand-set MLA_ASV_STRATEGIES (before: its pass alone passed setup, gating no SGLang code). One SGLang-backed
    strategy that ran is its twin and passes through."""
    from ci.asv_sglang_bench import benchmarks as sgl_bench

    monkeypatch.setattr(sgl_bench.harness_bench, "STRATEGIES", requested)
    unsupported = {"stock": ("pass", ""), "sglang_flashinfer": ("unsupported", "no sglang"), "sglang_fa3": ("unsupported", "no adapter")}
    with pytest.raises(RuntimeError, match="^b32-l4096: nothing requested could be checked: no SGLang-backed strategy ran: "
                                           "sglang_flashinfer unsupported: no sglang; sglang_fa3 unsupported: no adapter$"):
        sgl_bench.checked(unsupported, "b32-l4096")
    ran = {**unsupported, "sglang_flashinfer": ("fail", "outputs differ")}
    assert sgl_bench.checked(ran, "b32-l4096") == {"stock": "pass", "sglang_flashinfer": "fail", "sglang_fa3": "unsupported"}


def test_a_commit_of_a_shallow_checkout_on_a_remote_branch_is_checked_out(tmp_path, capsys, monkeypatch, wrote_out):
    """A CI-style shallow checkout (depth 1, no tags) whose COMMIT is only on a remote-tracking branch: git archive
    in the checkout had it; the shared clone must check it out too (a shallow source is cloned by fetching its
    branches and tags, without shared objects). pip is stubbed: what it is handed is the commit's tree."""
    upstream = sglang_built_like_sglang(tmp_path, scm=False)
    subprocess.run(["git", "-C", str(upstream), "branch", "old", "a"], check=True)
    user = tmp_path / "user"
    subprocess.run(["git", "clone", "-q", "--depth", "1", "--no-single-branch", "--no-tags", f"file://{upstream}", str(user)],
                   check=True)
    seen, real_run = {}, subprocess.run

    def run(cmd, *args, **kwargs):
        if "--target" in cmd:
            seen["mark"] = (Path(cmd[-1]) / "sglang" / "mark.py").read_text()
            return subprocess.CompletedProcess(cmd, 0)
        if cmd[1:4] == ["-m", "harness", "run"]:
            return wrote_out(cmd)
        return real_run(cmd, *args, **kwargs)

    stub_runs(monkeypatch, run)
    code = sglang_gate.main(["--sglang-repo", str(user), "--json", str(tmp_path / "r.json"), "origin/old"])
    assert code == 0 and seen.get("mark") == "MARK = 'a'\n", seen


@pytest.mark.parametrize("step", ["clone", "fetch", "checkout"])
def test_a_git_step_that_fails_is_one_line_naming_it(tmp_path, capsys, monkeypatch, step):
    """Each git step of the install (clone, fetch, checkout) that fails is bad input naming that step, exit 2,
    before pip or the harness run."""
    repo = sglang_built_like_sglang(tmp_path, scm=False)
    real_run = subprocess.run

    def run(cmd, *args, **kwargs):
        if cmd[0] == "git" and step in cmd:
            return subprocess.CompletedProcess(cmd, 128)
        assert "--target" not in cmd and cmd[1:4] != ["-m", "harness", "run"], "ran past a failed git step"
        return real_run(cmd, *args, **kwargs)

    stub_runs(monkeypatch, run)
    code = sglang_gate.main(["--sglang-repo", str(repo), "--json", str(tmp_path / "r.json"), "a"])
    err = capsys.readouterr().err
    assert code == 2 and f": git {step} of {repo} failed; nothing was run" in err, err


# audit (suites/test_mutations_gate.py, "audit-" pins): what the gate hands on and hands back


@pytest.mark.parametrize("code", [0, 1, 2])
def test_the_asv_gates_exit_status_is_the_gates(tmp_path, capsys, no_asv, monkeypatch, code):
    """A regression (1) or a failure (2) of the asv gate is the SGLang gate's exit status, never swallowed."""
    from ci import asv_gate

    monkeypatch.setattr(asv_gate, "main", lambda argv: no_asv["gate"].append(argv) or code)
    got, _ = run_main(capsys, "--sglang-repo", str(fake_sglang(tmp_path)), "--work", str(tmp_path / "work"), "a", "b")
    assert got == code and len(no_asv["gate"]) == 1


def test_the_users_factor_and_bench_reach_the_asv_gate(tmp_path, capsys, no_asv):
    repo = fake_sglang(tmp_path)
    code, _ = run_main(capsys, "--sglang-repo", str(repo), "--work", str(tmp_path / "work"), "--factor", "1.10",
                       "--bench", "CastUs", "a", "b")
    (argv,) = no_asv["gate"]
    assert code == 0 and argv[2:6] == ["--factor", "1.1", "--bench", "CastUs"]


def test_base_and_head_with_the_project_in_other_folders_is_bad_input(tmp_path, capsys, no_asv):
    repo = fake_sglang(tmp_path)
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    for name in ("pyproject.toml", "sglang"):
        git(repo, "mv", f"python/{name}", name)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "root"], check=True, env=env)
    git(repo, "tag", "root")
    code, lines = run_main(capsys, "--sglang-repo", str(repo), "--work", str(tmp_path / "work"), "a", "root")
    assert code == 2 and len(lines) == 1 and "different folders" in lines[0] and no_asv["gate"] == []
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "root2"], check=True, env=env)
    code, _ = run_main(capsys, "--sglang-repo", str(repo), "--work", str(tmp_path / "work2"), "root", "HEAD")  # twin
    assert code == 0 and len(no_asv["gate"]) == 1


@pytest.mark.parametrize("out", ["file", "stream"])
@pytest.mark.parametrize("status, writes, want", [(0, "ran", 0), (3, "{}", 3), (0, None, 1), (0, "unsupported", 2)])
def test_json_mode_exits_with_harness_runs_status(tmp_path, capsys, monkeypatch, sglang_results, status, writes, want, out):
    """A `harness run` that failed (its results file half written or absent) is the --json mode's exit status; one that
    exited 0 without writing OUT (an SGLang whose import called sys.exit(0) ended it early) fails, exit 1. One that
    passed with every SGLang-backed strategy unsupported (a dependency the user's patch imports is missing: the
    harness's own stock passed alone) checked none of the commit's SGLang: exit 2, the reason named. OUT a stream
    (/dev/null here, /dev/stdout piped on) alike: before, its results passed through unread and both exited 0."""
    repo = fake_sglang(tmp_path)
    real_run = subprocess.run

    def run(cmd, *args, **kwargs):
        if cmd[1:4] == ["-m", "harness", "run"]:
            if writes:
                Path(cmd[cmd.index("--json") + 1]).write_text(sglang_results.get(writes, writes))
            return subprocess.CompletedProcess(cmd, status)
        return real_run(cmd, *args, **kwargs)

    stub_runs(monkeypatch, run)
    code, lines = run_main(capsys, "--sglang-repo", str(repo), "--json", str(tmp_path / "r.json") if out == "file" else "/dev/null", "a")
    assert code == want
    assert any("exited 0 without writing" in line for line in lines) == (want == 1)
    unchecked = [line for line in lines if "no SGLang-backed strategy ran: sglang_flashinfer unsupported: " in line]
    assert len(unchecked) == (want == 2) and all(line.startswith("sglang-gate: FAILURE: ") for line in unchecked), lines


def test_an_endless_asv_config_in_work_is_refused_without_reading_it(tmp_path):
    """--work holding an asv.conf.json that is a device or endless (a link to /dev/zero): refused as not the gate's after
    reading at most its mark (before: read whole, a memory kill), in a child under a 2 GiB address-space cap so that a
    regression fails here instead of exhausting the machine; the user's link is kept."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "asv.conf.json").symlink_to("/dev/zero")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "from pathlib import Path; from ci import sglang_gate\n"
            "try:\n    sglang_gate.write_config(Path(sys.argv[1]), 'python', Path(sys.argv[2]))\n"
            "except sglang_gate.BadInput as exc:\n    print(exc); sys.exit(2)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(work)], capture_output=True, text=True, timeout=HANG_GUARD_S,
                          cwd=Path(sglang_gate.__file__).resolve().parents[1])
    assert proc.returncode == 2 and "is not the gate's" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert os.readlink(work / "asv.conf.json") == "/dev/zero"


# interruption and the --json path (a stand-in `harness run` in a real gate process)

FAKE_RUN = """import os, sys, time
from pathlib import Path
from harness.errors import interruptible
@interruptible
def main():
    print("the run's console")
    Path(os.environ["MARK"]).write_text(str(os.getpid()))
    time.sleep(float(os.environ["SLEEP"]))
    Path(sys.argv[sys.argv.index("--json") + 1]).write_text(os.environ["OUT_TEXT"])
    return 0
sys.exit(main())
"""
GATE = f"""import sys
from ci import sglang_gate
real = sglang_gate.run_harness
sglang_gate.run_harness = lambda cmd, **kwargs: real([sys.executable, "-c", {FAKE_RUN!r}, *cmd[4:]], **kwargs)
sys.exit(sglang_gate.main(sys.argv[1:]))
"""


def start_gate(tmp_path: Path, out: str, sleep: float, text: str = '{"ok": 1}', **kwargs) -> subprocess.Popen:
    """`python -m ci.sglang_gate --json OUT a` on a fake SGLang, its `harness run` a stand-in that writes its pid to
    tmp_path/mark, sleeps `sleep` seconds, then writes `text` to OUT (interruptible as the harness's main is)."""
    env = dict(os.environ, MARK=str(tmp_path / "mark"), SLEEP=str(sleep), OUT_TEXT=text, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", GATE, "--sglang-repo", str(fake_sglang(tmp_path)), "--json", out, "a"], cwd=ROOT,
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def gates_copy(written: str, ran: str, out) -> bool:
    """Whether `written` (OUT) is the child's results `ran` with its repro the gate's own, writing OUT again."""
    written, ran = json.loads(written), json.loads(ran)
    repro = shlex.split(written.pop("repro").split(" && ", 1)[1])
    ran.pop("repro")
    return written == ran and "ci.sglang_gate" in repro and repro[repro.index("--json") + 1] == os.path.abspath(out)


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c", None])
def test_an_interrupted_json_run_stops_its_harness_run_and_exits_130(tmp_path, sglang_results, how):
    """A cancelled job's SIGTERM to the gate (passed on to `harness run`) or Ctrl-C to the process group: exit 130, one
    'interrupted' line, the child stopped and waited for (before: 143 and an orphan that wrote OUT later, or a
    traceback), the temporary install removed, OUT not written. Twin: uninterrupted, the same run writes OUT, exit 0."""
    out = tmp_path / "r.json"
    proc = start_gate(tmp_path, str(out), 60 if how else 0, sglang_results["ran"], start_new_session=True)
    try:
        stdout, stderr = interrupt_when_marked(proc, tmp_path / "mark", how)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    site = Path(re.search(r"installed in (\S+) ", stdout).group(1))
    assert not site.parent.exists(), "the temporary install was left behind"
    if not how:
        assert proc.returncode == 0 and gates_copy(out.read_text(), sglang_results["ran"], out), stderr
        return
    child = int((tmp_path / "mark").read_text())
    with pytest.raises(ProcessLookupError):  # stopped, and reaped by the gate
        os.kill(child, 0)
    assert proc.returncode == 130 and stderr.splitlines() == ["interrupted"], (proc.returncode, stderr)
    assert not out.exists()


FAKE_PIP = """import os, tempfile, time
from pathlib import Path
Path(os.environ["PIP_MARK"]).write_text(tempfile.mkdtemp(prefix="pip-"))  # as pip makes its build and unpack folders
time.sleep(60)
"""


def test_an_interrupted_install_leaves_no_pip_temporary_folder(tmp_path):
    """SIGTERM during the install: pip (a stand-in first on PYTHONPATH that makes a pip-* folder, as pip does, and waits) is
    killed, and its folder, made in the gate's temporary folder (TMPDIR), goes with it (before: left in the runner's
    $TMPDIR). The gate's own $TMPDIR is left empty, exit 130."""
    fake, system = tmp_path / "fake" / "pip", tmp_path / "tmp"
    fake.mkdir(parents=True)
    system.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(FAKE_PIP)
    mark = tmp_path / "mark"
    env = dict(os.environ, PIP_MARK=str(mark), TMPDIR=str(system), PYTHONPATH=os.pathsep.join([str(fake.parent), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-m", "ci.sglang_gate", "--sglang-repo", str(fake_sglang(tmp_path)), "--json",
                             str(tmp_path / "r.json"), "a"], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while not (mark.exists() and mark.read_text()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    made = Path(mark.read_text())
    assert made.name.startswith("pip-") and made.parent.parent.name.startswith("sglang-gate-"), made
    assert proc.returncode == 130 and stderr.splitlines() == ["interrupted"], (proc.returncode, stderr)
    assert list(system.iterdir()) == [], "left in $TMPDIR"


@pytest.mark.parametrize("writes, want", [("ran", 0), ("unsupported", 2)])
def test_json_to_stdout_is_the_results_alone_and_checked(tmp_path, sglang_results, writes, want):
    """--json /dev/stdout with stdout a pipe: the results alone go there, as `harness run --json /dev/stdout` streams them
    (the gate's own line and the run's console go to stderr), and they are checked as a file's are: a run that checked
    none of the commit's SGLang exits 2 with its FAILURE line (before: the stream was passed through unread, exit 0;
    earlier still, resolved to /proc/<pid>/fd/pipe:[N], which the child cannot open). The file's twin is
    test_json_mode_exits_with_harness_runs_status."""
    proc = start_gate(tmp_path, "/dev/stdout", 0, sglang_results[writes])
    stdout, stderr = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == want and gates_copy(stdout, sglang_results[writes], "/dev/stdout"), stdout + stderr
    assert "running -m harness run --json " in stderr and "the run's console" in stderr
    assert ("sglang-gate: FAILURE: /dev/stdout: a (" in stderr) is (want == 2), stderr


@pytest.mark.parametrize("case", ["golden-folder", "golden-file", "golden-dir-option", "scenario-file", "data-file", "dump",
                                  "free"])
def test_an_out_harness_run_would_refuse_is_refused_before_the_install(tmp_path, capsys, monkeypatch, case, wrote_out,
                                                                               sglang_results):
    """--json into a golden folder, over a golden file, the --scenario-file, a harness data file or one of the run's dumps
    (even with --force after --) is refused as `harness run --json` refuses it, one line and exit 2, before the clone and
    pip install (before: only by the child, after them; the child now writes a private file, so this is OUT's only
    check). Twin: a free path goes on to the install and the run."""
    repo = fake_sglang(tmp_path)
    (tmp_path / "mine").mkdir()
    scenario = tmp_path / "s.toml"
    scenario.write_text("x")
    golden_file = next(p for p in (ROOT / "golden").rglob("*") if p.is_file())
    out, extra = {
        "golden-folder": (ROOT / "golden" / "x.json", []),
        "golden-file": (golden_file, ["--force"]),
        "golden-dir-option": (tmp_path / "mine" / "x.json", ["--golden-dir", str(tmp_path / "mine")]),
        "scenario-file": (scenario, ["--force", "--scenario-file", str(scenario)]),
        "data-file": (next((ROOT / "harness").rglob("*.toml")), ["--force"]),
        "dump": (tmp_path / "d" / "glm5-tp8.ci.b1-l500.stock.safetensors", ["--force", "--dump-outputs", str(tmp_path / "d")]),
        "free": (tmp_path / "x.json", ["--golden-dir", str(tmp_path / "mine")]),
    }[case]
    ran, real_run = [], subprocess.run

    def run(cmd, *args, **kwargs):
        ran.append(cmd)
        if cmd[1:4] == ["-m", "harness", "run"]:  # the stand-in writes only the twin's free path, never the checkout's files
            return wrote_out(cmd) if case == "free" else subprocess.CompletedProcess(cmd, 0)
        return real_run(cmd, *args, **kwargs)

    stub_runs(monkeypatch, run)
    before = out.read_bytes() if out.exists() else None
    code, lines = run_main(capsys, "--sglang-repo", str(repo), "--json", str(out), "a", "--", *extra)
    if case == "free":
        assert code == 0 and any("clone" in cmd for cmd in ran) and gates_copy(out.read_text(), sglang_results["ran"], out)
        return
    assert code == 2 and len(lines) == 1 and lines[0].startswith("sglang-gate: --json: ") and str(out) in lines[0], lines
    assert not any("clone" in cmd or "--target" in cmd for cmd in ran) and (out.read_bytes() if out.exists() else None) == before


def test_json_mode_paths_after_the_dashes_name_the_users_files(tmp_path, capsys, monkeypatch):
    """`-- --scenario-file=S --dump-outputs D` and MLA_HARNESS_GOLDEN_DIR relative to the user's folder: the real
    `harness run` child (it runs in the harness checkout) reads that scenario, checks against that golden folder and
    writes its dumps there (before: looked up in the checkout: not found, or another workload, and dumps written there)."""
    repo = fake_sglang(tmp_path)
    user = tmp_path / "user"
    (user / "gold").mkdir(parents=True)
    (user / "gold" / "cases.toml").write_text('[[case]]\npreset = "glm5-tp8"\nscale = "ci"\nscenario = "b1-l500"\n')  # not this case: live
    (user / "mysc.toml").write_text('name = "mine"\ndescription = "the user\'s"\nseed = 5\nsteps = 1\nkv_lens = [40, 7]\n')
    monkeypatch.chdir(user)
    monkeypatch.setenv("MLA_HARNESS_GOLDEN_DIR", "gold")
    child, real_run = [], subprocess.run

    def run(cmd, *args, **kwargs):
        if cmd[1:4] != ["-m", "harness", "run"]:
            return real_run(cmd, *args, **kwargs)
        child.append(proc := real_run(cmd, *args, capture_output=True, text=True, timeout=HANG_GUARD_S, **kwargs))
        return proc

    stub_runs(monkeypatch, run)
    monkeypatch.setattr(sglang_gate, "unchecked_sglang", lambda path: None)  # no SGLang here: the paths are what this checks
    code, _ = run_main(capsys, "--sglang-repo", str(repo), "--json", "r.json", "a", "--", "--scenario-file=mysc.toml", "--dump-outputs",
                       "dumps", "--device", "cpu", "--strategy", "gather_cast", "--repeats", "0", "--slots", "4096", "--layers", "1")
    assert code == 0, child[0].stdout[-2000:] + child[0].stderr[-2000:]
    results = json.loads((user / "r.json").read_text())
    assert results["case"]["scenario"] == "mine" and f"MLA_HARNESS_GOLDEN_DIR={user / 'gold'}" in results["repro"]
    # the repro is this gate's, on the commit's full hash, writing OUT again: not the child's private file and install
    repro = shlex.split(results["repro"].split(" && ", 1)[1])
    assert repro[repro.index("-m") + 1] == "ci.sglang_gate" and "results.json" not in results["repro"]
    assert repro[repro.index("--json") + 1] == str(user / "r.json") and repro[repro.index("--") - 1] == sglang_gate.resolve(repo, "COMMIT", "a")
    assert f"--scenario-file={user / 'mysc.toml'}" in repro
    assert sorted(p.name for p in (user / "dumps").iterdir()) == [f"glm5-tp8.ci.mine.{s}.safetensors" for s in ("gather_cast", "stock")]
    assert not (ROOT / "dumps").exists()


def test_sglang_in_a_folder_of_a_larger_repository_is_found_there(tmp_path, capsys, no_asv):
    """--sglang-repo naming SGLang's folder inside a larger repository (a monorepo's vendor/sglang): the gate used the
    repository's top and found no project there. The project is now looked for under the folder given first; a folder
    without it is one line naming where it looked (the twin), and a folder of SGLang's own checkout still finds its
    python/."""
    repo = fake_sglang(tmp_path, subdir="vendor/sglang/python")
    (repo / "vendor" / "other").mkdir()
    assert run_main(capsys, "--sglang-repo", str(repo / "vendor" / "sglang"), "--work", str(tmp_path / "w"), "a", "b")[0] == 0
    conf = json5.loads((tmp_path / "w" / "asv.conf.json").read_text())
    assert conf["repo"] == str(repo.resolve()) and conf["repo_subdir"] == "vendor/sglang/python"
    code, lines = run_main(capsys, "--sglang-repo", str(repo / "vendor" / "other"), "--work", str(tmp_path / "w2"), "a", "b")
    assert code == 2 and lines == [f"sglang-gate: 'a' in {repo.resolve()}: no SGLang project (pyproject.toml beside sglang/) "
                                   "at vendor/other/python/, vendor/other/, python/ or the root"], lines
    sglang = fake_sglang(tmp_path / "plain-layout")
    assert run_main(capsys, "--sglang-repo", str(sglang / "python" / "sglang"), "--work", str(tmp_path / "w3"), "a", "b")[0] == 0
    assert json5.loads((tmp_path / "w3" / "asv.conf.json").read_text())["repo_subdir"] == "python"
