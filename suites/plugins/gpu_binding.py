"""pytest plugin: one GPU per xdist worker, and one gpu test at a time on each GPU.

Under ``pytest -n N`` the controller lists the GPUs once (the parent's
CUDA_VISIBLE_DEVICES entries, else ``MLA_HARNESS_NUM_GPUS``, else the GPUs NVML or
nvidia-smi list, without importing torch or initialising CUDA) and hands the list to every worker; worker gwK then sets
CUDA_VISIBLE_DEVICES to entry K % len(list) in its pytest_configure, before any
test module can touch CUDA. Tests use the ``gpu_device`` fixture (always cuda:0
of what the worker sees). Workers also get CUDA_DEVICE_ORDER=PCI_BUS_ID (unless set),
so an index means what nvidia-smi and NVML say.

Every ``gpu`` test runs (setup, call, teardown) holding its GPU's lock: a file lock named by
the physical GPU's UUID (torch's cuda:0, whatever the mask) in ``MLA_HARNESS_LOCK_DIR``
(default <tmp>/mla-harness-gpu-locks), shared by every worker and every pytest session on the
machine. So a gpu test that times kernels (test_perf.py, the all-reduce stand-in's latency) never
overlaps another harness gpu test on its GPU: not another worker's when there are more workers
than GPUs, nor another session's. With one worker per GPU (CI) the lock is never contended.
GPU work outside these pytest sessions (asv, a `harness run`) does not take it.

``--binding-proof DIR`` proves the binding on real GPUs: every test process records
what it ran on, and the controller checks the records after the workers finish
(suites/plugins/binding_proof.py).
"""

from __future__ import annotations

import functools
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from filelock import FileLock

from harness import envvars
from harness.errors import HarnessError
from suites.plugins import binding_proof, cpu_affinity

ENV_NUM_GPUS = "MLA_HARNESS_NUM_GPUS"
ENV_LOCK_DIR = "MLA_HARNESS_LOCK_DIR"
CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
WORKERINPUT_KEY = "mla_harness_gpus"
PROOF_KEY = "mla_harness_binding_proof"
BOUND = pytest.StashKey[str]()
_DEVICES = pytest.StashKey[list]()
_RECORD = pytest.StashKey[binding_proof.Record]()
_PINNED = pytest.StashKey[list]()
_THREADS = pytest.StashKey[int]()
_VERDICT = pytest.StashKey[binding_proof.Verdict]()


def worker_index(worker_id: str | None) -> int | None:
    """'gw3' -> 3; None or 'master' (no xdist) -> None."""
    match = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(match.group(1)) if match else None


def visible_devices(cuda_visible: str | None, num_gpus: int) -> list[str]:
    """The GPUs a run may use: the parent's CUDA_VISIBLE_DEVICES entries if set, else 0..num_gpus-1."""
    if cuda_visible is None:
        return [str(i) for i in range(num_gpus)]
    return [entry.strip() for entry in cuda_visible.split(",") if entry.strip()]


def device_for_worker(worker_id: str | None, devices: Sequence[str]) -> str | None:
    """The CUDA_VISIBLE_DEVICES entry worker `worker_id` binds to, or None (no xdist, or no GPU)."""
    index = worker_index(worker_id)
    if index is None or not devices:
        return None
    return devices[index % len(devices)]


def plan(num_workers: int, devices: Sequence[str]) -> dict[str, str]:
    """worker id -> device entry for a whole ``-n num_workers`` run."""
    if not devices:
        return {}
    return {f"gw{i}": device_for_worker(f"gw{i}", devices) for i in range(num_workers)}


def shared_gpus(assignment: Mapping[str, str]) -> dict[str, list[str]]:
    """Devices that more than one worker is bound to, with those workers."""
    by_device: dict[str, list[str]] = {}
    for worker, device in assignment.items():
        by_device.setdefault(device, []).append(worker)
    return {device: workers for device, workers in by_device.items() if len(workers) > 1}


def assert_no_shared_gpu(assignment: Mapping[str, str]) -> None:
    """Fail when two workers would time kernels on one GPU."""
    shared = shared_gpus(assignment)
    assert not shared, "workers share a GPU: " + "; ".join(f"{d}: {', '.join(w)}" for d, w in sorted(shared.items()))


def lock_dir() -> Path:
    return Path(os.environ.get(ENV_LOCK_DIR) or Path(tempfile.gettempdir()) / "mla-harness-gpu-locks")


@contextmanager
def exclusive_gpu(device: str, directory: Path | None = None, timeout: float = -1) -> Iterator[Path]:
    """Hold the machine-wide lock of GPU `device` (its UUID: gpu_lock_key); yields the lock path."""
    directory = lock_dir() if directory is None else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', device)}.lock"
    with FileLock(path, timeout=timeout):
        yield path


def detect_devices() -> list[str]:
    """The run's GPU list: CUDA_VISIBLE_DEVICES, else MLA_HARNESS_NUM_GPUS, else NVML's count (torch's
    when NVML and nvidia-smi find none)."""
    try:
        count = envvars.read(ENV_NUM_GPUS)  # an integer 1..1024, declared in harness/envvars.py
    except HarnessError as exc:
        raise pytest.UsageError(str(exc)) from None
    cuda_visible = os.environ.get(CUDA_VISIBLE)
    if cuda_visible is None and count is None:
        count = len(binding_proof.PROBE.gpu_uuids())  # NVML / nvidia-smi: the controller never imports torch
        if not count:
            import torch

            count = torch.cuda.device_count()
    return visible_devices(cuda_visible, count or 0)


def _controller_devices(config: pytest.Config) -> list[str]:
    if _DEVICES not in config.stash:
        config.stash[_DEVICES] = detect_devices()
    return config.stash[_DEVICES]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("gpu binding").addoption(
        "--binding-proof", metavar="DIR", default=None,
        help="record per test process the GPU it ran on and its CUDA contexts in DIR (an empty folder), "
             "and fail the session unless workers own their GPUs one-to-one")
    parser.getgroup("gpu binding").addoption(
        "--pin-cpus", action="store_true", default=False,
        help="xdist workers: pin each to its GPU's NUMA-local cores and one torch thread")


def _proof_dir(config: pytest.Config) -> Path | None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return Path(workerinput[PROOF_KEY]) if workerinput.get(PROOF_KEY) else None
    option = config.getoption("binding_proof", None)
    return Path(option).resolve() if option else None


def _workers(config: pytest.Config) -> int:
    """xdist workers this (controller) process starts; 0 without xdist or inside a worker."""
    return 0 if hasattr(config, "workerinput") else len(config.getoption("tx", None) or [])


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: hand every worker the one GPU list (and the proof folder)."""
    node.workerinput[WORKERINPUT_KEY] = ",".join(_controller_devices(node.config))
    proof = _proof_dir(node.config)
    node.workerinput[PROOF_KEY] = str(proof) if proof else ""


def pytest_configure(config: pytest.Config) -> None:
    """xdist worker: bind to one GPU before anything initialises CUDA. Any test process: start its proof record."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and WORKERINPUT_KEY in workerinput:
        _bind(config, workerinput)
    proof = _proof_dir(config)
    if proof is None:
        return
    if workerinput is None:  # the controller, or the one process without xdist
        proof.mkdir(parents=True, exist_ok=True)
        if any(proof.glob("*.json")):
            raise pytest.UsageError(f"--binding-proof {proof}: holds records of an earlier run; give an empty folder")
    if _workers(config) == 0:
        worker = workerinput["workerid"] if workerinput is not None else "master"
        record = binding_proof.Record(worker, os.getpid(), config.stash.get(BOUND, None),
                                      pinned_cpus=config.stash.get(_PINNED, None),
                                      torch_threads=config.stash.get(_THREADS, None))
        record.timeline["process_start"] = binding_proof.process_start_time()
        record.timeline["configured"] = time.time()
        config.stash[_RECORD] = record


def _bind(config: pytest.Config, workerinput) -> None:
    device = device_for_worker(workerinput["workerid"], visible_devices(workerinput[WORKERINPUT_KEY], 0))
    if device is None:
        return
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise pytest.UsageError("gpu_binding: CUDA was initialised before the worker could bind to its GPU")
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    os.environ[CUDA_VISIBLE] = device
    config.stash[BOUND] = device
    if config.getoption("pin_cpus", False):
        config.stash[_PINNED] = sorted(cpu_affinity.pin_to_gpu(device, threads=1))
    else:
        config.stash[_THREADS] = cpu_affinity.share_cpus(int(workerinput.get("workercount", 1)))


@functools.cache
def gpu_lock_key() -> str | None:
    """The UUID of the GPU this process's gpu tests run on (torch's cuda:0), None without a usable GPU."""
    import torch

    try:
        if not torch.cuda.is_available():
            return None
        return binding_proof.normalize_uuid(torch.cuda.get_device_properties(0).uuid)
    except Exception:  # a GPU that fails here fails (or skips) its tests by itself: nothing to serialise
        return None


@pytest.hookimpl(tryfirst=True, wrapper=True)
def pytest_runtest_protocol(item: pytest.Item):
    """Every test: the proof's first-test time. A gpu test: hold its GPU's machine-wide lock while it runs."""
    record = item.config.stash.get(_RECORD, None)
    if record is not None:
        record.timeline.setdefault("first_test", time.time())
    key = gpu_lock_key() if "gpu" in item.keywords else None
    if key is None:
        return (yield)
    with exclusive_gpu(key):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    try:
        return (yield)
    finally:
        record = item.config.stash.get(_RECORD, None)
        if record is not None and "gpu" in item.keywords:
            record.note_test(binding_proof.PROBE.current_uuid())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    record = item.config.stash.get(_RECORD, None)
    if record is not None:
        record.test_seconds += call.duration
        record.timeline["last_test_end"] = call.stop
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Test process: write its record. Controller (or the one process): check all records."""
    config, proof = session.config, _proof_dir(session.config)
    if proof is None:
        return
    record = config.stash.get(_RECORD, None)
    if record is not None:
        record.timeline["session_end"] = time.time()
        record.finish(binding_proof.PROBE)
        record.write(proof)
    if hasattr(config, "workerinput"):
        return
    gpus = binding_proof.PROBE.gpu_uuids()
    workers = _workers(config)
    if workers:
        devices = _controller_devices(config)
        assignment = plan(workers, devices) or {f"gw{i}": None for i in range(workers)}
    else:
        devices = visible_devices(os.environ.get(CUDA_VISIBLE), len(gpus))
        assignment = {"master": None}
    expected = binding_proof.expected_uuids(assignment, gpus)
    visible = {u for u in (binding_proof.resolve(d, gpus) for d in devices) if u is not None}
    records = binding_proof.load_records(proof)
    verdict = binding_proof.check(records, expected, visible, require_gpu_tests=config.getoption("gpu_runner", False))
    start = binding_proof.process_start_time()
    timeline = binding_proof.timeline_summary(records, start, time.time())
    binding_proof.write_check(proof, verdict, expected, visible, timeline)
    config.stash[_VERDICT] = verdict
    if not verdict.ok and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    verdict = config.stash.get(_VERDICT, None)
    if verdict is None:
        return
    where = _proof_dir(config) / binding_proof.CHECK_FILE
    terminalreporter.section("gpu binding proof")
    for worker, uuid in sorted(verdict.ran_on.items()):
        terminalreporter.write_line(f"{worker}: ran on {uuid or '-'}")
    for note in verdict.notes:
        terminalreporter.write_line(f"note: {note}")
    for problem in verdict.problems:
        terminalreporter.write_line(f"FAILED: {problem}", red=True)
    terminalreporter.write_line(f"{'PASSED' if verdict.ok else 'FAILED'}: binding proof ({where})")


def pytest_report_header(config: pytest.Config) -> str | None:
    """xdist controller: print the worker -> GPU plan."""
    workers = len(config.getoption("tx", None) or [])
    if hasattr(config, "workerinput") or not workers:
        return None
    devices = _controller_devices(config)
    if not devices:
        return "gpu_binding: no GPU visible, workers are not bound"
    assignment = plan(workers, devices)
    line = "gpu_binding: " + ", ".join(f"{w}->{d}" for w, d in assignment.items())
    return line + (" (more workers than GPUs: gpu tests on a shared GPU take turns)" if shared_gpus(assignment) else "")


@pytest.fixture(scope="session")
def gpu_device():
    """The torch.device a GPU test must use (this worker's GPU); skips without CUDA."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False")
    return torch.device("cuda", 0)
