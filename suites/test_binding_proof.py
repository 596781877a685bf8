"""`suites.plugins.binding_proof` on CPU: the check over worker records, the NVML / nvidia-smi probes,
and `--binding-proof` end to end under real xdist with a fake GPU inventory (planted twins must fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suites.hang_guard import HANG_GUARD_S
from suites.plugins.binding_proof import (
    NvmlProbe,
    Record,
    check,
    expected_uuids,
    normalize_uuid,
    parse_smi_csv,
    resolve,
)

REPO = Path(__file__).resolve().parents[1]
GPUS = {"0": "aaaa-01", "1": "bbbb-02"}


def rec(worker, bound, ran_on, contexts=(), visible_count=1):
    return Record(worker, 100 + len(worker), bound, visible_count, {u: 3 for u in ran_on},
                  None if contexts is None else list(contexts), "fake")


def test_one_worker_per_gpu_passes():
    records = [rec("gw0", "0", ["aaaa-01"], ["aaaa-01"]), rec("gw1", "1", ["bbbb-02"], ["bbbb-02"])]
    verdict = check(records, expected_uuids({"gw0": "0", "gw1": "1"}, GPUS), GPUS.values())
    assert verdict.ok, verdict.problems
    assert verdict.ran_on == {"gw0": "aaaa-01", "gw1": "bbbb-02"}


def test_negative_control_twin_workers_on_one_gpu_fail():
    records = [rec("gw0", "0", ["aaaa-01"], ["aaaa-01"]), rec("gw1", "1", ["aaaa-01"], ["aaaa-01"])]
    verdict = check(records, expected_uuids({"gw0": "0", "gw1": "1"}, GPUS), GPUS.values())
    assert "gw1: bound to 1 (bbbb-02) but ran on aaaa-01" in verdict.problems
    assert "gw0, gw1 all ran on aaaa-01" in verdict.problems


def test_negative_control_twin_fails_even_when_bindings_cannot_be_resolved():
    records = [rec("gw0", "0", ["aaaa-01"]), rec("gw1", "1", ["aaaa-01"])]
    verdict = check(records, {"gw0": None, "gw1": None}, set())
    assert verdict.problems == ["gw0, gw1 all ran on aaaa-01"]


def test_unbound_process_with_several_contexts_is_noted():
    verdict = check([rec("master", None, ["aaaa-01"], ["aaaa-01", "bbbb-02"], visible_count=2)], {"master": None}, GPUS.values())
    assert verdict.ok and verdict.notes == ["master: not bound to a GPU; CUDA contexts also on bbbb-02"]


def test_negative_control_context_on_a_foreign_gpu_fails():
    records = [rec("gw0", "0", ["aaaa-01"], ["aaaa-01", "bbbb-02"]), rec("gw1", "1", ["bbbb-02"], ["bbbb-02"])]
    verdict = check(records, expected_uuids({"gw0": "0", "gw1": "1"}, GPUS), GPUS.values())
    assert verdict.problems == ["gw0: CUDA context on GPU(s) it does not own: bbbb-02"]


@pytest.mark.parametrize("records, problem", [
    ([rec("gw0", "0", ["aaaa-01"])], "gw1: wrote no record"),
    ([rec("gw0", "0", ["aaaa-01", "bbbb-02"]), rec("gw1", "1", [])], "gw0: ran gpu tests on 2 GPUs: aaaa-01, bbbb-02"),
    ([rec("gw0", "0", ["aaaa-01"], visible_count=2), rec("gw1", "1", [])], "gw0: bound to 0 but its CUDA runtime saw 2 devices"),
    ([rec("gw0", None, ["cccc-03"]), rec("gw1", None, [])], "gw0: ran on cccc-03, which the parent's CUDA_VISIBLE_DEVICES does not list"),
])
def test_negative_control_other_binding_faults(records, problem):
    verdict = check(records, {"gw0": None, "gw1": None}, GPUS.values())
    assert problem in verdict.problems


def test_a_worker_that_ran_no_gpu_test_fails_on_a_gpu_runner():
    """On a GPU runner (--gpu-runner) a bound worker that ran no gpu test (its GPU unusable, every test skipped) is a
    problem; elsewhere (a CPU machine, a developer's box) it stays a note."""
    records = [rec("gw0", "0", ["aaaa-01"], ["aaaa-01"]), rec("gw1", "1", [], [])]
    expected = expected_uuids({"gw0": "0", "gw1": "1"}, GPUS)
    verdict = check(records, expected, GPUS.values(), require_gpu_tests=True)
    assert verdict.problems == ["gw1: ran no gpu test"] and not verdict.ok
    verdict = check(records, expected, GPUS.values())
    assert verdict.ok and verdict.notes == ["gw1: ran no gpu test"]


def test_more_workers_than_gpus_share_as_planned():
    assignment = {"gw0": "0", "gw1": "1", "gw2": "0"}
    records = [rec("gw0", "0", ["aaaa-01"]), rec("gw1", "1", ["bbbb-02"]), rec("gw2", "0", ["aaaa-01"])]
    assert check(records, expected_uuids(assignment, GPUS), GPUS.values()).ok


def test_unverifiable_contexts_are_a_note_not_a_pass_in_silence():
    verdict = check([Record("master", 7, None, 2, {"aaaa-01": 4}, None, "nvml: pid 7 not listed")],
                    {"master": None}, GPUS.values())
    assert verdict.ok
    assert verdict.notes == ["master: contexts not verified (nvml: pid 7 not listed); its CUDA runtime saw 2 device(s)"]


@pytest.mark.parametrize("entry, expected", [
    ("1", "bbbb-02"), ("GPU-AAAA", "aaaa-01"), ("GPU-bbbb-02", "bbbb-02"), ("5", None), ("GPU-", None), ("MIG-1", None),
])
def test_resolve_cuda_visible_entries(entry, expected):
    assert resolve(entry, GPUS) == expected


def test_nvidia_smi_probe_parses_uuids_and_contexts():
    outputs = {
        "--query-gpu=index,uuid": "0, GPU-AAAA-01\n1, GPU-BBBB-02\n",
        "--query-compute-apps=pid,gpu_uuid": "4242, GPU-AAAA-01\n4243, GPU-BBBB-02\n4242, GPU-BBBB-02\n",
    }
    probe = NvmlProbe(smi=lambda query: outputs[query])
    probe.source = "nvidia-smi"
    assert probe.gpu_uuids() == GPUS
    record = Record("gw0", 4242, "0", ran_on={"aaaa-01": 1})
    record.finish(probe)
    assert record.contexts == ["aaaa-01", "bbbb-02"] and record.context_probe == "nvidia-smi"
    assert normalize_uuid("GPU-AbC") == "abc"
    assert parse_smi_csv("No devices were found\n3, x\n, y\n", 2) == [["3", "x"]]


def test_probe_without_a_tool_reports_unavailable():
    def missing(*_):
        raise FileNotFoundError("nvidia-smi")

    probe = NvmlProbe(smi=missing)
    probe.source = "nvidia-smi"
    assert probe.gpu_uuids() == {} and probe.compute_apps() is None
    record = Record("gw0", 1, "0", ran_on={"aaaa-01": 1})
    record.finish(probe)
    assert record.contexts is None and "unavailable" in record.context_probe


FAKE_CONFTEST = """
import os
from suites.plugins import binding_proof

GPUS = {"0": "aaaa-01", "1": "bbbb-02"}


class FakeProbe:
    source = "fake"

    def gpu_uuids(self):
        return dict(GPUS)

    def current_uuid(self):
        if os.environ.get("PLANT") == "twin":
            return "aaaa-01"
        return GPUS.get(os.environ.get("CUDA_VISIBLE_DEVICES"))

    def compute_apps(self):
        apps = [(os.getpid(), self.current_uuid())]
        if os.environ.get("PLANT") == "foreign" and os.environ.get("PYTEST_XDIST_WORKER") == "gw1":
            apps.append((os.getpid(), "aaaa-01"))
        return apps

    def visible_count(self):
        return 1


binding_proof.PROBE = FakeProbe()
"""
GPU_TEST = """
import pytest

@pytest.mark.gpu
def test_on_gpu():
    pass
"""


def _run(tmp_path: Path, plant: str, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers = gpu: fake\n")
    (tmp_path / "conftest.py").write_text(FAKE_CONFTEST)
    (tmp_path / "test_inner.py").write_text(GPU_TEST)
    proof = tmp_path / "proof"
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTEST_XDIST_WORKER")}
    env.update(CUDA_VISIBLE_DEVICES="0,1", PLANT=plant, PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "suites.plugins.gpu_binding",
         "--binding-proof", str(proof), *args, str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )
    return proc, proof


def test_proof_end_to_end_one_worker_per_gpu(tmp_path):
    proc, proof = _run(tmp_path, "", "-n", "2", "--dist", "each")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = json.loads((proof / "check.json").read_text())
    assert verdict["ok"] and verdict["ran_on"] == {"gw0": "aaaa-01", "gw1": "bbbb-02"}
    gw1 = json.loads((proof / "gw1.json").read_text())
    assert gw1["bound"] == "1" and gw1["contexts"] == ["bbbb-02"] and gw1["timeline"]["first_test"] is not None
    assert "PASSED: binding proof" in proc.stdout
    again = subprocess.run(proc.args, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                           timeout=HANG_GUARD_S)
    assert again.returncode == 4 and "holds records of an earlier run" in again.stderr  # never mixes two runs


@pytest.mark.parametrize("plant, problem", [("twin", "gw1: bound to 1 (bbbb-02) but ran on aaaa-01"),
                                            ("foreign", "gw1: CUDA context on GPU(s) it does not own: aaaa-01")])
def test_negative_control_proof_end_to_end_fails_planted_faults(tmp_path, plant, problem):
    proc, proof = _run(tmp_path, plant, "-n", "2", "--dist", "each")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAILED: {problem}" in proc.stdout
    assert problem in json.loads((proof / "check.json").read_text())["problems"]
