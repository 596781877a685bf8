"""ci/asv_gate.py against real `asv continuous` runs (asv 0.6.x) on a throwaway git project.

The project's `track_` benchmarks (values, not timings) regress deterministically and are
judged by the factor alone; `time_sleep` (20 ms, 40 ms on the `slow` branch, with a +-1% jitter, on a
clock the benchmark advances: the same samples on any machine under any load, so the unchanged head's
verdict cannot depend on how busy the CI machine is) has recorded samples, so asv judges it by its
Mann-Whitney test first. Its asv environment is a virtualenv built offline:
a tiny asv plugin copies asv_runner in instead of pip-installing it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from ci import asv_gate
from harness import datafiles
from harness.errors import HarnessError
from suites.hang_guard import HANG_GUARD_S
from suites.helpers import interrupt_when_marked
from suites.workflow_files import GIT_ENV

pytest.importorskip("asv")
pytest.importorskip("virtualenv")

REPO = Path(__file__).resolve().parents[1]

SPEED = "VALUE = 100\nSLEEP = 0.02\nFAIL = False\n"
BENCH = '''import itertools

import speed

_now = [0.0]
_ticks = itertools.count()


def time_sleep():
    _now[0] += speed.SLEEP * (1 + 0.01 * (next(_ticks) % 3 - 1))


time_sleep.timer = lambda: _now[0]
time_sleep.number = 1
time_sleep.repeat = 10
time_sleep.warmup_time = 0


def track_value():
    return speed.VALUE


def track_param(n):
    if speed.FAIL and n == 2:
        raise RuntimeError("planted failure")
    return n


track_param.params = [1, 2, 3]
'''
OFFLINE_ENV = '''import os
import shutil

import asv_runner
from asv.plugins.virtualenv import Virtualenv


class OfflineVirtualenv(Virtualenv):
    """A virtualenv that gets asv_runner by copying, not from an index."""

    tool_name = "offline-virtualenv"

    def _install_requirements(self):
        purelib = self.run(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
        shutil.copytree(os.path.dirname(asv_runner.__file__), os.path.join(purelib, "asv_runner"))
'''
CONF = {
    "version": 1,
    "project": "speed",
    "repo": ".",
    "branches": ["main"],
    "environment_type": "offline-virtualenv",
    "plugins": [".offline_env"],
    "pythons": [f"{sys.version_info.major}.{sys.version_info.minor}"],
    "build_command": [],
    "install_command": [
        "python -c \"import shutil, sysconfig; shutil.copy('{build_dir}/speed.py', sysconfig.get_paths()['purelib'])\""
    ],
    "uninstall_command": [],
    "benchmark_dir": "benchmarks",
    "env_dir": ".asv/env",
    "results_dir": ".asv/results",
    "html_dir": ".asv/html",
}
MACHINE = "gate-test"




def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env={**os.environ, **GIT_ENV}, timeout=HANG_GUARD_S)


def _make_project(root: Path) -> Path:
    """A git project: `base`, and branches `slow` (track_value 100 -> 150), `same`, `broken` (a benchmark raises),
    `unbuildable` (speed.py gone: asv cannot install the commit)."""
    root.mkdir()
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "__init__.py").write_text("")
    (root / "benchmarks" / "bench.py").write_text(BENCH)
    (root / "offline_env.py").write_text(OFFLINE_ENV)
    (root / "asv.conf.json").write_text(json.dumps(CONF))
    (root / "speed.py").write_text(SPEED)
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base")
    _git(root, "tag", "base")
    for branch, speed in [("slow", "VALUE = 150\nSLEEP = 0.04\nFAIL = False\n"),
                          ("same", SPEED + "# comment\n"), ("broken", "VALUE = 100\nSLEEP = 0.02\nFAIL = True\n")]:
        _git(root, "checkout", "-q", "-b", branch, "base")
        (root / "speed.py").write_text(speed)
        _git(root, "commit", "-qam", branch)
    _git(root, "checkout", "-q", "-b", "unbuildable", "base")
    _git(root, "rm", "-q", "speed.py")
    _git(root, "commit", "-qm", "unbuildable")
    _git(root, "checkout", "-q", "main")
    return root


def _run_gate_on_each_head(root: Path) -> dict[str, list]:
    root.mkdir()
    project = _make_project(root / "project")
    home = root / "home"  # asv keeps its machine file in $HOME
    home.mkdir()
    results = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.setenv("PIP_NO_INDEX", "1")
        # speed.py is the same size on every branch and is reinstalled within a second: a cached
        # .pyc of the previous commit's copy would pass for the new one (mtime and size match)
        mp.setenv("PYTHONDONTWRITEBYTECODE", "1")
        subprocess.run([sys.executable, "-m", "asv", "machine", "--yes", "--machine", MACHINE],
                       cwd=project, check=True, capture_output=True, timeout=HANG_GUARD_S)
        runs = [(head, head, MACHINE) for head in ("slow", "broken", "same", "unbuildable", "no-such-ref")]
        for key, head, machine in [*runs, ("no-such-machine", "same", "no-such-machine")]:  # the last: asv errors out
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                code = asv_gate.main(["base", head, "--machine", machine, "--config", str(project / "asv.conf.json")])
            results[key] = [code, printed.getvalue()]
    return results


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict[str, list]:
    """Gate exit code and everything it printed, per head compared against `base`.

    Made once per test session, even under xdist (workers share the cache under a file lock).
    """
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    cache = shared / "asv-gate-runs.json"
    with FileLock(f"{cache}.lock"):
        if not cache.is_file():
            cache.write_text(json.dumps(_run_gate_on_each_head(shared / "asv-gate")))
        return json.loads(cache.read_text())


def _asv_part(printed: str) -> tuple[int, str]:
    """asv's own output and exit status, as the gate saw them."""
    lines = printed.splitlines()
    (verdict,) = [line for line in lines if line.startswith("asv-gate: ") and "(asv exit " in line]
    status = int(verdict.split("(asv exit ")[1].split(",")[0])
    return status, "\n".join(line for line in lines if not line.startswith("asv-gate:"))


def test_regression_exits_1(runs):
    code, printed = runs["slow"]
    assert code == 1, printed
    assert "PERFORMANCE DECREASED." in printed  # asv's own output is passed through
    assert "asv-gate: REGRESSION" in printed
    assert "asv-gate:   slower: bench.track_value (100 -> 150, ratio 1.5)" in printed
    assert "track_param" not in printed.split("asv-gate: REGRESSION")[1]  # unchanged: not listed
    assert "asv-gate:   slower: bench.time_sleep" in printed


def test_gate_names_the_test_that_decided(runs):
    _, printed = runs["slow"]
    assert f"asv-gate:   bench.time_sleep: {asv_gate.MANN_WHITNEY}" in printed
    assert f"asv-gate:   bench.track_value: {asv_gate.FACTOR_ONLY}" in printed
    assert f"asv-gate: decided by {asv_gate.MANN_WHITNEY}: 1 benchmark(s)" in printed
    assert f"asv-gate: decided by {asv_gate.FACTOR_ONLY}: 4 benchmark(s)" in printed  # track_value, track_param x3
    _, same = runs["same"]
    assert f"asv-gate: decided by {asv_gate.MANN_WHITNEY}: 1 benchmark(s)" in same


@pytest.mark.parametrize("base, head, test", [
    (({"repeat": 10}, [1.0] * 10), ({"repeat": 10}, [1.0] * 10), "MANN_WHITNEY"),
    (({"repeat": 10}, [1.0] * 3), ({"repeat": 10}, [1.0] * 3), "CI_OVERLAP"),  # too few for p < 0.002
    (({"repeat": 10}, None), ({"repeat": 10}, None), "CI_OVERLAP"),
    (({"repeat": 10}, [1.0] * 3), ({"repeat": 10}, [1.0] * 30), "NO_TEST"),  # normal approximation past 20: p >= 0.0048
    (({"repeat": 10}, [1.0] * 30), ({"repeat": 10}, [1.0] * 3), "NO_TEST"),
    (({"repeat": 10}, [1.0] * 4), ({"repeat": 10}, [1.0] * 30), "MANN_WHITNEY"),  # 4 against 30 reaches p = 0.0014
    (({"repeat": 1}, [1.0]), ({"repeat": 10}, [1.0] * 10), "FACTOR_ONLY"),
    ((None, None), (None, None), "FACTOR_ONLY"),
])
def test_deciding_test_follows_asv(base, head, test):
    assert asv_gate.deciding_test(base, head) == getattr(asv_gate, test)


def test_failed_benchmark_exits_2(runs):
    code, printed = runs["broken"]
    assert code == 2, printed
    assert "asv-gate: FAILURE: benchmarks failed (asv exit 2" in printed
    assert "asv-gate:   failed: bench.track_param" in printed


def test_unchanged_exits_0(runs):
    code, printed = runs["same"]
    assert code == 0, printed
    assert "BENCHMARKS NOT SIGNIFICANTLY CHANGED." in printed


def test_asv_error_without_comparison_exits_2(runs):
    code, printed = runs["no-such-machine"]
    assert code == 2, printed
    assert "asv-gate: FAILURE: asv printed no comparison" in printed


def test_an_unknown_head_exits_2_naming_it_and_asv_never_runs(runs):
    code, printed = runs["no-such-ref"]
    assert code == 2 and printed.startswith("asv-gate: FAILURE: HEAD: 'no-such-ref' is not a commit of "), printed
    assert "asv-gate: running" not in printed


def test_asv_exit_statuses_are_what_the_gate_expects(runs):
    statuses = {head: _asv_part(printed)[0] for head, (_, printed) in runs.items() if head != "no-such-ref"}
    assert statuses == {"slow": 1, "broken": 2, "same": 0, "unbuildable": 2, "no-such-machine": 1}


@pytest.mark.parametrize("head, expected", [("slow", 1), ("broken", 2), ("same", 0), ("unbuildable", 2), ("no-such-machine", 2)])
def test_classify_captured_output(runs, head, expected):
    status, output = _asv_part(runs[head][1])
    assert asv_gate.classify(status, output).code == expected


def test_classify_survives_colour_codes(runs):
    status, output = _asv_part(runs["slow"][1])
    coloured = "\n".join(f"\x1b[31m{line}\x1b[0m" for line in output.splitlines())
    outcome = asv_gate.classify(status, coloured)
    assert outcome.code == 1 and outcome.regressions[1] == "bench.track_value (100 -> 150, ratio 1.5)"
    assert outcome.regressions[0].startswith("bench.time_sleep (") and len(outcome.regressions) == 2


def test_classify_failure_wins_even_if_exit_status_is_lost(runs):
    _, output = _asv_part(runs["broken"][1])
    assert "1/3 failed" in output  # the parameterised benchmark failed for one of its 3 values
    assert asv_gate.classify(0, output).code == 2


def test_classify_decreased_summary_wins_over_exit_0(runs):
    _, output = _asv_part(runs["slow"][1])
    assert asv_gate.classify(0, output).code == 1


def test_classify_inconsistent_clean_summary_with_error_status(runs):
    _, output = _asv_part(runs["same"][1])
    assert asv_gate.classify(1, output).code == 2


def test_classify_truncated_output_is_a_failure(runs):
    _, output = _asv_part(runs["slow"][1])
    cut = output.split("| Change")[0]  # asv died before printing the table
    assert asv_gate.classify(0, cut).code == 2


@pytest.mark.parametrize("text, factor", [("1.10", 1.10), ("10%", 1.10), ("1.5", 1.5), ("1.999", 1.999)])
def test_factor(text, factor):
    assert asv_gate.factor_arg(text) == pytest.approx(factor)


@pytest.mark.parametrize("text", ["0.9", "1", "-5%", "2", "100%", "150%", "abc", "nan", "inf"])
def test_factor_outside_1_2_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"factor must .*\(1, 2\)"):
        asv_gate.factor_arg(text)


def test_bad_factor_exits_2_before_running_asv(capsys):
    with pytest.raises(SystemExit) as info:
        asv_gate.parse_args(["base", "head", "--factor", "3"])
    assert info.value.code == 2 and "(1, 2)" in capsys.readouterr().err


def _in_a_git_project(tmp_path, monkeypatch) -> None:
    """Work in a two-commit git project whose asv.conf.json names it as the repository (HEAD and HEAD~1 resolve there)."""
    (tmp_path / "asv.conf.json").write_text(json.dumps({"version": 1, "repo": "."}))
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "one")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "two")
    monkeypatch.chdir(tmp_path)


def test_a_bad_asv_variable_exits_2_before_running_asv(monkeypatch, capsys, tmp_path):
    _in_a_git_project(tmp_path, monkeypatch)
    monkeypatch.setenv("MLA_ASV_REPEATS", "abc")
    monkeypatch.setattr(asv_gate, "run_streaming", lambda cmd: pytest.fail("asv ran with a bad MLA_ASV_REPEATS"))
    assert asv_gate.main(["base", "head"]) == asv_gate.FAILURE
    assert "MLA_ASV_REPEATS" in capsys.readouterr().out
    monkeypatch.setenv("MLA_ASV_REPEATS", "10")  # twin: a good value reaches asv
    monkeypatch.setattr(asv_gate, "run_streaming", lambda cmd: (0, "BENCHMARKS NOT SIGNIFICANTLY CHANGED.\n"))
    monkeypatch.setattr(asv_gate, "check_stored", lambda args, outcome: outcome)
    assert asv_gate.main(["HEAD~1", "HEAD"]) == asv_gate.CLEAN


@pytest.mark.parametrize("refs", [["HEAD", "HEAD"], ["HEAD~1", "HEAD^"]])
def test_the_same_commit_twice_exits_2_before_running_asv(monkeypatch, capsys, tmp_path, refs):
    """BASE and HEAD naming one commit (also by two names) would compare one commit's results with themselves, which
    always pass (before: exit 0); two commits are the twin and reach asv."""
    _in_a_git_project(tmp_path, monkeypatch)
    monkeypatch.setattr(asv_gate, "run_streaming", lambda cmd: pytest.fail("asv ran on one commit twice"))
    assert asv_gate.main(refs) == asv_gate.FAILURE
    assert f"asv-gate: FAILURE: HEAD: '{refs[1]}' is the same commit as BASE '{refs[0]}'" in capsys.readouterr().out
    monkeypatch.setattr(asv_gate, "run_streaming", lambda cmd: (0, "BENCHMARKS NOT SIGNIFICANTLY CHANGED.\n"))
    monkeypatch.setattr(asv_gate, "check_stored", lambda args, outcome: outcome)
    assert asv_gate.main(["HEAD~1", "HEAD"]) == asv_gate.CLEAN


@pytest.mark.parametrize("refs, named", [(["nope-base", "HEAD"], "BASE: 'nope-base'"), (["HEAD", "nope-head"], "HEAD: 'nope-head'")])
def test_an_unknown_commit_exits_2_naming_it_before_running_asv(monkeypatch, capsys, tmp_path, refs, named):
    _in_a_git_project(tmp_path, monkeypatch)
    monkeypatch.setattr(asv_gate, "run_streaming", lambda cmd: pytest.fail("asv ran with an unknown commit"))
    assert asv_gate.main(refs) == asv_gate.FAILURE
    out = capsys.readouterr().out
    assert f"asv-gate: FAILURE: {named} is not a commit of" in out, out


def _harness_commits(tmp_path, monkeypatch, base: tuple, head: tuple) -> None:
    """A two-commit project whose stand-in harness benchmarks `base`, then `head` (its BENCHMARKED list)."""
    (tmp_path / "asv.conf.json").write_text(json.dumps({"version": 1, "repo": "."}))
    (tmp_path / "harness" / "strategies").mkdir(parents=True)
    (tmp_path / "harness" / "__init__.py").write_text("")
    _git(tmp_path, "init", "-q")
    for names in (base, head):
        (tmp_path / "harness" / "strategies" / "__init__.py").write_text(f"BENCHMARKED = {names!r}\n")
        _git(tmp_path, "add", "-A")
        _git(tmp_path, "commit", "-q", "--allow-empty", "-m", ",".join(names))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLA_ASV_STRATEGIES", "")  # restored (unset) after the test, whatever the gate sets
    monkeypatch.delenv("MLA_ASV_STRATEGIES")


@pytest.mark.parametrize("base, head, timed, allow", [
    (("stock", "gather_cast"), ("gather_cast", "stock"), "gather_cast,stock", []),  # reordered
    (("stock", "shadow"), ("stock", "fused_fp8", "shadow"), "stock,shadow", []),  # one added before the last
    (("stock", "retired", "shadow"), ("stock", "shadow"), "stock,shadow", ["--allow-dropped", "retired"]),  # one removed
    (("stock", "shadow"), ("stock", "shadow"), None, []),  # twin: the same list, nothing set
])
def test_a_head_that_changes_the_strategy_list_times_only_the_shared_ones(monkeypatch, capsys, tmp_path, base, head, timed, allow):
    """asv discovers the parameters at HEAD and runs the base's benchmark by parameter index: a head that reorders,
    adds or removes a benchmarked strategy stored the base's results of one strategy under another's name (a toy
    project whose head swapped two strategies and made one 100x slower passed, exit 0). By hand as in the perf-gate
    workflow, the gate now times only the strategies both commits benchmark, in the head's order."""
    _harness_commits(tmp_path, monkeypatch, base, head)
    seen = []
    monkeypatch.setattr(asv_gate, "run_streaming", lambda cmd: (seen.append(os.environ.get("MLA_ASV_STRATEGIES")),
                                                                (0, "BENCHMARKS NOT SIGNIFICANTLY CHANGED.\n"))[1])
    monkeypatch.setattr(asv_gate, "check_stored", lambda args, outcome: outcome)
    assert asv_gate.main(["HEAD~1", "HEAD", *allow]) == asv_gate.CLEAN
    assert seen == [timed]
    assert (f"MLA_ASV_STRATEGIES={timed}" in capsys.readouterr().out) is (timed is not None)


def test_a_head_that_stops_benchmarking_a_strategy_cannot_be_judged_unless_allowed(monkeypatch, capsys, tmp_path):
    """A head that registers a strategy with benchmark=False (or removes it) made asv time it at neither commit, so a
    slowdown planted in it passed unseen. Refused before asv runs (exit 2) unless --allow-dropped names it (the
    parametrised test above: then the rest is gated)."""
    _harness_commits(tmp_path, monkeypatch, ("stock", "gather_cast", "shadow"), ("stock", "shadow"))
    monkeypatch.setattr(asv_gate, "run_streaming", lambda cmd: pytest.fail("asv ran without gather_cast"))
    for allow in ([], ["--allow-dropped", "shadow"]):  # another name allowed does not cover it
        assert asv_gate.main(["HEAD~1", "HEAD", *allow]) == asv_gate.FAILURE
        (line,) = capsys.readouterr().out.strip().splitlines()
        assert line == ("asv-gate: FAILURE: HEAD: HEAD no longer benchmarks gather_cast, which BASE does: a slowdown there "
                        "would go unjudged (--allow-dropped gather_cast gates the rest when the removal is deliberate)"), line


def test_no_strategy_both_commits_benchmark_exits_2_and_a_set_list_is_kept(monkeypatch, capsys, tmp_path):
    _harness_commits(tmp_path, monkeypatch, ("stock",), ("shadow",))
    monkeypatch.setattr(asv_gate, "run_streaming", lambda cmd: pytest.fail("asv ran with no strategy in both commits"))
    assert asv_gate.main(["HEAD~1", "HEAD"]) == asv_gate.FAILURE
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("asv-gate: FAILURE: MLA_ASV_STRATEGIES: BASE times stock and HEAD shadow: no strategy in both"), line
    monkeypatch.setenv("MLA_ASV_STRATEGIES", "shadow")  # the user's (or the workflow's) list is the user's
    monkeypatch.setattr(asv_gate, "run_streaming", lambda cmd: (0, "BENCHMARKS NOT SIGNIFICANTLY CHANGED.\n"))
    monkeypatch.setattr(asv_gate, "check_stored", lambda args, outcome: outcome)
    assert asv_gate.main(["HEAD~1", "HEAD"]) == asv_gate.CLEAN and os.environ["MLA_ASV_STRATEGIES"] == "shadow"


# what `asv continuous` does not say: benchmarks the head lost (read from both commits' stored results)


def _project(tmp_path_factory) -> Path:
    """The throwaway asv project the `runs` fixture ran in (its stored results stay there)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "asv-gate" / "project"


def _args(project: Path, head: str, machine: str | None = MACHINE) -> argparse.Namespace:
    return argparse.Namespace(base="base", head=head, machine=machine, config=project / "asv.conf.json", bench=None, factor=1.05, inconclusive="pass")


def _check(project: Path, head: str, machine: str | None = MACHINE) -> asv_gate.Outcome:
    clean = asv_gate.Outcome(asv_gate.CLEAN, "as asv said")
    with contextlib.redirect_stdout(io.StringIO()):
        return asv_gate.check_stored(_args(project, head, machine), clean)


def test_stored_results_of_a_clean_head_lose_nothing(runs, tmp_path_factory):
    base, head = asv_gate.stored_results(_args(_project(tmp_path_factory), "same"))
    assert set(base) == set(head) and "bench.track_param(2)" in base and asv_gate.lost(base, head) == []
    assert _check(_project(tmp_path_factory), "same").code == asv_gate.CLEAN


def test_a_failed_benchmark_is_lost_even_if_asv_output_said_nothing(runs, tmp_path_factory):
    outcome = _check(_project(tmp_path_factory), "broken")
    assert outcome.code == asv_gate.FAILURE and outcome.failures == ["bench.track_param(2) (failed in the head)"]


def _head_results(project: Path, branch: str) -> Path:
    commit = subprocess.run(["git", "rev-parse", branch], cwd=project, capture_output=True, text=True, check=True,
                            timeout=HANG_GUARD_S).stdout.strip()
    (path,) = (project / ".asv" / "results" / MACHINE).glob(f"{commit[:8]}-*.json")
    return path


@pytest.mark.parametrize("edit, expected", [
    (lambda doc: doc["results"].pop("bench.track_value"), "bench.track_value (vanished"),
    (lambda doc: doc["results"]["bench.track_value"].__setitem__(0, [float("nan")]), "bench.track_value (n/a in the head"),
    (lambda doc: doc["results"]["bench.track_value"].__setitem__(0, None), "bench.track_value (failed in the head"),
])
def test_a_vanished_skipped_or_failed_benchmark_fails_the_gate(runs, tmp_path_factory, tmp_path, edit, expected):
    project = tmp_path / "project"
    shutil.copytree(_project(tmp_path_factory), project, symlinks=True, ignore=shutil.ignore_patterns("env"))
    path = _head_results(project, "same")
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    outcome = _check(project, "same")
    assert outcome.code == asv_gate.FAILURE and any(f.startswith(expected) for f in outcome.failures), outcome


def test_unreadable_stored_results_fail_the_gate(runs, tmp_path_factory, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(_project(tmp_path_factory), project, symlinks=True, ignore=shutil.ignore_patterns("env"))
    _head_results(project, "same").write_text("{not json")
    outcome = _check(project, "same")
    assert outcome.code == asv_gate.FAILURE and "not readable" in outcome.reason


def test_classify_reads_failed_and_na_cells_as_failures(runs):
    status, output = _asv_part(runs["slow"][1])
    na = output.replace("|   150    |", "|   n/a    |").replace("| 150 ", "| n/a ")
    assert "n/a" in na, output
    outcome = asv_gate.classify(status, na)
    assert outcome.code == asv_gate.FAILURE and "bench.track_value (n/a in the head)" in outcome.failures


def test_command_passes_options_through():
    args, extra = asv_gate.parse_args(["origin/main", "HEAD", "--bench", "cast", "--show-stderr", "-e"])
    cmd = asv_gate.asv_command(args, extra)
    assert cmd[1:] == ["-m", "asv", "continuous", "origin/main", "HEAD", "--factor", "1.05", "--config", "asv.conf.json",
                       "--bench", "cast", "--show-stderr", "-e"]



@pytest.mark.parametrize("given, passed", [("1.10", "1.1"), ("2%", "1.02"), ("1.05", "1.05")])
def test_the_users_factor_reaches_asv(given, passed):
    """asv applies the factor: a --factor the command line dropped or pinned would gate at another threshold."""
    args, extra = asv_gate.parse_args(["origin/main", "HEAD", "--factor", given])
    cmd = asv_gate.asv_command(args, extra)
    assert cmd[cmd.index("--factor") + 1] == passed and cmd.count("--factor") == 1

def test_script_runs_standalone():
    proc = subprocess.run([sys.executable, "-m", "ci.asv_gate", "--help"],
                          capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=REPO)
    assert proc.returncode == 0 and "--factor" in proc.stdout


@pytest.mark.parametrize("row, gating", [
    (["+", "8.81±0ms", "9.63±0ms", "1.09", "benchmarks.StepDeviceMs.time_step_device('b32-l4096', 'gather_cast')"], True),
    (["+", "59.5±0.1μs", "66.0±0.1μs", "1.11", "benchmarks.CastUs.time_cast('b32-l4096', 'stock')"], True),
    (["+", "1.98±0.09μs", "2.23±0.08μs", "1.13", "benchmarks.CastUs.time_cast('b1-l500', 'gather_cast')"], False),  # < 0.5 us
    (["+", "1.98±0.09μs", "2.53±0.08μs", "1.28", "benchmarks.CastUs.time_cast('b1-l500', 'gather_cast')"], True),  # twin
    (["+", "1.98±0.09μs", "2.48±0.08μs", "1.25", "benchmarks.CastUs.time_cast('b1-l500', 'gather_cast')"], True),  # = 0.5 us
    (["+", "1.98±0.09μs", "2.47±0.08μs", "1.25", "benchmarks.CastUs.time_cast('b1-l500', 'gather_cast')"], False),  # twin
    (["+", "1.2±0.1ms", "1.9±0.1ms", "1.58", "benchmarks.StepHostMs.time_step_host('b1-l4096', 'gather_cast')"], False),
    (["+", "1.2±0.1ms", "1.9±0.1ms", "1.58", "benchmarks.StepMs.time_step('b1-l4096', 'gather_cast')"], False),
    (["+", "1.00ms", "2.00ms", "2.00", "bench.time_sleep"], True),  # no metric in the table: gates (conservative)
])
def test_gates_follows_the_metric_table(row, gating):
    assert asv_gate.gates(row) is gating


def _renamed(output: str, benchmark: str) -> str:
    """The slow run's captured output with its regressed rows renamed to `benchmark`."""
    return output.replace("bench.time_sleep", benchmark).replace("bench.track_value", benchmark + "2")


def test_informational_slowdown_reports_but_passes(runs):
    status, output = _asv_part(runs["slow"][1])
    outcome = asv_gate.classify(status, _renamed(output, "benchmarks.StepHostMs.time_step_host"))
    assert outcome.code == 0 and len(outcome.informational) == 2 and not outcome.regressions


def test_gating_slowdown_still_fails_beside_informational(runs):  # twin of the one above
    status, output = _asv_part(runs["slow"][1])
    outcome = asv_gate.classify(status, _renamed(output, "benchmarks.StepDeviceMs.time_step_device"))
    assert outcome.code == 1 and len(outcome.regressions) == 2


def test_metric_of_names_every_benchmark_classes_metric():
    """The gate reads a benchmark's metric from its class name: every class in the asv suite must be
    named after its `metric`, or the metric table's gating rules would not reach it."""
    from suites.asv import bench_tpot, benchmarks

    checked = 0
    for module in (benchmarks, bench_tpot):
        for cls in vars(module).values():
            if isinstance(cls, type) and not cls.__name__.startswith("_") and getattr(cls, "metric", ""):
                for method in (m for m in vars(cls) if m.startswith(("time_", "track_"))):
                    name = f"{module.__name__.rsplit('.', 1)[1]}.{cls.__name__}.{method}('b1-l4096', 'stock')"
                    assert asv_gate.metric_of(name) == cls.metric, name
                    checked += 1
    assert checked >= 6
    assert asv_gate.metric_of("benchmarks.CastMicros.time_cast('b1-l4096', 'stock')") != "cast_us"  # twin: a renamed class


@pytest.mark.parametrize("head", ["same", "slow"])
def test_asv_exit_2_is_a_failure_whatever_its_output_says(runs, head):
    """asv returns 2 when a benchmark failed; output that reads clean (or as a mere regression) does not
    change that. The twin: the same output with its own exit status is not a failure."""
    status, output = _asv_part(runs[head][1])
    assert asv_gate.classify(2, output).code == asv_gate.FAILURE
    assert asv_gate.classify(status, output).code != asv_gate.FAILURE


def test_na_in_the_head_is_lost_and_na_at_both_commits_is_said():
    """n/a in the head where the base measured it is lost; n/a at both commits (a strategy with no cast has no
    cast_us; native_fp8 on SM120) has no result to lose: said, not failed (it failed every perf-gate run of the
    default strategy list), unless nothing at all was measured at both commits."""
    nan = float("nan")
    assert asv_gate.lost({"b.x": (1.0, None, None)}, {"b.x": (nan, None, None)}) == ["b.x (n/a in the head: skipped)"]
    assert asv_gate.lost({"b.x": (nan, None, None)}, {"b.x": (nan, None, None)}) == []
    assert asv_gate.unmeasured({"b.x": (nan, None, None), "b.y": (1.0, None, None)},
                               {"b.x": (nan, None, None), "b.y": (1.0, None, None)}) == ["b.x"]
    assert asv_gate.lost({"b.x": (nan, None, None)}, {"b.x": (1.0, None, None)}) == []  # twin: measured in the head


@pytest.mark.parametrize("base, code", [(float("nan"), asv_gate.CLEAN), (2.5e-6, asv_gate.FAILURE)])
def test_a_row_na_at_both_commits_in_asvs_full_table_is_no_failure(tmp_path, base, code):
    """`--no-only-changed` (passed to asv) lists every row, also one n/a at both commits (stock has no cast): read as
    n/a in the head, it failed every real run (exit 2). asv's own table; twin: measured at the base, n/a in the head."""
    from asv import config
    from asv.benchmarks import Benchmarks
    from asv.commands.compare import Compare

    conf = config.Config()
    conf.results_dir = str(tmp_path)
    key, params = "benchmarks.CastUs.time_cast", [["'b1-l4096'"], ["'stock'", "'gather_cast'"]]
    Benchmarks(conf, [{"name": key, "params": params, "version": "1", "unit": "seconds"}]).save()
    samples = list(2.5e-6 * (1 + 0.03 * np.linspace(-1, 1, 30)))
    stats = {"repeat": 30, "q_25": min(samples), "q_75": max(samples), "ci_99_a": min(samples), "ci_99_b": max(samples), "number": 1}

    def rows(stock: float):  # continuous's results_iter: stock's cast `stock` (NaN: n/a), gather_cast's measured
        known = stock == stock
        yield key, params, [stock, 2.5e-6], [stats if known else None, stats], [samples if known else None, samples], "1", "gt", "py"

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        Compare.print_table(conf, "a" * 40, "b" * 40, resultset_1=rows(base), resultset_2=rows(float("nan")), factor=1.05,
                            split=False, only_changed=False, sort="ratio")
    outcome = asv_gate.classify(0, printed.getvalue() + "\nBENCHMARKS NOT SIGNIFICANTLY CHANGED.\n")
    assert outcome.code == code, (outcome, printed.getvalue())
    if code == asv_gate.FAILURE:
        assert outcome.failures == [f"{key}('b1-l4096', 'stock') (n/a in the head)"]


# the red-team's asv repros: rows the parser must read, options asv must not re-read, results of one machine and env


def test_a_pipe_in_a_parameter_stays_in_the_benchmarks_name():
    output = ("| Change | Before | After | Ratio | Benchmark (Parameter) |\n|---|---|---|---|---|\n"
              "| + | 100 | 200 | 2.00 | bench.track_pipe('a|b') |\n\nPERFORMANCE DECREASED.\n")
    outcome = asv_gate.classify(1, output)
    assert outcome.code == asv_gate.REGRESSION and outcome.regressions == ["bench.track_pipe('a|b') (100 -> 200, ratio 2.00)"]


def test_a_decrease_in_no_row_the_gate_reads_is_a_failure():
    """asv's summary says slower, but no row parsed: never CLEAN (before: 'only informational ... slower', exit 0)."""
    outcome = asv_gate.classify(1, "| + | 100 | 200 |\n\nPERFORMANCE DECREASED.\n")
    assert outcome.code == asv_gate.FAILURE and "no row the gate could read" in outcome.reason
    informational = "| + | 1.2±0.1ms | 1.9±0.1ms | 1.58 | benchmarks.StepHostMs.time_step_host('b1-l4096', 'stock') |\n\n"
    assert asv_gate.classify(1, informational + "PERFORMANCE DECREASED.\n").code == asv_gate.CLEAN  # twin: a row read


def test_a_benchmark_asv_cannot_compare_is_a_failure():
    """asv marks a row 'x' when the benchmark's code or parameters changed between the commits: not judged, so not passed."""
    outcome = asv_gate.classify(0, "| x | 10 | 12 | 1.20 | bench.track_strategy('fused') |\n\nBENCHMARKS NOT SIGNIFICANTLY CHANGED.\n")
    assert outcome.code == asv_gate.FAILURE and outcome.failures == [
        "bench.track_strategy('fused') (not comparable: its code or parameters changed between the commits)"]


@pytest.mark.parametrize("argv, field, value", [(["-f", "1.5"], "factor", 1.5), (["--fact=1.2"], "factor", 1.2),
                                                (["-m", "gt"], "machine", "gt"), (["--conf", "x.json"], "config", Path("x.json")),
                                                (["--config", "a.json", "--config", "b.json"], "config", Path("b.json"))])
def test_asvs_spellings_of_the_gates_options_are_the_gates(argv, field, value):
    """-f / -m / a prefix / a repeat: the gate reads them and hands asv one value (before, `-f 3` reached asv after the
    gate's --factor 1.05 and a 1.5x regression passed, reported as factor 1.05)."""
    args, extra = asv_gate.parse_args(["base", "head", *argv])
    assert getattr(args, field) == value and extra == []
    cmd = asv_gate.asv_command(args, extra)
    assert cmd.count("--factor") == 1 and cmd.count("--config") == 1 and "-f" not in cmd[3:] and "-m" not in cmd[3:]
    with pytest.raises(SystemExit):  # the bound holds for every spelling
        asv_gate.parse_args(["base", "head", "-f", "3"])


def _discovered(folder: Path, names) -> None:
    """`names` added to the results folder's benchmarks.json (asv's list of the run's benchmarks), at version "1"."""
    path = folder / "benchmarks.json"
    listed = json.loads(path.read_text()) if path.is_file() else {"version": 2}
    path.write_text(json.dumps({**listed, **{n: {"name": n, "params": [], "version": "1"} for n in names}}))


def _results(folder: Path, machine: str, commit: str, env: str, values: dict) -> None:
    (folder / machine).mkdir(parents=True, exist_ok=True)
    doc = {"commit_hash": commit, "env_name": env, "result_columns": ["result", "params", "version"],
           "results": {name: [[value], [], "1"] for name, value in values.items()}, "version": 2}
    (folder / machine / f"{commit[:8]}-{env}.json").write_text(json.dumps(doc))
    _discovered(folder, values)


def _stored(tmp_path, monkeypatch, machine, bench=None):
    monkeypatch.setattr(asv_gate, "commit_hashes", lambda base, head, config: ["a" * 40, "b" * 40])
    conf = tmp_path / "asv.conf.json"
    conf.write_text('{"version": 1, "repo": ".", "results_dir": "results",}  // asv reads JSON5')
    return asv_gate.stored_results(argparse.Namespace(base="base", head="head", machine=machine, config=conf, bench=bench))


def test_stored_results_are_one_machines_and_one_entry_per_environment(tmp_path, monkeypatch):
    results = tmp_path / "results"
    for env, head_value in (("py-MODEa", float("nan")), ("py-MODEb", 5.0)):  # n/a in one environment only
        _results(results, "gt", "a" * 40, env, {"bench.track_mode": 5.0})
        _results(results, "gt", "b" * 40, env, {"bench.track_mode": head_value})
    base, head = _stored(tmp_path, monkeypatch, None)  # the only machine
    assert asv_gate.lost(base, head) == ["bench.track_mode [gt/py-MODEa] (n/a in the head: skipped)"]
    _results(results, "other", "b" * 40, "py-MODEa", {"bench.track_mode": 5.0})  # another machine's clean head
    with pytest.raises(HarnessError, match=r"holds results of 2 machines"):
        _stored(tmp_path, monkeypatch, None)
    base, head = _stored(tmp_path, monkeypatch, "gt")  # named: the other machine's results are not read
    assert asv_gate.lost(base, head) == ["bench.track_mode [gt/py-MODEa] (n/a in the head: skipped)"]


def test_no_stored_results_for_a_commit_is_a_failure(tmp_path, monkeypatch):
    """A config that leads elsewhere finds no results: that is not 'nothing lost' (before: exit 0)."""
    _results(tmp_path / "results", "gt", "a" * 40, "py", {"bench.track_value": 1.0})
    with pytest.raises(HarnessError, match=r"^HEAD: no stored results of 'head' for machine 'gt'"):
        _stored(tmp_path, monkeypatch, "gt")


@pytest.mark.parametrize("text, words", [("[1, 2]", "repo"), ('{"repo": 5}', "repo"), ("{not json", "not a readable asv config"),
                                         ('{"repo": "no-such-folder"}', "repo: "),  # before: a bare errno line, no file or field
                                         ('{"repo": ".", "x": ' + "[" * 2000 + "]" * 2000 + "}", "nested too deeply")])  # before: a RecursionError traceback, exit 1
def test_a_malformed_asv_config_is_one_line(tmp_path, capsys, text, words):
    conf = tmp_path / "c.json"
    conf.write_text(text)
    assert asv_gate.main(["base", "head", "--config", str(conf)]) == asv_gate.FAILURE
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"asv-gate: FAILURE: {conf}") and words in line, line


def test_an_endless_asv_config_is_one_line_not_a_full_memory(tmp_path, capsys, monkeypatch):
    """--config is read as the harness's data files are, at most datafiles.MAX_BYTES (before: read whole, so
    --config /dev/zero filled memory until the kernel killed the gate). Here the cap is lowered, not the file raised."""
    monkeypatch.setattr(datafiles, "MAX_BYTES", 1024)
    conf = tmp_path / "c.json"
    conf.write_text('{"repo": "."}' + " " * 2048)
    assert asv_gate.main(["base", "head", "--config", str(conf)]) == asv_gate.FAILURE
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"asv-gate: FAILURE: {conf}: more than"), line


def test_an_earlier_runs_file_of_one_commit_is_not_this_runs(tmp_path, monkeypatch):
    """A results file of the head alone, in another environment (an earlier run's), is not compared: the environment
    both commits were measured in is (before, its names took an env suffix and every base benchmark 'vanished')."""
    results = tmp_path / "results"
    for commit in ("a" * 40, "b" * 40):
        _results(results, "gt", commit, "py3.12", {"bench.track_value": 1.0})
    _results(results, "gt", "b" * 40, "py3.11", {"bench.track_value": float("nan")})  # stale, the head's only
    base, head = _stored(tmp_path, monkeypatch, "gt")
    assert base == head == {"bench.track_value": (1.0, None, None)} and asv_gate.lost(base, head) == []


def test_nothing_measured_at_both_commits_is_a_failure(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    for commit in ("a" * 40, "b" * 40):
        _results(results, "gt", commit, "py", {"bench.track_cast": float("nan")})
    args = _gate_args(tmp_path, monkeypatch)
    outcome = asv_gate.check_stored(args, asv_gate.Outcome(asv_gate.CLEAN, "as asv said"))
    assert outcome.code == asv_gate.FAILURE and "nothing was judged" in outcome.reason
    assert "n/a at both commits" in capsys.readouterr().out
    _results(results, "gt", "a" * 40, "py", {"bench.track_cast": float("nan"), "bench.track_value": 1.0})  # twin
    _results(results, "gt", "b" * 40, "py", {"bench.track_cast": float("nan"), "bench.track_value": 1.0})
    assert asv_gate.check_stored(args, asv_gate.Outcome(asv_gate.CLEAN, "as asv said")).code == asv_gate.CLEAN


@pytest.mark.parametrize("base, code", [(float("nan"), asv_gate.FAILURE), (1.0, asv_gate.CLEAN)])
def test_nothing_measured_at_the_base_is_a_failure(tmp_path, monkeypatch, capsys, base, code):
    """MLA_ASV_SCENARIOS naming a scenario only the head has (or a head that renames presets): every benchmark n/a at
    the base, measured in the head, so nothing was compared (before: exit 0, 'judged 0 benchmark(s)'). Twin: measured
    at both commits."""
    results = tmp_path / "results"
    _results(results, "gt", "a" * 40, "py", {"bench.track_cast": base})
    _results(results, "gt", "b" * 40, "py", {"bench.track_cast": 1.0})
    args = _gate_args(tmp_path, monkeypatch)
    outcome = asv_gate.check_stored(args, asv_gate.Outcome(asv_gate.CLEAN, "as asv said"))
    assert outcome.code == code, (outcome, capsys.readouterr().out)
    assert ("nothing was judged" in outcome.reason) == (code == asv_gate.FAILURE)


def test_every_bench_regex_reaches_asv():
    """asv's -b/--bench appends ("any of these"): the gate hands asv each one, not the last."""
    args, extra = asv_gate.parse_args(["base", "head", "-b", "CastUs", "--bench", "StepDeviceMs"])
    cmd = asv_gate.asv_command(args, extra)
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--bench"] == ["CastUs", "StepDeviceMs"]


def test_the_gates_other_users_need_no_asv():
    """ci.sglang_gate --json (no asv) imports ci.asv_gate for its factor rule: that import needs no json5 or asv."""
    code = ("import sys; sys.modules['json5'] = None; sys.modules['asv'] = None\n"
            "from ci import asv_gate, sglang_gate\nprint(asv_gate.factor_arg('5%'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0 and proc.stdout.strip() == "1.05", proc.stderr


VERDICT = "benchmarks.Verdict.track_verdict('b32-l4096', 'sglang_flashinfer')"


@pytest.mark.parametrize("before, after, code", [
    (1.0, 1.0, asv_gate.REGRESSION),  # failed at both commits: asv says unchanged (before: exit 0)
    (float("nan"), 1.0, asv_gate.REGRESSION),  # unsupported in the base, failing in the head (before: 1 -> 1, exit 0)
    (1.0, 0.0, asv_gate.CLEAN),  # twins: fixed, and passing at both
    (0.0, 0.0, asv_gate.CLEAN),
    (float("nan"), float("nan"), asv_gate.CLEAN),  # unsupported at both: n/a, said
    (0.0, float("nan"), asv_gate.FAILURE),  # pass -> unsupported: lost
])
def test_a_verdict_that_does_not_pass_in_the_head_fails_whatever_the_base_had(tmp_path, monkeypatch, capsys, before, after, code):
    """The SGLang gate's Verdict benchmark: a head whose verdict fails is failing, as in `harness compare`, also when
    the base failed too (asv compares 1 with 1 as unchanged and `asv continuous` does not list it)."""
    results = tmp_path / "results"
    _results(results, "gt", "a" * 40, "py", {VERDICT: before, "bench.track_value": 1.0})
    _results(results, "gt", "b" * 40, "py", {VERDICT: after, "bench.track_value": 1.0})
    args = _gate_args(tmp_path, monkeypatch)
    outcome = asv_gate.check_stored(args, asv_gate.Outcome(asv_gate.CLEAN, "as asv said"))
    assert outcome.code == code, outcome
    if code == asv_gate.REGRESSION:
        assert outcome.failures == [f"{VERDICT} (the head's verdict does not pass)"]


def test_a_benchmark_this_run_did_not_select_is_not_lost(tmp_path, monkeypatch):
    """`--bench CastUs`: the base's results file still holds what an earlier full run stored (AttnUs); the head's, of
    this run only, lacks it. That is no benchmark lost (before: 'vanished', exit 2 on a clean head); a selected one
    that vanished is its twin, and a regex selects `name(params)` as asv's does."""
    results = tmp_path / "results"
    cast, attn = "benchmarks.CastUs.time_cast('b1-l500', 'gather_cast')", "benchmarks.AttnUs.time_attn('b1-l500', 'gather_cast')"
    _results(results, "gt", "a" * 40, "py", {cast: 1e-5, attn: 2e-5, "benchmarks.StepMs.time_step('b1-l500', 'stock')": 1e-3})
    _results(results, "gt", "b" * 40, "py", {cast: 1e-5})
    assert asv_gate.lost(*_stored(tmp_path, monkeypatch, "gt", ["CastUs"])) == []
    assert asv_gate.lost(*_stored(tmp_path, monkeypatch, "gt", ["gather_cast"])) == [
        f"{attn} (vanished: in the base's results, not in the head's)"]
    assert len(asv_gate.lost(*_stored(tmp_path, monkeypatch, "gt", None))) == 2  # no --bench: every stored benchmark


STEP = "benchmarks.StepDeviceMs.time_step_device('b32-l4096', 'gather_cast')"
HOST = "benchmarks.StepHostMs.time_step_host('b32-l4096', 'gather_cast')"  # informational: never judged


def _sampled(folder: Path, commit: str, samples: dict) -> None:
    """asv results of one commit whose time_ benchmarks recorded samples (seconds), as `asv continuous` stores them."""
    (folder / "gt").mkdir(parents=True, exist_ok=True)
    doc = {"commit_hash": commit, "env_name": "py", "result_columns": ["result", "params", "stats_repeat", "samples", "version"],
           "results": {n: [[float(np.median(v))], [], [len(v)], [list(v)], "1"] for n, v in samples.items()}, "version": 2}
    (folder / "gt" / f"{commit[:8]}-py.json").write_text(json.dumps(doc))
    _discovered(folder, samples)


def _gate_args(tmp_path, monkeypatch, inconclusive: str = "pass") -> argparse.Namespace:
    """The gate's arguments for commits a and b whose results _sampled stored under tmp_path."""
    monkeypatch.setattr(asv_gate, "commit_hashes", lambda base, head, config: ["a" * 40, "b" * 40])
    conf = tmp_path / "asv.conf.json"
    conf.write_text('{"repo": ".", "results_dir": "results"}')
    return argparse.Namespace(base="base", head="head", machine="gt", config=conf, bench=None, factor=1.05,
                              inconclusive=inconclusive)


def _judge(tmp_path, monkeypatch, base: dict, head: dict, asv_said: asv_gate.Outcome, inconclusive: str = "pass"):
    _sampled(tmp_path / "results", "a" * 40, base)
    _sampled(tmp_path / "results", "b" * 40, head)
    return asv_gate.check_stored(_gate_args(tmp_path, monkeypatch, inconclusive), asv_said)


def _noisy(median: float, spread: float, n: int = 12, seed: int = 0) -> np.ndarray:
    return median * np.exp(np.random.default_rng(seed).normal(0.0, spread, n))


ASV_CLEAN = asv_gate.Outcome(asv_gate.CLEAN, "BENCHMARKS NOT SIGNIFICANTLY CHANGED.")
ASV_FLAGGED = asv_gate.Outcome(asv_gate.REGRESSION, "performance decreased beyond the factor",
                               [f"{STEP} (2.50±0.1ms -> 2.60±0.1ms, ratio 1.06)"])


@pytest.mark.parametrize("shift, code", [(1.15, asv_gate.REGRESSION), (1.0, asv_gate.CLEAN)])
def test_a_slowdown_asv_called_unchanged_fails_by_the_harness_rule(tmp_path, monkeypatch, shift, code):
    """asv's test misses a real slowdown at times (12 samples at 5% spread: 6% of true 10% slowdowns called
    unchanged, no message): the harness rule on the same recorded samples fails it; its twin, no shift, passes."""
    base, head = _noisy(2.5e-3, 0.01), _noisy(2.5e-3 * shift, 0.01, seed=1)
    outcome = _judge(tmp_path, monkeypatch, {STEP: base, HOST: base}, {STEP: head, HOST: head * 3}, ASV_CLEAN)
    assert outcome.code == code, outcome
    if code == asv_gate.REGRESSION:
        assert "asv called some unchanged" in outcome.reason and "harness rule: regressed" in outcome.regressions[0]
        assert not any(HOST in item for item in outcome.regressions)  # informational: asv's call stands


@pytest.mark.parametrize("shift, code", [(1.0, asv_gate.CLEAN), (1.15, asv_gate.REGRESSION)])
def test_an_asv_alarm_the_harness_rule_puts_within_the_factor_is_cleared(tmp_path, monkeypatch, capsys, shift, code):
    """asv flags at times what did not move (bimodal clocks: 4.7% of A/A pairs at 30 samples): the rule's interval below
    the factor clears it, said on its own line; a real slowdown it confirms stays a regression (twin)."""
    base, head = _noisy(2.5e-3, 0.01, 30), _noisy(2.5e-3 * shift, 0.01, 30, seed=1)
    outcome = _judge(tmp_path, monkeypatch, {STEP: base}, {STEP: head}, ASV_FLAGGED)
    assert outcome.code == code, outcome
    assert bool(outcome.cleared) == (code == asv_gate.CLEAN)


@pytest.mark.parametrize("asv_said", [ASV_CLEAN, ASV_FLAGGED])
@pytest.mark.parametrize("inconclusive, code", [("pass", asv_gate.CLEAN), ("fail", asv_gate.REGRESSION)])
def test_an_inconclusive_benchmark_is_loud_and_fails_only_when_asked(tmp_path, monkeypatch, asv_said, inconclusive, code):
    """Samples too noisy to tell 5% (the interval straddles the factor), whatever asv said: listed as INCONCLUSIVE,
    passing unless --inconclusive fail, as `harness compare` does (asv's alarm alone fails two-state clocks' A/A)."""
    base, head = _noisy(2.5e-3, 0.08, 6), _noisy(2.5e-3 * 1.06, 0.08, 6, seed=1)
    outcome = _judge(tmp_path, monkeypatch, {STEP: base}, {STEP: head}, asv_said, inconclusive)
    assert outcome.code == code and len(outcome.inconclusive) == 1 and "harness rule: inconclusive" in outcome.inconclusive[0]


@pytest.mark.parametrize("asv_said", [ASV_CLEAN, ASV_FLAGGED])
def test_too_few_samples_keep_asvs_verdict(tmp_path, monkeypatch, asv_said):
    """Fewer than MIN_SAMPLES at a commit (the CPU's 3 repeats): no interval, asv's verdict stands either way (an
    undersampled decision must not clear asv's alarm)."""
    outcome = _judge(tmp_path, monkeypatch, {STEP: _noisy(2.5e-3, 0.01, 4)}, {STEP: _noisy(2.5e-3, 0.01, 4, seed=1)}, asv_said)
    assert outcome.code == asv_said.code and not outcome.inconclusive and not outcome.cleared


@pytest.mark.parametrize("counts, code", [((3, 30), asv_gate.FAILURE), ((30, 3), asv_gate.FAILURE), ((4, 30), asv_gate.CLEAN)])
def test_too_few_samples_at_one_commit_for_either_test_cannot_pass(tmp_path, monkeypatch, counts, code):
    """3 samples against 30: the harness rule needs 5 at each commit, and asv's Mann-Whitney U (its normal
    approximation past 20) cannot reach p < 0.002, so asv called a 2x slowdown unchanged and the gate passed it. Now the
    gate cannot judge it (exit 2), naming the benchmark and its counts. Twin: 4 against 30, which asv's test can flag,
    keeps asv's verdict."""
    base, head = _noisy(2.5e-3, 0.01, counts[0]), _noisy(5e-3, 0.01, counts[1], seed=1)
    outcome = _judge(tmp_path, monkeypatch, {STEP: base, HOST: base}, {STEP: head, HOST: head}, ASV_CLEAN)
    assert outcome.code == code, outcome
    if code == asv_gate.FAILURE:
        assert outcome.failures == [f"{STEP} ({counts[0]} vs {counts[1]} samples)"] and "cannot judge" in outcome.reason


def test_the_inconclusive_option_is_the_gates_not_asvs():
    args, extra = asv_gate.parse_args(["base", "head", "--inconclusive", "fail"])
    assert args.inconclusive == "fail" and "--inconclusive" not in asv_gate.asv_command(args, extra)


@pytest.mark.parametrize("samples, words", [
    (["1e-3"] * 12, "samples"), (1e-3, "samples"), ([float("nan")] * 12, "samples"), ([1e-3] * 11 + [float("inf")], "samples"),
    ([0.0] * 12, "positive"), ([-1e-3] * 12, "positive"),
])
def test_stored_samples_asv_could_not_have_written_are_one_failure_line(tmp_path, monkeypatch, samples, words):
    """Samples of strings or a scalar crashed the harness rule (a traceback, exit 1: read as a regression); NaN, inf,
    zero or negative ones passed as INCONCLUSIVE (exit 0). Each is a FAILURE naming the file and benchmark. Twin:
    finite positive samples are judged."""
    good = list(_noisy(2.5e-3, 0.01))
    _sampled(tmp_path / "results", "a" * 40, {STEP: good})
    path = tmp_path / "results" / "gt" / f"{'b' * 8}-py.json"
    _sampled(tmp_path / "results", "b" * 40, {STEP: good})
    doc = json.loads(path.read_text())
    doc["results"][STEP][3] = [samples]
    path.write_text(json.dumps(doc))
    args = _gate_args(tmp_path, monkeypatch)
    outcome = asv_gate.check_stored(args, ASV_CLEAN)
    assert outcome.code == asv_gate.FAILURE and f"{path}: results.{STEP}.samples" in outcome.reason and words in outcome.reason, outcome
    _sampled(tmp_path / "results", "b" * 40, {STEP: good})
    assert asv_gate.check_stored(args, ASV_CLEAN).code == asv_gate.CLEAN


@pytest.mark.parametrize("value, code", [(0.0, asv_gate.FAILURE), (-2.5e-3, asv_gate.FAILURE), (2.5e-3, asv_gate.CLEAN)])
@pytest.mark.parametrize("side", ["a", "b"])
def test_a_stored_time_of_zero_or_below_is_one_failure_line(tmp_path, monkeypatch, side, value, code):
    """A time_ benchmark's value of 0 or below with no samples (asv never writes one) read as a number: the head's
    passed as 'PERFORMANCE INCREASED', the base's failed as a regression. Now a FAILURE naming the file and benchmark;
    twin: a positive value is judged."""
    for commit in ("a", "b"):
        _sampled(tmp_path / "results", commit * 40, {STEP: [2.5e-3] * 3})
    path = tmp_path / "results" / "gt" / f"{side * 8}-py.json"
    doc = json.loads(path.read_text())
    doc["results"][STEP][0], doc["results"][STEP][3] = [value], [None]
    path.write_text(json.dumps(doc))
    args = _gate_args(tmp_path, monkeypatch)
    outcome = asv_gate.check_stored(args, ASV_CLEAN)
    assert outcome.code == code, outcome
    if code == asv_gate.FAILURE:
        assert f"{path}: results.{STEP}" in outcome.reason and "positive" in outcome.reason


@pytest.mark.parametrize("edit, words", [
    ("copy", "under another name"), ("machine", "params.machine"), ("truncated", "not valid JSON"), ("list", "not an asv results object"),
    ("no results", "results: missing"),
])
def test_a_results_file_asv_would_not_read_is_one_failure_naming_it(tmp_path, monkeypatch, edit, words):
    """A renamed copy of the head's file (env_name the real one's) hid a benchmark that vanished from the head (exit 0);
    a file of another machine in this machine's folder was judged as this one's; a truncated, list or result-less file
    failed without naming the file. Each is a FAILURE naming the file (and field). Twin: the untouched files pass."""
    results = tmp_path / "results"
    _results(results, "gt", "a" * 40, "py", {"bench.track_value": 1.0, "bench.track_gone": 1.0})
    _results(results, "gt", "b" * 40, "py", {"bench.track_value": 1.0, "bench.track_gone": 1.0})
    args = _gate_args(tmp_path, monkeypatch)
    assert asv_gate.check_stored(args, ASV_CLEAN).code == asv_gate.CLEAN
    head = results / "gt" / f"{'b' * 8}-py.json"
    doc = json.loads(head.read_text())
    if edit == "copy":
        (results / "gt" / f"{'b' * 8}-py-copy.json").write_text(head.read_text())  # the stale copy keeps track_gone
        _results(results, "gt", "b" * 40, "py", {"bench.track_value": 1.0})
        bad = results / "gt" / f"{'b' * 8}-py-copy.json"
    else:
        bad = head
        text = {"machine": json.dumps({**doc, "params": {"machine": "other"}}), "truncated": head.read_text()[:40],
                "list": "[]", "no results": json.dumps({k: v for k, v in doc.items() if k != "results"})}[edit]
        head.write_text(text)
    outcome = asv_gate.check_stored(args, ASV_CLEAN)
    assert outcome.code == asv_gate.FAILURE and str(bad) in outcome.reason and words in outcome.reason, outcome


def _as_asv_continuous(results: Path, envs: list[str], shift: float) -> tuple[int, str]:
    """asv's own results files of commits a and b (one per environment; STEP `shift` times slower at b in the last one), and
    `asv continuous`'s exit status and output on them: the table as it prints it (asv/commands/continuous.py hands each
    environment's results to Compare.print_table, which names a row `name [machine/env]` when there are several), then
    its summary."""
    from asv import config
    from asv.benchmarks import Benchmarks
    from asv.commands.compare import Compare
    from asv.results import Results
    from asv.runner import BenchmarkResult

    key, params = STEP.split("(")[0], [["'b32-l4096'"], ["'gather_cast'"]]
    conf = config.Config()
    conf.results_dir = str(results)
    Benchmarks(conf, [{"name": key, "params": params, "version": "1", "unit": "seconds"}]).save()
    for commit, factor in (("a" * 40, 1.0), ("b" * 40, shift)):
        for env in envs:
            samples = list(2.5e-3 * (factor if env == envs[-1] else 1.0) * (1 + 0.03 * np.linspace(-1, 1, 30)))
            doc = Results({"machine": "gt"}, {}, commit, 0, "3.11", env, {})
            doc.add_result({"name": key, "params": params, "version": "1"},
                           BenchmarkResult([float(np.median(samples))], [samples], [1], 0, "", None), record_samples=True)
            doc.save(str(results))

    def rows(commit: str):  # continuous's results_iter
        for env in envs:
            doc = Results.load(str(results / "gt" / f"{commit[:8]}-{env}.json"), "gt")
            got = (doc.get_result_value, doc.get_result_stats, doc.get_result_samples)
            yield key, params, *(get(key, params) for get in got), "1", "gt", env

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        worsened, _ = Compare.print_table(conf, "a" * 40, "b" * 40, resultset_1=rows("a" * 40), resultset_2=rows("b" * 40),
                                          factor=1.05, split=False, only_changed=True, sort="ratio")
    return int(worsened), printed.getvalue() + ("\nPERFORMANCE DECREASED.\n" if worsened else "\nBENCHMARKS NOT SIGNIFICANTLY CHANGED.\n")


@pytest.mark.parametrize("envs", [["virtualenv-py3.11"], ["virtualenv-py3.11", "virtualenv-py3.12"]], ids=["one-env", "two-envs"])
@pytest.mark.parametrize("shift, code", [(1.15, asv_gate.REGRESSION), (1.06, asv_gate.CLEAN)])
def test_the_harness_rule_judges_the_row_asv_printed_in_one_or_several_environments(tmp_path, monkeypatch, capsys, envs, shift, code):
    """With several environments asv names a row `name [machine/env]`; the gate's stored results bear the same name, so the
    harness rule decides the row asv flagged (before: stored as `name [env]`, never asv's row: a 6% slowdown the rule finds
    inconclusive failed, a confirmed 15% one was listed twice, its test 'unknown'). asv's own results files and table;
    one environment (a row named `name`) is the twin."""
    status, output = _as_asv_continuous(tmp_path / "results", envs, shift)
    row = f"{STEP} [gt/{envs[-1]}]" if len(envs) > 1 else STEP
    assert [r[4] for r in asv_gate._table_rows(output.splitlines())] == [row], output
    monkeypatch.setattr(asv_gate, "commit_hashes", lambda base, head, config: ["a" * 40, "b" * 40])
    conf = tmp_path / "asv.conf.json"
    conf.write_text('{"repo": ".", "results_dir": "results"}')
    args = argparse.Namespace(base="base", head="head", machine=None, config=conf, bench=None, factor=1.05, inconclusive="pass")
    outcome = asv_gate.check_stored(args, asv_gate.classify(status, output))
    assert outcome.code == code, outcome
    (judged,) = outcome.regressions if code == asv_gate.REGRESSION else outcome.inconclusive
    assert judged.startswith(f"{row} (") and f"; {row} (harness rule: " in judged, judged
    assert f"asv-gate:   {row}: {asv_gate.MANN_WHITNEY}" in capsys.readouterr().out


NEW = "benchmarks.NewMetricUs.time_new"


def _asv_run(results: Path, commits: list[str], listed: dict[str, str], timed: list[str], env: str = "py") -> None:
    """What one `asv run` leaves in `results`: benchmarks.json listing `listed` ({name: version}), and each commit's
    results file, to which asv's Results.load_data brings what earlier runs stored, with the `timed` benchmarks added."""
    from asv import config
    from asv.benchmarks import Benchmarks
    from asv.results import Results
    from asv.runner import BenchmarkResult

    conf = config.Config()
    conf.results_dir = str(results)
    params = [["'b32-l4096'"], ["'gather_cast'"]]
    Benchmarks(conf, [{"name": n, "params": params, "version": v, "unit": "seconds"} for n, v in listed.items()]).save()
    samples = list(2.5e-3 * (1 + 0.03 * np.linspace(-1, 1, 30)))
    for commit in commits:
        doc = Results({"machine": "gt"}, {}, commit, 0, "3.11", env, {})
        doc.load_data(str(results))
        for name in timed:
            doc.add_result({"name": name, "params": params, "version": listed[name]},
                           BenchmarkResult([float(np.median(samples))], [samples], [1], 0, "", None), record_samples=True)
        doc.save(str(results))


def _check_asv_run(tmp_path, monkeypatch, commits: list[str]) -> asv_gate.Outcome:
    monkeypatch.setattr(asv_gate, "commit_hashes", lambda base, head, config: commits)
    conf = tmp_path / "asv.conf.json"
    conf.write_text('{"repo": ".", "results_dir": "results"}')
    args = argparse.Namespace(base="base", head="head", machine="gt", config=conf, bench=None, factor=1.05, inconclusive="pass")
    return asv_gate.check_stored(args, ASV_CLEAN)


@pytest.mark.parametrize("listed, code", [({}, asv_gate.CLEAN), ({NEW: "2"}, asv_gate.CLEAN), ({NEW: "1"}, asv_gate.FAILURE)],
                         ids=["unlisted", "other-version", "listed"])
def test_an_earlier_runs_benchmark_in_a_results_file_is_not_this_runs(tmp_path, monkeypatch, capsys, listed, code):
    """Gate a..b from a checkout with NewMetricUs, then a..c from one without: a's results file keeps a's NewMetricUs
    (asv's Results.load_data), c's lacks it (before: 'vanished', exit 2). Only the benchmarks of this run's
    benchmarks.json, at the version stored, are compared; the rest are said. Twin: listed at its stored version, it is
    this run's, so the head lost it."""
    key = STEP.split("(")[0]
    _asv_run(tmp_path / "results", ["a" * 40, "b" * 40], {key: "1", NEW: "1"}, [key, NEW])
    _asv_run(tmp_path / "results", ["a" * 40, "c" * 40], {key: "1", **listed}, [key])
    outcome = _check_asv_run(tmp_path, monkeypatch, ["a" * 40, "c" * 40])
    assert outcome.code == code, outcome
    if code == asv_gate.FAILURE:
        assert outcome.failures == [f"{NEW}('b32-l4096', 'gather_cast') (vanished: in the base's results, not in the head's)"]
    else:
        (line,) = [line for line in capsys.readouterr().out.splitlines() if "not compared" in line]
        assert line.startswith("asv-gate: not compared (an earlier run's results") and line.endswith(f": 1 benchmark(s): {NEW}"), line


def test_asvs_own_name_for_a_long_environments_results_is_read(tmp_path, monkeypatch):
    """asv names the results of an environment of 128 or more characters <hash8>-env-<md5>.json (asv.results.get_filename):
    refused as 'a copy asv does not read: move it out' (before). Twin: a renamed copy is still refused, naming asv's name."""
    from asv.results import get_filename

    env = "virtualenv-py3.11-" + "-".join(f"LONG_ENV_VAR_{i}=value{i}" for i in range(8))
    key = STEP.split("(")[0]
    _asv_run(tmp_path / "results", ["a" * 40, "b" * 40], {key: "1"}, [key], env)
    assert _check_asv_run(tmp_path, monkeypatch, ["a" * 40, "b" * 40]).code == asv_gate.CLEAN
    own = tmp_path / "results" / get_filename("gt", "b" * 40, env)
    own.rename(copy := own.with_name(f"{'b' * 8}-{env}.json"))
    outcome = _check_asv_run(tmp_path, monkeypatch, ["a" * 40, "b" * 40])
    assert outcome.code == asv_gate.FAILURE and f"{copy}: holds {own.name}'s results under another name" in outcome.reason, outcome


# interruption (a stand-in asv under a real gate process)

FAKE_ASV = """import os, subprocess, sys, time
from pathlib import Path
# a benchmark in a process group of its own, as asv runs one (asv.util.check_output), which this asv leaves behind
bench = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))", os.environ["SLEEP"]], process_group=0)
print("fake asv: benchmarking", flush=True)
Path(os.environ["MARK"] + ".part").write_text(f"{os.getpid()} {bench.pid}")
os.replace(os.environ["MARK"] + ".part", os.environ["MARK"])
bench.wait()
print("BENCHMARKS NOT SIGNIFICANTLY CHANGED.")
"""


def _running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed and not yet reaped by whoever adopted it, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads processes from Linux's /proc")
@pytest.mark.parametrize("how", ["sigterm", "ctrl-c", None])
def test_an_interrupted_gate_stops_asv_and_its_benchmarks(tmp_path, monkeypatch, how):
    """A cancelled job's SIGTERM to the gate, or Ctrl-C to its process group: asv and the benchmark it runs in a process
    group of its own are stopped (also by an asv that leaves it behind, as this stand-in does), one 'interrupted' line and
    no traceback, exit 130 (before: the gate died of the signal, asv's benchmark ran on). Twin: uninterrupted, the gate
    streams asv's output through to its verdict (a FAILURE here: the stand-in stores no results)."""
    project = tmp_path / "project"
    project.mkdir()
    _in_a_git_project(project, monkeypatch)
    (tmp_path / "fake" / "asv").mkdir(parents=True)
    (tmp_path / "fake" / "asv" / "__init__.py").write_text("")
    (tmp_path / "fake" / "asv" / "__main__.py").write_text(FAKE_ASV)  # `python -m asv`: first on PYTHONPATH
    mark, pids = tmp_path / "mark", []
    env = dict(os.environ, MARK=str(mark), SLEEP="60" if how else "0", PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), str(REPO)]))
    proc = subprocess.Popen([sys.executable, "-m", "ci.asv_gate", "HEAD~1", "HEAD"], cwd=project, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = interrupt_when_marked(proc, mark, how)
        pids = [int(pid) for pid in mark.read_text().split()]
        deadline = time.monotonic() + 10  # SIGKILL is sent, not awaited
        while any(map(_running, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_running, pids)), "asv or its benchmark outlived the gate"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in filter(_running, pids):
            os.kill(pid, signal.SIGKILL)
    if not how:
        assert proc.returncode == asv_gate.FAILURE and "BENCHMARKS NOT SIGNIFICANTLY CHANGED." in stdout and not stderr, stdout + stderr
        return
    assert proc.returncode == 130 and stderr.splitlines() == ["interrupted"] and "Traceback" not in stdout, (proc.returncode, stdout, stderr)
