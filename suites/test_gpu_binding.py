"""`suites.plugins.gpu_binding` on CPU: worker -> GPU mapping, the per-GPU lock, and the plugin under real xdist."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from suites.hang_guard import HANG_GUARD_S
from suites.plugins.gpu_binding import (
    assert_no_shared_gpu,
    detect_devices,
    device_for_worker,
    exclusive_gpu,
    plan,
    shared_gpus,
    visible_devices,
    worker_index,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("worker_id, expected", [("gw0", 0), ("gw12", 12), ("master", None), (None, None), ("gwx", None)])
def test_worker_index(worker_id, expected):
    assert worker_index(worker_id) == expected


@pytest.mark.parametrize(
    "cuda_visible, num_gpus, expected",
    [
        (None, 8, [str(i) for i in range(8)]),
        (None, 0, []),
        ("2,3,5", 8, ["2", "3", "5"]),
        (" 4 , 6 ", 8, ["4", "6"]),
        ("", 8, []),
        ("GPU-aaaa,GPU-bbbb", 0, ["GPU-aaaa", "GPU-bbbb"]),
    ],
)
def test_visible_devices(cuda_visible, num_gpus, expected):
    assert visible_devices(cuda_visible, num_gpus) == expected


@pytest.mark.parametrize(
    "worker_id, devices, expected",
    [
        ("gw0", ["0", "1", "2", "3"], "0"),
        ("gw3", ["0", "1", "2", "3"], "3"),
        ("gw4", ["0", "1", "2", "3"], "0"),  # more workers than GPUs: wraps around
        ("gw9", ["0", "1", "2", "3"], "1"),
        ("gw1", ["2", "3", "5"], "3"),  # parent's CUDA_VISIBLE_DEVICES: maps into that list
        ("gw5", ["2", "3", "5"], "5"),
        ("gw1", ["GPU-aaaa", "GPU-bbbb"], "GPU-bbbb"),
        ("master", ["0", "1"], None),  # no xdist: no binding
        (None, ["0", "1"], None),
        ("gw0", [], None),  # no GPU: no binding
    ],
)
def test_device_for_worker(worker_id, devices, expected):
    assert device_for_worker(worker_id, devices) == expected


def test_one_worker_per_gpu_shares_nothing():
    assignment = plan(8, visible_devices(None, 8))
    assert sorted(assignment.values()) == [str(i) for i in range(8)]
    assert_no_shared_gpu(assignment)


def test_negative_control_shared_gpu_is_detected():
    assignment = plan(3, ["0", "1"])
    assert shared_gpus(assignment) == {"0": ["gw0", "gw2"]}
    with pytest.raises(AssertionError, match="0: gw0, gw2"):
        assert_no_shared_gpu(assignment)
    with pytest.raises(AssertionError):
        assert_no_shared_gpu({"gw0": "3", "gw1": "3"})


def _hold(device: str, lock_dir: str, out: str, held, release) -> None:
    """Child 1: take the lock, say so, keep it until told, and record when it let go."""
    with exclusive_gpu(device, Path(lock_dir)):
        held.set()
        release.wait(HANG_GUARD_S)
        Path(out).write_text(json.dumps({"released": time.time()}))


def _take(device: str, lock_dir: str, out: str, trying) -> None:
    """Child 2: record when it asked for the lock and when it got it."""
    asked = time.time()
    trying.set()
    with exclusive_gpu(device, Path(lock_dir)):
        Path(out).write_text(json.dumps({"asked": asked, "got": time.time()}))


def _contend(tmp_path: Path, first: str, second: str, second_done_first: bool = False) -> tuple[dict, dict]:
    """`second_done_first`: release the first lock only once the second process has ended (it can only end while
    the first holds its lock if the two locks are independent); else release it 0.3 s after the second asked.
    The waits are hang guards (spawned children start slowly on CI's loaded cores), never speed checks."""
    ctx = multiprocessing.get_context("spawn")
    held, trying, release = ctx.Event(), ctx.Event(), ctx.Event()
    a_out, b_out = tmp_path / "a.json", tmp_path / "b.json"
    a = ctx.Process(target=_hold, args=(first, str(tmp_path / "locks"), str(a_out), held, release))
    a.start()
    assert held.wait(HANG_GUARD_S), "first process never took the lock"
    b = ctx.Process(target=_take, args=(second, str(tmp_path / "locks"), str(b_out), trying))
    b.start()
    assert trying.wait(HANG_GUARD_S)
    if second_done_first:
        b.join(HANG_GUARD_S)
    else:
        time.sleep(0.3)  # the second process is now blocked on the lock (or, if the lock is broken, done)
    release.set()
    for p in (a, b):
        p.join(HANG_GUARD_S)
        assert p.exitcode == 0
    return json.loads(a_out.read_text()), json.loads(b_out.read_text())


def test_lock_blocks_second_process_until_first_releases(tmp_path):
    first, second = _contend(tmp_path, "3", "3")
    assert second["got"] >= first["released"]
    assert second["got"] - second["asked"] >= 0.25


def test_negative_control_different_gpus_do_not_block(tmp_path):
    first, second = _contend(tmp_path, "3", "GPU-4", second_done_first=True)
    assert second["got"] < first["released"]


LOCK_CONFTEST = """
import types

import torch

pytest_plugins = ["suites.plugins.gpu_binding"]


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")
    torch.cuda.is_available = lambda: True  # a GPU of UUID GPU-FA4E-0001 (nothing here touches CUDA)
    torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(uuid="GPU-FA4E-0001")
"""

LOCK_TESTS = """
import os
import subprocess
import sys

import pytest

PROBE = (
    "import sys\\nfrom pathlib import Path\\nimport filelock\\nfrom suites.plugins.gpu_binding import exclusive_gpu\\n"
    "try:\\n    with exclusive_gpu('fa4e-0001', Path(sys.argv[1]), timeout=0):\\n        print('free')\\n"
    "except filelock.Timeout:\\n    print('held')\\n"
)


def _lock_state():
    return subprocess.run([sys.executable, "-c", PROBE, os.environ["MLA_HARNESS_LOCK_DIR"]], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.mark.gpu
def test_gpu_test_holds_its_gpus_lock():
    assert _lock_state() == "held"


def test_other_test_leaves_it_free():
    assert _lock_state() == "free"
"""


def test_every_gpu_test_holds_its_gpus_machine_wide_lock(tmp_path):
    """The lock is taken, not only defined: a gpu test runs holding the lock of its GPU's UUID (another process cannot
    take it), a test that is not gpu-marked does not. Before, `gpu_lock` was a fixture no test requested: timing
    tests of two workers (or sessions) on one GPU overlapped."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(LOCK_CONFTEST)
    (tmp_path / "test_lock.py").write_text(LOCK_TESTS)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    env.update(MLA_HARNESS_LOCK_DIR=str(tmp_path / "locks"), PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path / "test_lock.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout + proc.stderr
    assert (tmp_path / "locks" / "gpu-fa4e-0001.lock").exists()


INNER_TEST = """
import os
from pathlib import Path

def test_record(worker_id):
    Path(os.environ["OUT_DIR"], worker_id).write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
    Path(os.environ["OUT_DIR"], worker_id + ".threads").write_text(os.environ.get("OMP_NUM_THREADS", "<unset>"))
    import torch  # first imported here, after the plugin set OMP_NUM_THREADS: its pool takes the share

    Path(os.environ["OUT_DIR"], worker_id + ".torch").write_text(str(torch.get_num_threads()))
"""


def _run_xdist(tmp_path: Path, workers: int, env_extra: dict) -> tuple[subprocess.CompletedProcess, dict]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTEST_XDIST_WORKER", "OMP_NUM_THREADS")}
    env.update(env_extra, OUT_DIR=str(out_dir), PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "suites.plugins.gpu_binding",
         "-n", str(workers), "--dist", "each", str(tmp_path / "test_inner.py")],  # each: every worker runs it
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )
    return proc, {p.name: p.read_text() for p in out_dir.iterdir() if not p.suffix}


def test_plugin_binds_xdist_workers_into_parent_mask(tmp_path):
    proc, seen = _run_xdist(tmp_path, 3, {"CUDA_VISIBLE_DEVICES": "5,7"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seen == {"gw0": "5", "gw1": "7", "gw2": "5"}
    share = str(max(1, len(os.sched_getaffinity(0)) // 3))  # each worker: its third of the cores
    assert {p.name: p.read_text() for p in (tmp_path / "out").glob("*.threads")} == {
        f"gw{i}.threads": share for i in range(3)}
    assert {p.name: p.read_text() for p in (tmp_path / "out").glob("*.torch")} == {f"gw{i}.torch": share for i in range(3)}
    assert "gpu_binding: gw0->5, gw1->7, gw2->5 (more workers than GPUs" in proc.stdout


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"MLA_HARNESS_NUM_GPUS": "3"}, ["0", "1", "2"]),
        ({"CUDA_VISIBLE_DEVICES": "1,4", "MLA_HARNESS_NUM_GPUS": "8"}, ["1", "4"]),
        ({}, None),  # falls through to torch.cuda.device_count() (0 on CPU torch)
    ],
)
def test_controller_detects_devices(monkeypatch, env, expected):
    for name in ("CUDA_VISIBLE_DEVICES", "MLA_HARNESS_NUM_GPUS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if expected is None:
        import torch

        expected = [str(i) for i in range(torch.cuda.device_count())]
    assert detect_devices() == expected
