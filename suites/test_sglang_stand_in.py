"""The sgl_kernel import-time stand-in (harness/integrations/sglang/stand_in.py) and the reasons the
SGLang-backed strategies give without SGLang; each check beside a planted twin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.integrations.sglang import runtime, stand_in
from harness.strategies import REGISTRY
from suites.hang_guard import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_sgl_kernel():
    """No sgl_kernel module, stand-in or finder before and after the test."""
    saved = {n: m for n, m in sys.modules.items() if n == "sgl_kernel" or n.startswith("sgl_kernel.")}
    for name in saved:
        del sys.modules[name]
    stand_in.uninstall()
    yield
    stand_in.uninstall()
    for name in [n for n in sys.modules if n == "sgl_kernel" or n.startswith("sgl_kernel.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def assert_stand_in_in_place() -> None:
    """`from sgl_kernel.flash_attn import f` imports; calling f raises one error naming it."""
    from sgl_kernel.flash_attn import flash_attn_with_kvcache

    assert stand_in.is_stand_in("sgl_kernel") and stand_in.is_stand_in("sgl_kernel.flash_attn")
    with pytest.raises(stand_in.StandInCalled) as err:
        flash_attn_with_kvcache(torch.zeros(1))
    assert str(err.value).startswith("sgl_kernel.flash_attn.flash_attn_with_kvcache was called")
    assert "\n" not in str(err.value)
    from sgl_kernel.scalar_type import scalar_types  # attributes of a name are names (used at import time)

    with pytest.raises(stand_in.StandInCalled, match="^sgl_kernel.scalar_type.scalar_types.uint4b8 was called"):
        scalar_types.uint4b8()


def test_stand_in_imports_and_every_call_names_itself(clean_sgl_kernel):
    if stand_in.real_available():
        pytest.skip("a real sgl_kernel is installed here")
    assert stand_in.install()
    assert_stand_in_in_place()
    stand_in.uninstall()
    assert "sgl_kernel" not in sys.modules
    with pytest.raises(ImportError):
        import sgl_kernel  # noqa: F401


def test_stand_in_check_catches_a_silent_stand_in(clean_sgl_kernel, monkeypatch):
    """Twin: a stand-in whose functions return instead of raising fails the check."""
    if stand_in.real_available():
        pytest.skip("a real sgl_kernel is installed here")
    monkeypatch.setattr(stand_in, "_function", lambda qualname: (lambda *a, **k: None))
    stand_in.install()
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        assert_stand_in_in_place()


def test_a_real_sgl_kernel_wins(clean_sgl_kernel, tmp_path, monkeypatch):
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert stand_in.real_available()
    assert not stand_in.install()  # nothing installed over the real module
    import sgl_kernel

    assert sgl_kernel.REAL and not stand_in.is_stand_in("sgl_kernel")


def test_without_sglang_the_strategies_say_so(monkeypatch):
    from harness.backends import make_backend

    real_find_spec = runtime.importlib.util.find_spec
    monkeypatch.setattr(runtime.importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real_find_spec(name, *a))
    runtime.import_failure.cache_clear()
    try:
        cpu = torch.device("cpu")
        reason = REGISTRY["sglang_flashinfer"].unsupported_reason(cpu, make_backend("torch", cpu))
        assert reason == f"sglang_flashinfer: sglang is not installed ({runtime.INSTALL_HINT})"
        assert REGISTRY["sglang_fa3"].unsupported_reason(cpu, make_backend("torch", cpu)) == "sglang_fa3 runs on cuda only"
    finally:
        runtime.import_failure.cache_clear()


def test_sglang_backed_strategies_run_only_when_named():
    from harness.strategies import BENCHMARKED, ORDER, RUN_DEFAULT

    ours = {"sglang_flashinfer", "sglang_fa3"}
    assert not ours & set(BENCHMARKED) and not ours & set(RUN_DEFAULT) and ours <= set(ORDER)
    assert REGISTRY["sglang_flashinfer"].tier == "bitwise"


def test_a_failed_import_names_its_own_error_every_time(tmp_path, monkeypatch):
    """A package whose __init__ raises after importing a namespace subpackage (as sglang 0.5.20's does on a missing
    torchvision.io: its sglang.srt has no __init__.py) must give every later import the same reason, naming the
    missing module, not KeyError: 'brokenpkg' from the first attempt's leftover submodule."""
    pkg = tmp_path / "brokenpkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import brokenpkg.sub.leaf\nimport missing_dep_of_brokenpkg\n")
    (pkg / "sub" / "leaf.py").write_text("")
    (pkg / "sub" / "other.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    real_find_spec = runtime.importlib.util.find_spec
    monkeypatch.setattr(runtime.importlib.util, "find_spec", lambda name, *a: True if name == "sglang" else real_find_spec(name, *a))
    runtime.import_failure.cache_clear()
    try:
        reasons = [runtime.import_reason(m) for m in ("brokenpkg.sub.leaf", "brokenpkg.sub.other", "brokenpkg")]
    finally:
        runtime.import_failure.cache_clear()
        for name in [n for n in sys.modules if n == "brokenpkg" or n.startswith("brokenpkg.")]:
            del sys.modules[name]
    assert all("No module named 'missing_dep_of_brokenpkg'" in r for r in reasons), reasons


class _Context:
    """A stand-in for SGLang's ParallelContext: `fields` known (reading one unpublished raises `unset`), others unknown."""

    def __init__(self, fields, unset):
        self.fields, self.unset = fields, unset

    def __getattr__(self, name):
        if name in self.__dict__.get("fields", ()):
            raise self.unset(f"{name} is not published")
        raise AttributeError(name)


@pytest.mark.parametrize("fields, unset, want", [
    (set(runtime.SINGLE_RANK), RuntimeError, set(runtime.SINGLE_RANK)),  # sglang 0.5.20+: every field, none published
    ({"attn_tp_size"}, AssertionError, {"attn_tp_size"}),  # sglang 0.5.15: no decode-context-parallel fields
])
def test_single_rank_overrides_only_the_fields_sglang_has(fields, unset, want):
    assert set(runtime.single_rank_fields(_Context(fields, unset))) == want


BACKEND_SOURCES = {  # the MLA backend module of a user's SGLang: (its source, SGLang's own fault?)
    "syntax error": ("def forward_decode(:\n", True),
    "a name SGLang no longer has": ("from sglang.srt.gone import planner\n", True),
    "raises at import": ("raise RuntimeError('patched badly')\n", True),
    "exits 0 at import": ("import sys\nsys.exit(0)\n", True),  # ended the run with exit 0 and nothing checked
    "exits 3 at import": ("import sys\nsys.exit(3)\n", True),
    "a dependency missing": ("import sgl_kernel_dependency_nobody_has\n", False),  # the twin: an environment lack
}


@pytest.mark.parametrize("case", BACKEND_SOURCES)
def test_a_broken_sglang_is_an_error_not_unsupported(tmp_path, case):
    """A user's SGLang whose patched flashinfer_mla_backend.py does not import (a syntax error) gave sglang_flashinfer
    an unsupported verdict, and `run --strategy stock --strategy sglang_flashinfer` exited 0: a broken SGLang commit
    passed. SGLang's own failure is now no unsupported reason: `load` raises it, an error verdict, exit 1; a missing
    dependency stays unsupported (exit 0: that run checks stock)."""
    source, own = BACKEND_SOURCES[case]
    module = tmp_path / "sglang" / "srt" / "layers" / "attention" / "flashinfer_mla_backend.py"
    module.parent.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    module.write_text(source)
    probe = ("from harness.errors import HarnessError\nfrom harness.integrations.sglang import runtime\n"
             "print('reason:', runtime.import_reason(runtime.MLA_BACKEND))\n"
             "try:\n    runtime.load(runtime.MLA_BACKEND)\nexcept HarnessError as e:\n    print('load:', e)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=HANG_GUARD_S)
    reason, load = out.stdout.splitlines()
    assert ("reason: None" == reason) == own, out.stdout + out.stderr
    assert "is not importable" in load and ("raised by SGLang's own code" in load) == own
    run = subprocess.run([sys.executable, "-m", "harness", "run", "--strategy", "stock", "--strategy", "sglang_flashinfer"],
                         capture_output=True, text=True, env={**env, "TRITON_INTERPRET": "1"}, cwd=tmp_path, timeout=600)
    assert run.returncode == (1 if own else 0), run.stdout[-2000:] + run.stderr[-2000:]


def test_a_broken_sglang_package_is_named_in_the_verdict(tmp_path):
    """A user's SGLang whose own `sglang/__init__.py` does not import: sglang_flashinfer's setup imported SGLang's parallel
    context first, outside `runtime.load`, so the error verdict read only `SyntaxError: invalid syntax (__init__.py, line 1)`,
    naming neither SGLang nor its module. Now the backend is loaded first: the verdict says SGLang's own code raised it."""
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("def broken(:\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "CUDA_VISIBLE_DEVICES": "",
           "TRITON_INTERPRET": "1"}
    out = tmp_path / "run.json"
    run = subprocess.run([sys.executable, "-m", "harness", "run", "--scenario", "b1-l500", "--layers", "2", "--repeats", "0",
                          "--strategy", "sglang_flashinfer", "--json", str(out)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=HANG_GUARD_S)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    import json

    (verdict,) = [r for r in json.loads(out.read_text())["rows"] if r["strategy"] == "sglang_flashinfer" and r["metric"] == "verdict"]
    assert verdict["value"] == "error", verdict
    reason = verdict["detail"]["reason"]
    assert "SyntaxError" in reason and "raised by SGLang's own code" in reason and runtime.MLA_BACKEND in reason, reason
