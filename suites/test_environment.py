"""The environment fingerprint names the FlashInfer and SGLang a run imported (a user's own build or checkout),
so `compare` can say which ones each side ran."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

from harness.measure.environment import environment


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


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
