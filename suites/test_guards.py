"""Clock guard (harness/measure/clocks.py) and the control measurement (harness/measure/control.py) on CPU."""

from __future__ import annotations

import torch

from harness.measure import clocks
from harness.measure.clocks import GpuState, disturbance, guarded
from harness.measure.control import control_row, measure_control
from harness.results.metrics import validate_rows

CUDA = torch.device("cuda", 0)  # never touched: the readers below are fakes
STEADY = GpuState(sm_mhz=1980, mem_mhz=2619, temperature_c=40, slowdown=(), processes=1)


def _reader(states):
    it = iter(states)
    return lambda device: next(it)


def test_steady_state_is_not_a_disturbance():
    assert disturbance(STEADY, STEADY) is None
    assert disturbance(STEADY, GpuState(1950, 2619, 70, (), 1)) is None  # warmer, clocks within 5%


def test_each_disturbance_is_named():
    assert "SM clock 1980 -> 1410" in disturbance(STEADY, GpuState(1410, 2619, 40, (), 1))
    assert "memory clock" in disturbance(STEADY, GpuState(1980, 1593, 40, (), 1))
    assert "throttling started: sw_thermal" in disturbance(STEADY, GpuState(1980, 2619, 88, ("sw_thermal",), 1))
    assert "other process(es) appeared: 1 -> 2" in disturbance(STEADY, GpuState(1980, 2619, 40, (), 2))


def test_disturbed_block_is_rerun_once():
    calls = []
    dropped = GpuState(1200, 2619, 40, (), 1)
    result, guard = guarded(lambda: calls.append(1) or len(calls), CUDA, read=_reader([STEADY, dropped, STEADY, STEADY]))
    assert result == 2 and guard["disturbed"] is None and guard["reruns"] == 1
    assert "SM clock" in guard["earlier"][0]


def test_persistent_disturbance_marks_the_block():
    busy = GpuState(1980, 2619, 40, (), 3)
    result, guard = guarded(lambda: "t", CUDA, retries=1, read=_reader([STEADY, busy] * 2))
    assert result == "t" and guard["reruns"] == 1 and "other process" in guard["disturbed"]
    assert guard["after"]["processes"] == 3


def test_cpu_records_nothing_and_says_so():
    calls = []
    result, guard = guarded(lambda: calls.append(1) or 7, torch.device("cpu"))
    assert result == 7 and calls == [1] and guard == {"disturbed": None, "reruns": 0, "clocks": "not recorded on cpu"}


def test_nvidia_smi_answers_are_parsed(monkeypatch):
    answers = {"--query-gpu": "1980, 2619, 41, 0x0000000000000024", "--query-compute-apps=pid": "123\n456"}
    monkeypatch.setattr(clocks, "_smi", lambda args: next(v for k, v in answers.items() if args[0].startswith(k)))
    monkeypatch.setattr(clocks, "smi_id", lambda device: "GPU-x")
    assert clocks._smi_state(CUDA) == GpuState(1980, 2619, 41, ("sw_power_cap", "sw_thermal"), 2)


def test_cpu_control_is_a_declared_row_with_samples():
    samples = measure_control(torch.device("cpu"), repeats=5)
    assert samples.unit == "GB/s" and len(samples.values) == 5 and min(samples.values) > 0
    row = control_row(dict(preset="glm5-tp8", scale="ci", scenario="b1-l500", backend="torch"), torch.device("cpu"))
    validate_rows([row])
    assert row.metric == "control_copy_gbps" and len(row.samples) >= 5 and row.detail["guard"]["clocks"] == "not recorded on cpu"
