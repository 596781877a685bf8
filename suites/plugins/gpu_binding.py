"""pytest plugin: one GPU per xdist worker, and an exclusive per-GPU lock for timings.

Under ``pytest -n N`` the controller lists the GPUs once (the parent's
CUDA_VISIBLE_DEVICES entries, else ``MLA_HARNESS_NUM_GPUS`` or
``torch.cuda.device_count()``, which counts through NVML without initialising
CUDA) and hands the list to every worker; worker gwK then sets
CUDA_VISIBLE_DEVICES to entry K % len(list) in its pytest_configure, before any
test module can touch CUDA. Tests use the ``gpu_device`` fixture (always cuda:0
of what the worker sees). With more workers than GPUs two workers share a GPU;
tests that time kernels take ``gpu_lock``, a file lock per physical GPU in
``MLA_HARNESS_LOCK_DIR`` (default <tmp>/mla-harness-gpu-locks, shared by every
worker and every pytest session on the machine), so timings never overlap.
Lock names are the parent's CUDA_VISIBLE_DEVICES entries (indices or UUIDs):
sessions with different masks on one machine should use UUIDs.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from filelock import FileLock

ENV_NUM_GPUS = "MLA_HARNESS_NUM_GPUS"
ENV_LOCK_DIR = "MLA_HARNESS_LOCK_DIR"
CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
WORKERINPUT_KEY = "mla_harness_gpus"
BOUND = pytest.StashKey[str]()
_DEVICES = pytest.StashKey[list]()


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
    """Hold the machine-wide lock of GPU `device` (a CUDA_VISIBLE_DEVICES entry); yields the lock path."""
    directory = lock_dir() if directory is None else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', device)}.lock"
    with FileLock(path, timeout=timeout):
        yield path


def detect_devices() -> list[str]:
    """The run's GPU list: CUDA_VISIBLE_DEVICES, else MLA_HARNESS_NUM_GPUS, else torch's count."""
    cuda_visible, count = os.environ.get(CUDA_VISIBLE), os.environ.get(ENV_NUM_GPUS)
    if cuda_visible is None and not count:
        import torch

        count = torch.cuda.device_count()
    try:
        return visible_devices(cuda_visible, int(count or 0))
    except ValueError:
        raise pytest.UsageError(f"{ENV_NUM_GPUS} must be an integer, got {count!r}") from None


def _controller_devices(config: pytest.Config) -> list[str]:
    if _DEVICES not in config.stash:
        config.stash[_DEVICES] = detect_devices()
    return config.stash[_DEVICES]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: hand every worker the one GPU list."""
    node.workerinput[WORKERINPUT_KEY] = ",".join(_controller_devices(node.config))


def pytest_configure(config: pytest.Config) -> None:
    """xdist worker: bind to one GPU before anything initialises CUDA."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or WORKERINPUT_KEY not in workerinput:
        return
    device = device_for_worker(workerinput["workerid"], visible_devices(workerinput[WORKERINPUT_KEY], 0))
    if device is None:
        return
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise pytest.UsageError("gpu_binding: CUDA was initialised before the worker could bind to its GPU")
    os.environ[CUDA_VISIBLE] = device
    config.stash[BOUND] = device


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
    return line + (" (more workers than GPUs: gpu_lock serialises timings)" if shared_gpus(assignment) else "")


def _lock_key(config: pytest.Config) -> str:
    bound = config.stash.get(BOUND, None)
    return bound if bound is not None else (visible_devices(os.environ.get(CUDA_VISIBLE), 1) or ["0"])[0]


@pytest.fixture(scope="session")
def gpu_device():
    """The torch.device a GPU test must use (this worker's GPU); skips without CUDA."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False")
    return torch.device("cuda", 0)


@pytest.fixture
def gpu_lock(pytestconfig, gpu_device):
    """Hold this GPU's machine-wide lock for the test (for timings); yields the device."""
    with exclusive_gpu(_lock_key(pytestconfig)):
        yield gpu_device
