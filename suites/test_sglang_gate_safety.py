"""ci/sglang_gate.py and the user's files: the SGLang checkout is only read (no output of the gate, --json, the
run's --dump-outputs or --work, lies inside it, its .git and a worktree's git folder included), a --work folder of
yours is never written into nor through a link, and bad input is one line and exit 2 before anything is written or
built (a --bench that is no regex, BASE and HEAD one commit, a gate option with --json, a usage error). On a fake
SGLang checkout with an uncommitted change and an untracked file; git runs for real, pip, `harness run` and asv are
stood in for."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ci import asv_gate, sglang_gate
from suites.test_sglang_gate import ROOT, fake_sglang, git


@pytest.fixture
def users(tmp_path) -> Path:
    """The user's SGLang checkout, work in progress: a tracked file changed, an untracked one, a branch."""
    repo = fake_sglang(tmp_path)
    (repo / "python" / "pyproject.toml").write_text((repo / "python" / "pyproject.toml").read_text() + "# mine\n")
    (repo / "notes.txt").write_text("my notes\n")
    git(repo, "branch", "my-fix", "a")
    return repo


def snapshot(repo: Path) -> dict[str, bytes | str | None]:
    """Every file (its bytes), link (its target) and folder of the checkout, .git included: its whole state."""
    return {str(p.relative_to(repo)): os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None
            for p in sorted(repo.rglob("*"))}


@pytest.fixture
def ran(monkeypatch, tmp_path_factory) -> list[list[str]]:
    """The commands the gate ran beside git (which runs): `asv machine`, pip and `harness run` (its --json written) succeed
    unrun, the asv gate returns 0; HOME is a temporary folder, the gate's environment and folder changes undone."""
    calls, real_run = [], subprocess.run

    def run(cmd, *args, **kwargs):
        if cmd[0] == "git":
            return real_run(cmd, *args, **kwargs)
        calls.append(cmd)
        if cmd[1:4] == ["-m", "harness", "run"]:
            Path(cmd[cmd.index("--json") + 1]).write_text("{}")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(sglang_gate.subprocess, "run", run)
    monkeypatch.setattr(sglang_gate, "run_harness", lambda cmd, **kwargs: run(cmd).returncode)
    monkeypatch.setattr(sglang_gate, "unchecked_sglang", lambda path: None)
    monkeypatch.setattr(asv_gate, "main", lambda argv: calls.append(["asv-gate", *argv]) or 0)
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    for name in ("MLA_ASV_STRATEGIES", "MLA_ASV_SCENARIOS", *sglang_gate.BUILD_ENV):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    monkeypatch.chdir(ROOT)
    return calls


def gate(capsys, *argv: str) -> tuple[int, list[str]]:
    """The gate's exit status (argparse's too) and its stderr lines."""
    try:
        code = sglang_gate.main(list(argv))
    except SystemExit as exc:
        code = exc.code
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("case", ["tracked-file", "new-file", "git-folder", "dump-outputs", "worktree-git-folder", "beside"])
def test_json_and_dumps_inside_the_sglang_checkout_are_refused(tmp_path, capsys, users, ran, case):
    """--json over a tracked file (--force), a new file in the work tree, a file in .git (the config, --force), the run's
    --dump-outputs folder in the checkout, or, for a worktree, a file in its repository's git folder: one line, exit 2,
    nothing cloned or run, the checkout byte for byte as it was (before: the results replaced the user's tracked file,
    or were written into the checkout). Twin: OUT beside the checkout goes on to the run."""
    repo = users
    if case == "worktree-git-folder":
        git(repo, "worktree", "add", "-q", str(tmp_path / "wt"), "b")
    target, out, extra = {
        "tracked-file": (repo, repo / "python" / "pyproject.toml", ["--force"]),
        "new-file": (repo, repo / "base.json", []),
        "git-folder": (repo, repo / ".git" / "config", ["--force"]),
        "dump-outputs": (repo, tmp_path / "r.json", ["--dump-outputs", str(repo / "dumps")]),
        "worktree-git-folder": (tmp_path / "wt", repo / ".git" / "r.json", []),
        "beside": (repo, tmp_path / "r.json", []),
    }[case]
    before = snapshot(repo)
    code, lines = gate(capsys, "--sglang-repo", str(target), "--json", str(out), "a", "--", *extra)
    assert snapshot(repo) == before, "the gate changed the user's checkout"
    if case == "beside":
        assert code == 0 and out.read_text().startswith("{") and any("--target" in cmd for cmd in ran), lines
        return
    assert code == 2 and len(lines) == 1 and "lies inside your SGLang checkout" in lines[0], lines
    assert lines[0].startswith("sglang-gate: --dump-outputs: " if case == "dump-outputs" else "sglang-gate: --json: "), lines
    assert ran == [], "the gate installed or ran before refusing"


@pytest.mark.parametrize("case", ["checkout", "inside-checkout", "git-folder", "golden-folder"])
def test_a_work_folder_in_the_checkout_or_the_goldens_is_refused(tmp_path, capsys, monkeypatch, users, ran, case):
    """--work the checkout itself, a folder in it, in its .git, or in the golden folder (MLA_HARNESS_GOLDEN_DIR): one line,
    exit 2, asv never run, nothing written there (before: asv.conf.json, env/ and results/ went into the user's work tree,
    or into the goldens)."""
    gold = tmp_path / "gold"
    gold.mkdir()
    monkeypatch.setenv("MLA_HARNESS_GOLDEN_DIR", str(gold))
    work = {"checkout": users, "inside-checkout": users / "bench", "git-folder": users / ".git" / "asv",
            "golden-folder": gold / "asv"}[case]
    before = snapshot(users)
    code, lines = gate(capsys, "--sglang-repo", str(users), "--work", str(work), "a", "b")
    assert code == 2 and len(lines) == 1 and lines[0].startswith("sglang-gate: --work: "), lines
    assert ("golden folder" if case == "golden-folder" else "lies inside your SGLang checkout") in lines[0], lines
    assert snapshot(users) == before and list(gold.iterdir()) == [] and ran == []


@pytest.mark.parametrize("case", ["yours", "new", "empty", "the-gates"])
def test_a_work_folder_holding_your_files_is_refused(tmp_path, capsys, users, ran, case):
    """A --work folder that holds files and is not the gate's (no asv.conf.json of its own): one line, exit 2, your files
    kept (before: asv wrote its results there, replacing a results/benchmarks.json of yours). Twins: a new folder, an
    empty one and one the gate made (its configuration there) go on to asv."""
    work = tmp_path / "work"
    if case == "yours":
        (work / "results").mkdir(parents=True)
        (work / "results" / "benchmarks.json").write_text('{"mine": 1}')
    elif case != "new":
        work.mkdir()
    if case == "the-gates":
        sglang_gate.write_config(users, "python", work)
    code, lines = gate(capsys, "--sglang-repo", str(users), "--work", str(work), "a", "b")
    if case != "yours":
        assert code == 0 and lines == [] and ran[-1][0] == "asv-gate" and (work / "asv.conf.json").exists(), lines
        return
    assert code == 2 and len(lines) == 1 and "holds files and is not the gate's" in lines[0], lines
    assert sorted(p.name for p in work.rglob("*")) == ["benchmarks.json", "results"] and ran == []
    assert (work / "results" / "benchmarks.json").read_text() == '{"mine": 1}'


@pytest.mark.parametrize("name", ["asv.conf.json", "results", "env"])
def test_a_link_where_the_gate_writes_in_work_is_refused(tmp_path, capsys, users, ran, name):
    """In the gate's --work folder, a link at its asv.conf.json (to another gate folder's) or at asv's results/ or env/:
    one line, exit 2, nothing written through it (before: the other folder's configuration was rewritten through the
    link to point at this one, or asv went on to write where the link leads)."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    sglang_gate.write_config(users, "python", work)
    sglang_gate.write_config(users, "python", elsewhere)
    if name == "asv.conf.json":
        (work / name).unlink()
    (work / name).symlink_to(elsewhere / name if name == "asv.conf.json" else elsewhere)
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    code, lines = gate(capsys, "--sglang-repo", str(users), "--work", str(work), "a", "b")
    assert code == 2 and len(lines) == 1 and f"{work / name} is a link" in lines[0], lines
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before and ran == []


def test_a_bench_that_is_no_regex_is_refused_before_anything_runs(tmp_path, capsys, users, ran):
    """--bench '(' is one line naming --bench, exit 2, before the configuration or asv (before: asv built both commits'
    environments, then crashed with a traceback on the regex). Twin: a regex goes on to the asv gate."""
    code, lines = gate(capsys, "--sglang-repo", str(users), "--work", str(tmp_path / "w"), "--bench", "(", "a", "b")
    assert code == 2 and len(lines) == 1 and lines[0].startswith("sglang-gate: argument --bench: '(' is not a regular"), lines
    assert ran == [] and not (tmp_path / "w").exists()
    code, _ = gate(capsys, "--sglang-repo", str(users), "--work", str(tmp_path / "w"), "--bench", "Verdict|CastUs", "a", "b")
    assert code == 0 and ran[-1][ran[-1].index("--bench") + 1] == "Verdict|CastUs"


def test_base_and_head_one_commit_is_refused_before_anything_is_written(tmp_path, capsys, users, ran):
    """BASE and HEAD naming one commit (a tag and a branch on it): one line, exit 2, no configuration and no asv machine
    file written (before: both were written, then ci.asv_gate refused it on stdout after the gate's own lines)."""
    code, lines = gate(capsys, "--sglang-repo", str(users), "--work", str(tmp_path / "w"), "a", "my-fix")
    assert code == 2 and len(lines) == 1 and "HEAD 'my-fix' is the same commit as BASE 'a'" in lines[0], lines
    assert ran == [] and not (tmp_path / "w").exists()


@pytest.mark.parametrize("option", [["--work", "w"], ["--bench", "Verdict"], ["--machine", "m"], ["--factor", "1.1"]])
def test_a_gate_option_with_json_is_refused(tmp_path, capsys, users, ran, option):
    """--work, --bench, --machine or --factor with --json (which times nothing with asv): one line naming it, exit 2, before
    the install (before: silently ignored, the run went on)."""
    code, lines = gate(capsys, "--sglang-repo", str(users), "--json", str(tmp_path / "r.json"), *option, "a")
    assert code == 2 and lines == [f"sglang-gate: {option[0]} is an option of the gate (BASE HEAD), not of --json"], lines
    assert ran == [] and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("argv", [["--json", "r.json", "a", "b"], ["a"], ["--no-such-option", "a", "b"]])
def test_a_usage_error_is_one_line_and_exit_2(tmp_path, capsys, users, ran, argv):
    """A wrong number of commits or an unknown option: one `sglang-gate:` line, exit 2 (before: argparse's usage first)."""
    code, lines = gate(capsys, "--sglang-repo", str(users), *argv)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("sglang-gate: "), lines
    assert ran == []
