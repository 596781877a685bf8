"""CPU affinity per GPU: pin a process to the cores of its GPU's NUMA node, and its torch to few threads;
or, by default under xdist, share the cores' worth of torch threads out over the workers.

A GPU's local cores come from sysfs (/sys/bus/pci/devices/<bus id>/local_cpulist, the
"CPU Affinity" column of `nvidia-smi topo -m`); the bus id from NVML / nvidia-smi. Used by
the binding plugin (``--pin-cpus``) and by ci/experiments/isolation.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from suites.plugins.binding_proof import normalize_uuid, nvidia_smi, parse_smi_csv, resolve

PCI_DEVICES = Path("/sys/bus/pci/devices")


def parse_cpulist(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def sysfs_bus_id(bus_id: str) -> str:
    """nvidia-smi's '00000000:19:00.0' -> sysfs's '0000:19:00.0'."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{domain[-4:]:0>4}:{rest}"


def gpu_bus_ids(smi: Callable[..., str] = nvidia_smi) -> dict[str, tuple[str, str]]:
    """NVML index -> (normalized UUID, sysfs bus id); {} when nvidia-smi is not there."""
    try:
        rows = parse_smi_csv(smi("--query-gpu=index,uuid,pci.bus_id"), 3)
    except Exception:
        return {}
    return {i: (normalize_uuid(u), sysfs_bus_id(b)) for i, u, b in rows}


def local_cpus(entry: str, bus_ids: dict[str, tuple[str, str]], devices: Path = PCI_DEVICES) -> set[int]:
    """Cores local to the GPU a CUDA_VISIBLE_DEVICES entry names; empty when unknown."""
    uuid = resolve(entry, {i: u for i, (u, _) in bus_ids.items()})
    bus = next((b for u, b in bus_ids.values() if u == uuid), None)
    try:
        return parse_cpulist((devices / bus / "local_cpulist").read_text()) if bus else set()
    except OSError:
        return set()


THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def threads_per_worker(cpus: int, workers: int) -> int:
    """Torch intra-op threads for one of `workers` processes sharing `cpus` cores (at least 1)."""
    return max(1, cpus // max(1, workers))


def share_cpus(workers: int, getaffinity=os.sched_getaffinity, environ=os.environ) -> int:
    """Cap this process's torch (and OpenMP / MKL children's) threads at its share of the allowed
    cores. Without it every xdist worker starts one thread per core: on the 2x H200 machine the
    CPU side of the GPU tests (queries, verdict statistics) ran 10-30x slower under -n 2 than
    alone (cProfile, docs/evidence/shard/). Returns the thread count set. A process that
    has not imported torch yet (an xdist worker of a suite whose conftest does not import it) is
    not made to: torch sizes its pool from OMP_NUM_THREADS when it is imported (checked in
    suites/test_gpu_binding.py)."""
    threads = threads_per_worker(len(getaffinity(0)), workers)
    for name in THREAD_ENV:
        environ[name] = str(threads)
    torch = sys.modules.get("torch")
    if torch is None and environ is not os.environ:
        import torch
    if torch is not None:
        torch.set_num_threads(threads)
    return threads


def pin_to_gpu(entry: str, threads: int | None = 1, bus_ids=None, devices: Path = PCI_DEVICES,
               setaffinity=os.sched_setaffinity, getaffinity=os.sched_getaffinity) -> set[int]:
    """Pin this process to the allowed cores local to GPU `entry` and cap torch's intra-op threads
    (`threads`, None: leave). Returns the cores pinned to (empty: topology unknown, nothing changed)."""
    cores = local_cpus(entry, gpu_bus_ids() if bus_ids is None else bus_ids, devices) & set(getaffinity(0))
    if not cores:
        return set()
    setaffinity(0, cores)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    return cores
