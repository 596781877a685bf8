"""`suites.plugins.cpu_affinity` on CPU with a fake topology: a GPU's NUMA-local cores, and pinning to them."""

from __future__ import annotations

import pytest

from suites.plugins.cpu_affinity import (
    gpu_bus_ids,
    local_cpus,
    parse_cpulist,
    pin_to_gpu,
    share_cpus,
    sysfs_bus_id,
    threads_per_worker,
)

SMI = "0, GPU-AAAA-01, 00000000:19:00.0\n1, GPU-BBBB-02, 00000000:9A:00.0\n"


@pytest.fixture
def topology(tmp_path):
    for bus, cpus in (("0000:19:00.0", "0-3,8-9\n"), ("0000:9a:00.0", "4-7\n")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "local_cpulist").write_text(cpus)
    return gpu_bus_ids(smi=lambda query: SMI), tmp_path


@pytest.mark.parametrize("text, cpus", [("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}), ("5\n", {5}), ("", set())])
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


def test_bus_ids_and_local_cores(topology):
    bus_ids, sysfs = topology
    assert sysfs_bus_id("00000000:9A:00.0") == "0000:9a:00.0"
    assert bus_ids["1"] == ("bbbb-02", "0000:9a:00.0")
    assert local_cpus("0", bus_ids, sysfs) == {0, 1, 2, 3, 8, 9}
    assert local_cpus("GPU-bbbb", bus_ids, sysfs) == {4, 5, 6, 7}
    assert local_cpus("7", bus_ids, sysfs) == set()  # unknown GPU: nothing to pin to


def test_pin_to_gpu_sets_affinity_to_allowed_local_cores(topology):
    bus_ids, sysfs = topology
    calls = []
    cores = pin_to_gpu("1", threads=None, bus_ids=bus_ids, devices=sysfs,
                       setaffinity=lambda pid, cpus: calls.append(set(cpus)), getaffinity=lambda pid: {0, 1, 5, 6})
    assert cores == {5, 6} and calls == [{5, 6}]


def test_negative_control_unknown_topology_pins_nothing(topology):
    bus_ids, sysfs = topology
    calls = []
    assert pin_to_gpu("1", threads=None, bus_ids={}, devices=sysfs, setaffinity=lambda *a: calls.append(a),
                      getaffinity=lambda pid: {0, 1, 5, 6}) == set()
    assert pin_to_gpu("0", threads=None, bus_ids=bus_ids, devices=sysfs, setaffinity=lambda *a: calls.append(a),
                      getaffinity=lambda pid: {4, 5}) == set()  # local cores not allowed here
    assert calls == []


@pytest.mark.parametrize("cpus, workers, expected", [(32, 2, 16), (32, 8, 4), (2, 8, 1), (16, 1, 16), (16, 0, 16)])
def test_threads_per_worker(cpus, workers, expected):
    assert threads_per_worker(cpus, workers) == expected


def test_share_cpus_sets_torch_and_child_threads():
    import torch

    before, environ = torch.get_num_threads(), {}
    try:
        assert share_cpus(2, getaffinity=lambda pid: set(range(6)), environ=environ) == 3
        assert torch.get_num_threads() == 3
        assert environ == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
    finally:
        torch.set_num_threads(before)
