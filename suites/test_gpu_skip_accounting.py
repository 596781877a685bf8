"""On a GPU runner (--gpu-runner, set by gpu-correctness.yml) no skipped gpu test counts as passing: a skip must be
declared in suites/gpu/expected_skips.toml (reason, GPU, why), anything else fails the session, and a test process
that ran no gpu test fails the binding proof. On a CPU machine gpu tests still skip cleanly (suites/plugins/gpu_skips.py).

Before, `MLA_HARNESS_STRICT_SKIPS=1 pytest suites/gpu -m gpu --binding-proof DIR` on a machine without a usable GPU
gave "149 skipped", exit 0 and check.json "ok": true: on the GPU runner an unusable GPU, SGLang not installed or an
arch policy without SM120 went green."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from harness.backends import arch_policy, make_backend
from harness.datafiles import read_toml
from harness.errors import HarnessError
from suites.hang_guard import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]
DROPPED = ("MLA_HARNESS_PASSED_ELSEWHERE", "MLA_HARNESS_STRICT_SKIPS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
           "PYTEST_ADDOPTS", "CUDA_VISIBLE_DEVICES")


def _pytest(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """A pytest session in a child process (no bytecode, no cache: nothing written in the checkout)."""
    environ = {k: v for k, v in os.environ.items() if k not in DROPPED}
    environ.update(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


# --- a simulated GPU runner: gpu-marked tests that skip, the plugin as the root conftest loads it -------------------

CONFTEST = '''
import os

pytest_plugins = ["suites.plugins.gpu_skips"]


def pytest_configure(config):
    from suites.plugins import gpu_skips

    gpu_skips.device_capability = lambda: os.environ.get("FAKE_CAPABILITY") or None  # the GPU this "runner" has
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")
'''

TESTS = '''
import os

import pytest

pytestmark = pytest.mark.gpu


def test_runs():
    pass


@pytest.mark.parametrize("kernel", ["fa3", "fa2"])
def test_kernel(kernel):
    if kernel == "fa3":
        pytest.skip("--kernel: fa3 does not run on SM120: policy lists fa2")


def test_maybe_unexpected():
    if os.environ.get("UNEXPECTED"):
        pytest.skip("sglang_flashinfer: No module named 'sglang'")


def test_also_runs():
    pass


def test_xfails():
    pytest.xfail("an expected failure is no skip")
'''

DECLARED = '''
[[skip]]
tests = ["test_sim.py::test_kernel[fa3]"]
reason = "^--kernel: fa3 does not run on SM120: policy lists fa2$"
capabilities = ["12.0"]
why = "fa3 is SM90 code"
'''


@pytest.fixture
def runner(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_sim.py").write_text(TESTS)
    (tmp_path / "declared.toml").write_text(DECLARED)

    def run(*args: str, **env: str) -> subprocess.CompletedProcess:
        return _pytest([*args, "--gpu-expected-skips", str(tmp_path / "declared.toml")], tmp_path, **env)

    return run


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_gpu_runner_session_with_only_declared_skips_passes(runner, xdist):
    proc = runner("--gpu-runner", *xdist, FAKE_CAPABILITY="12.0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 declared skip(s)" in proc.stdout and "4 passed, 1 skipped, 1 xfailed" in proc.stdout, proc.stdout


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_an_undeclared_gpu_skip_fails_a_gpu_runner_session(runner, xdist):
    proc = runner("--gpu-runner", *xdist, FAKE_CAPABILITY="12.0", UNEXPECTED="1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED: 1 gpu test(s) skipped on this GPU runner without a declared reason" in proc.stdout, proc.stdout
    assert "  test_sim.py::test_maybe_unexpected [GPU 12.0]: sglang_flashinfer: No module named 'sglang'" in proc.stdout


@pytest.mark.parametrize(("capability", "shown"), [("9.0", "GPU 9.0"), ("", "GPU none usable")])
def test_a_declared_reason_on_another_gpu_or_none_fails(runner, capability, shown):
    """fa3's skip is declared for SM120: on SM90 (where fa3 runs) or a worker without a usable GPU it is no excuse."""
    proc = runner("--gpu-runner", FAKE_CAPABILITY=capability)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"  test_sim.py::test_kernel[fa3] [{shown}]: --kernel: fa3 does not run on SM120" in proc.stdout, proc.stdout


def test_a_module_skipped_at_collection_fails_a_gpu_runner_session(runner, tmp_path):
    (tmp_path / "test_needs_triton.py").write_text("import pytest\npytest.importorskip('no_such_module_here')\n")
    proc = runner("--gpu-runner", FAKE_CAPABILITY="12.0")
    assert proc.returncode == 1 and "  test_needs_triton.py [GPU none usable]: could not import" in proc.stdout, proc.stdout


def test_without_the_switch_gpu_skips_stay_plain_skips(runner, tmp_path):
    """A CPU machine (or a developer's session): no accounting, a malformed declaration is not even read."""
    (tmp_path / "declared.toml").write_text("not toml [")
    proc = runner(FAKE_CAPABILITY="", UNEXPECTED="1")
    assert proc.returncode == 0 and "2 skipped" in proc.stdout and "gpu runner" not in proc.stdout, proc.stdout
    proc = runner("--gpu-runner")
    assert proc.returncode == 4 and "--gpu-runner: " in proc.stderr and "malformed TOML" in proc.stderr, proc.stderr


# --- the real suite: a GPU runner whose GPU is unusable (here: no GPU at all) -------------------------------------------

def test_the_gpu_suite_on_a_runner_without_a_usable_gpu_fails(tmp_path):
    """The audit's run: every gpu test skipped with "needs a CUDA GPU" and each bound worker ran no gpu test. With
    --gpu-runner both fail the session; without it (a CPU machine) the same run stays green, as before."""
    proof = tmp_path / "proof"
    proc = _pytest(["suites/gpu", "-m", "gpu", "-n", "2", "--gpu-runner", "--binding-proof", str(proof)], REPO,
                   MLA_HARNESS_NUM_GPUS="2", MLA_HARNESS_STRICT_SKIPS="1")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu test(s) skipped on this GPU runner without a declared reason" in proc.stdout
    assert "suites/gpu/test_sglang_gpu.py::test_sglang_fa3_names_sgl_kernel [GPU none usable]: needs a CUDA GPU" in proc.stdout
    check = json.loads((proof / "check.json").read_text())
    assert not check["ok"] and {"gw0: ran no gpu test", "gw1: ran no gpu test"} <= set(check["problems"]), check
    proof2 = tmp_path / "proof2"
    proc = _pytest(["suites/gpu", "-m", "gpu", "--binding-proof", str(proof2)], REPO, MLA_HARNESS_STRICT_SKIPS="1")
    assert proc.returncode == 0 and " skipped" in proc.stdout, proc.stdout[-3000:]
    assert json.loads((proof2 / "check.json").read_text())["ok"]


def test_the_gpu_workflow_runs_as_a_gpu_runner():
    doc = yaml.safe_load((REPO / ".github" / "workflows" / "gpu-correctness.yml").read_text())
    (run,) = [s["run"] for s in doc["jobs"]["gpu-suites"]["steps"] if "pytest suites/gpu" in s.get("run", "")]
    assert "--gpu-runner" in run and "--binding-proof" in run, run


# --- the declaration ------------------------------------------------------------------------------------------------

def _plugin():
    from suites.plugins import gpu_skips  # here, not at the top: the simulated sessions above run without it

    return gpu_skips


def _collected_gpu_tests() -> list[str]:
    proc = _pytest(["suites/gpu", "-m", "gpu", "--collect-only"], REPO)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_every_declared_skip_names_collected_gpu_tests():
    """A renamed test leaves no stale entry behind (nor a pattern that covers nothing)."""
    declared = _plugin().load()
    assert declared and all(e.why.strip() for e in declared)
    collected = _collected_gpu_tests()
    for entry in declared:
        for pattern in entry.tests:
            assert any(_plugin()._pattern(pattern).fullmatch(n) for n in collected), f"{pattern} names no collected test"


@pytest.mark.parametrize(("text", "where"), [
    ('[[skip]]\ntests = ["a"]\nreason = "x"\n', "skip[0].why"),
    ('[[skip]]\ntests = []\nreason = "x"\nwhy = "y"\n', "skip[0].tests"),
    ('[[skip]]\ntests = ["a"]\nreason = "("\nwhy = "y"\n', "skip[0].reason"),
    ('[[skip]]\ntests = ["a"]\nreason = "x"\nwhy = "y"\ncapabilities = ["sm120"]\n', "skip[0].capabilities"),
    ('[[skip]]\ntests = ["a"]\nreason = "x"\nwhy = "y"\narch = "12.0"\n', "skip[0]"),
    ('skip = 1\n', "skip"),
])
def test_a_malformed_declaration_is_refused(tmp_path, text, where):
    (tmp_path / "d.toml").write_text(text)
    with pytest.raises(HarnessError, match=re.escape(f"d.toml: {where}")):
        _plugin().load(tmp_path / "d.toml")


def test_node_id_patterns_take_brackets_literally():
    pattern = _plugin()._pattern("suites/gpu/x.py::t[fa3-*]")
    assert pattern.fullmatch("suites/gpu/x.py::t[fa3-stock]") and not pattern.fullmatch("suites/gpu/x.py::t[fa2-stock]")
    assert not pattern.fullmatch("suites/gpu/x.py::tf")


def _skip_reason(kernel: str, capability: tuple[int, int], monkeypatch, policy: arch_policy.ArchPolicy | None = None):
    """What flashinfer_or_skip skips with for `kernel` on a GPU of `capability` (None: it does not skip)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    if policy is not None:
        monkeypatch.setattr(arch_policy, "default_policy", lambda: policy)
    try:
        make_backend("flashinfer", torch.device("cuda"), kernel)
    except HarnessError as exc:
        return str(exc)
    return None


def _declared(nodeid: str, reason: str, capability: str | None) -> bool:
    return _plugin().expected(_plugin().load(), nodeid, reason, capability) is not None


REPLAY = "suites/gpu/test_gpu_bucket_replay.py::test_bucket_replay_matches_the_eager_steps"


def test_the_runner_architecture_skips_fa3_only_and_an_edited_policy_is_not_excused(monkeypatch):
    """SM120: fa3 skips with the policy's line (declared), fa2 runs. An arch_policy.toml without SM120 makes fa2 skip
    too, and neither reason is declared: the GPU runner fails instead of skipping every FlashInfer test."""
    fa3 = _skip_reason("fa3", (12, 0), monkeypatch)
    assert _skip_reason("fa2", (12, 0), monkeypatch) is None
    assert _declared(f"{REPLAY}[fa3-stock]", fa3, "12.0")
    assert _declared("suites/gpu/test_gpu_correctness.py::test_prod_strategies_match_golden[glm5-tp8.prod.b1-l500-fa3]", fa3, "12.0")
    assert not _declared(f"{REPLAY}[fa3-stock]", fa3, "9.0")  # fa3 runs on SM90: its skip there is no excuse
    table = read_toml(arch_policy.POLICY_PATH)
    del table["arch"]["sm120"]
    edited = arch_policy.ArchPolicy(table, "arch_policy.toml without sm120")
    for kernel in ("fa2", "fa3"):
        reason = _skip_reason(kernel, (12, 0), monkeypatch, edited)
        assert reason is not None and not _declared(f"{REPLAY}[{kernel}-stock]", reason, "12.0"), reason


def test_native_fp8_is_excused_on_sm120_only_where_declared(monkeypatch):
    from harness.backends import flashinfer
    from harness.strategies import REGISTRY

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    monkeypatch.setattr(flashinfer, "_import_error", lambda: None)  # FlashInfer installed, as on the runner
    device = torch.device("cuda")
    reason = REGISTRY["native_fp8"].unsupported_reason(device, make_backend("flashinfer", device, "fa2"))
    assert reason and _declared(f"{REPLAY}[fa2-native_fp8]", reason, "12.0")
    assert _declared("suites/gpu/test_perf.py::test_decode_step[native_fp8]", reason, "12.0")
    assert not _declared("suites/gpu/test_perf.py::test_decode_step[stock]", reason, "12.0")
    assert not _declared(f"{REPLAY}[fa2-native_fp8]", reason, "9.0")


@pytest.mark.parametrize("nodeid", ["suites/gpu/test_sglang_gpu.py::test_sglang_fa3_names_sgl_kernel",
                                    f"{REPLAY}[fa2-sglang_fa3]", "suites/gpu/test_kernels_gpu.py::test_cast_all_codes[cuda]"])
def test_a_missing_package_or_gpu_is_never_excused(nodeid):
    for reason in ("needs a CUDA GPU: torch.cuda.is_available() is False on this machine", "needs a CUDA GPU",
                   "sglang_fa3: No module named 'sglang'", "could not import 'triton': No module named 'triton'"):
        for capability in ("12.0", "9.0", None):
            assert not _declared(nodeid, reason, capability), (reason, capability)


def test_sglang_fa3_behind_the_stand_in_is_excused_on_every_gpu():
    reason = ("sglang_fa3: FlashAttentionBackend's FA3 kernels live in sgl_kernel.flash_attn, and sgl_kernel here is "
              "the harness's import-time stand-in (install the sgl-kernel wheel)")  # its unsupported_reason
    for capability in ("12.0", "9.0"):
        assert _declared(f"{REPLAY}[fa2-sglang_fa3]", reason, capability)
        assert _declared("suites/gpu/test_perf.py::test_decode_step[sglang_fa3]", reason, capability)
    assert not _declared(f"{REPLAY}[fa2-sglang_fa3]", reason, None)
