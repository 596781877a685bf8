"""The environment fingerprint names the FlashInfer and SGLang a run imported (a user's own build or checkout),
so `compare` can say which ones each side ran."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

from harness.measure.environment import environment
from suites.hang_guard import HANG_GUARD_S


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True, timeout=HANG_GUARD_S).stdout.strip()


def _package(monkeypatch, name: str, folder, version: str) -> None:
    """`name` as if imported from `folder` (its __init__.py there)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text(f"__version__ = {version!r}\n")
    module = types.ModuleType(name)
    module.__file__, module.__version__ = str(folder / "__init__.py"), version
    monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture
def checkout(tmp_path):
    """An SGLang-shaped git checkout: the package at python/sglang, one commit."""
    repo = tmp_path / "sglang"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "python" / "sglang").mkdir(parents=True)
    (repo / "python" / "sglang" / "__init__.py").write_text("__version__ = '0.5.24.dev0'\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "x")
    return repo


def test_the_imported_sglang_checkout_is_recorded_with_its_commit(monkeypatch, checkout):
    monkeypatch.delenv("MLA_HARNESS_SGLANG_COMMIT", raising=False)
    _package(monkeypatch, "sglang", checkout / "python" / "sglang", "0.5.24.dev0")
    head = _git(checkout, "rev-parse", "HEAD")
    env = environment(torch.device("cpu"))
    assert (env["sglang"], env["sglang_path"], env["sglang_commit"]) == ("0.5.24.dev0", str(checkout / "python" / "sglang"), head)
    (checkout / "python" / "sglang" / "patch.py").write_text("x = 1\n")  # an uncommitted patch
    assert environment(torch.device("cpu"))["sglang_commit"] == f"{head}-dirty"
    monkeypatch.setenv("MLA_HARNESS_SGLANG_COMMIT", "abc123")  # a leftover in the shell: the checkout's HEAD wins
    assert environment(torch.device("cpu"))["sglang_commit"] == f"{head}-dirty"


def test_a_package_inside_another_repository_gets_no_commit(monkeypatch, checkout):
    """Twin: a site-packages sglang inside some other git work tree (a venv in a checkout) is not that tree's HEAD."""
    monkeypatch.delenv("MLA_HARNESS_SGLANG_COMMIT", raising=False)
    _package(monkeypatch, "sglang", checkout / ".venv" / "lib" / "site-packages" / "sglang", "0.5.23")
    env = environment(torch.device("cpu"))
    assert env["sglang"] == "0.5.23" and env["sglang_commit"] is None
    monkeypatch.setenv("MLA_HARNESS_SGLANG_COMMIT", "abc123")  # ci.sglang_gate's install has no .git: it says which commit
    assert environment(torch.device("cpu"))["sglang_commit"] == "abc123"


def test_two_sglang_codes_of_one_version_and_folder_differ_in_the_record(monkeypatch, tmp_path):
    """A patched SGLang without git (edited in site-packages, or a copy first on PYTHONPATH): same version, same folder,
    no commit; the digest of its source tells the patched run from the stock one, and compare names the difference."""
    from harness.gate.compare import machine_differences
    from harness.results.schema import Environment, ResultsFile

    monkeypatch.delenv("MLA_HARNESS_SGLANG_COMMIT", raising=False)
    folder = tmp_path / "site" / "sglang"
    _package(monkeypatch, "sglang", folder, "0.5.23")
    (folder / "srt").mkdir()
    (folder / "srt" / "backend.py").write_text("k_buffer = pool.to(q.dtype)\n")
    stock = environment(torch.device("cpu"))
    (folder / "srt" / "backend.py").write_text("k_buffer = pool.to(q.dtype).roll(1, 0)\n")  # one index off
    patched = environment(torch.device("cpu"))
    assert (stock["sglang"], stock["sglang_path"], stock["sglang_commit"]) == (patched["sglang"], patched["sglang_path"], None)
    assert stock["sglang_digest"] and stock["sglang_digest"] != patched["sglang_digest"]
    files = [ResultsFile(schema="mla-harness-results/5", case=None, rows=[], environment=Environment(**env)) for env in (stock, patched)]
    assert [d.split(":")[0] for d in machine_differences(*files)] == ["sglang_digest"]
    (folder / "srt" / "backend.py").write_text("k_buffer = pool.to(q.dtype)\n")  # twin: the same code again, the same digest
    assert environment(torch.device("cpu"))["sglang_digest"] == stock["sglang_digest"]


def test_no_sglang_imported_records_none_and_flashinfer_as_imported(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    monkeypatch.delenv("MLA_HARNESS_SGLANG_COMMIT", raising=False)
    _package(monkeypatch, "flashinfer", tmp_path / "fi" / "flashinfer", "0.7.4+mypatch")
    env = environment(torch.device("cpu"))
    assert env["sglang"] is env["sglang_commit"] is None
    assert (env["flashinfer"], env["flashinfer_path"]) == ("0.7.4+mypatch", str(tmp_path / "fi" / "flashinfer"))


def test_a_gate_commit_that_did_not_import_is_still_named(monkeypatch):
    """ci.sglang_gate installed a commit whose sglang failed to import: the results still say which commit was tried."""
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    monkeypatch.setenv("MLA_HARNESS_SGLANG_COMMIT", "abc123")
    env = environment(torch.device("cpu"))
    assert (env["sglang"], env["sglang_path"], env["sglang_commit"]) == (None, None, "abc123")


HARNESS = __import__("pathlib").Path(__file__).resolve().parents[1] / "harness"


def _commit_of(pythonpath, **variables) -> str | None:
    """environment()'s git_commit when `harness` is imported from `pythonpath` (a fresh process, variable unset)."""
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k != "MLA_HARNESS_GIT_COMMIT"} | {"PYTHONPATH": str(pythonpath), **variables}
    code = "import json, torch; from harness.measure.environment import environment; print(json.dumps(environment(torch.device('cpu'))['git_commit']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=HANG_GUARD_S, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_git_commit_says_dirty_and_is_none_in_another_projects_repository(tmp_path):
    import shutil

    ignore = shutil.ignore_patterns("__pycache__")
    own, other = tmp_path / "own", tmp_path / "other"
    for repo in (own, other):
        repo.mkdir()
        _git(repo, "init", "-q")
    shutil.copytree(HARNESS, own / "harness", ignore=ignore)  # a checkout of the harness: harness/ at its top
    shutil.copytree(HARNESS, other / "vendor" / "harness", ignore=ignore)  # vendored in another project
    for repo in (own, other):
        _git(repo, "add", ".")
        _git(repo, "commit", "-qm", "x")
    head = _git(own, "rev-parse", "HEAD")
    assert _commit_of(own) == head
    with open(own / "harness" / "errors.py", "a") as f:
        f.write("# a local change\n")
    assert _commit_of(own) == head + "-dirty"
    assert _commit_of(other / "vendor") is None  # not the other project's HEAD
    _git(own, "checkout", "-q", "--", ".")
    assert _commit_of(own) == head  # the __pycache__ folders its imports left are no source
    scenario = own / "harness" / "spec" / "scenarios" / "zz.toml"
    scenario.write_text('name = "zz"\n')  # untracked, yet `--scenario zz` runs it: the commit alone cannot rerun it
    assert _commit_of(own) == head + "-dirty"
    scenario.unlink()
    (own / "golden").mkdir()
    (own / "golden" / "cases.toml").write_text("")
    assert _commit_of(own) == head + "-dirty"


def test_harness_digest_is_the_imported_packages_sources(tmp_path):
    """harness_digest names the code that ran without git (an installed or copied harness): every *.py, *.cu and
    *.toml of the imported package, so an edited kernel or scenario changes it and a byte-compiled file does not."""
    from harness.measure.environment import HARNESS_SOURCES, source_digest

    assert environment(torch.device("cpu"))["harness_digest"] == source_digest(HARNESS, HARNESS_SOURCES)
    (tmp_path / "k").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "k" / "fused.cu").write_text("// kernel\n")
    (tmp_path / "k" / "table.toml").write_text("a = 1\n")
    seen = {source_digest(tmp_path, HARNESS_SOURCES)}
    (tmp_path / "k" / "a.cpython-312.pyc").write_bytes(b"\0")
    assert source_digest(tmp_path, HARNESS_SOURCES) in seen
    for name in ("k/fused.cu", "k/table.toml", "a.py"):
        (tmp_path / name).write_text((tmp_path / name).read_text() + "# edited\n")
        seen.add(source_digest(tmp_path, HARNESS_SOURCES))
    assert len(seen) == 4


def test_environment_names_the_cpu_model_triton_and_harness_version():
    from importlib.metadata import version

    with open("/proc/cpuinfo") as f:
        models = [line.split(":", 1)[1].strip() for line in f if line.split(":")[0].strip() in ("model name", "Model")]
    env = environment(torch.device("cpu"))
    assert env["cpu"] == (models[0] if models else env["cpu"])
    assert env["triton"] == version("triton") and env["harness"] == version("mla-harness")


def test_git_commit_is_the_checkouts_own_under_a_git_dir_of_another_repository(tmp_path):
    """Run from a git hook or under `git --git-dir` of another repository (an SGLang checkout's hook that runs the
    gate), GIT_DIR / GIT_INDEX_FILE point git elsewhere; the commit recorded is still the harness checkout's (before:
    the other repository's HEAD, never -dirty)."""
    import shutil

    own, other = tmp_path / "own", tmp_path / "other"
    for repo in (own, other):
        repo.mkdir()
        _git(repo, "init", "-q")
    shutil.copytree(HARNESS, own / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    _git(own, "add", ".")
    _git(own, "commit", "-qm", "x")
    _git(other, "commit", "-q", "--allow-empty", "-m", "y")
    head = _git(own, "rev-parse", "HEAD")
    with open(own / "harness" / "errors.py", "a") as f:
        f.write("# a local change\n")
    assert _commit_of(own, GIT_DIR=str(other / ".git")) == head + "-dirty"
    assert _commit_of(own, GIT_DIR=str(other / ".git"), GIT_WORK_TREE=str(own)) == head + "-dirty"
    assert _commit_of(own, GIT_INDEX_FILE=str(tmp_path / "no-index")) == head + "-dirty"
