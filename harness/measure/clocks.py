"""Clock guard: GPU clocks, temperature, throttle reasons and other processes around a timing block.

    result, guard = guarded(lambda: device_time_ms(fn, 40), device)
    Row(..., detail={"guard": guard})

`guarded` reads the GPU's state before and after the block; when the SM or memory clock
dropped, a slowdown throttle reason (power cap, thermal, HW slowdown/brake) started, or
another process appeared on the GPU, it runs the block again (`retries` times). If the
last run is still disturbed, guard["disturbed"] says why and `harness compare` reports the
row as `disturbed` instead of comparing it. On CPU nothing is recorded
(guard["clocks"] says so). The state comes from NVML (pynvml / nvidia-ml-py) when it
imports, else from `nvidia-smi --query-gpu`; when neither answers, guard["clocks"] says so
and the block is not marked.
"""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass

import torch

# NVML clocks-event (throttle) reasons that slow the GPU down; idle, app clocks and sync boost do not
SLOWDOWN_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake"}
CLOCK_DROP = 0.95  # a clock below 95% of its value before the block counts as dropped


@dataclass(frozen=True)
class GpuState:
    sm_mhz: int
    mem_mhz: int
    temperature_c: int
    slowdown: tuple[str, ...]  # active SLOWDOWN_REASONS
    processes: int  # compute processes on this GPU (this one included)


def _reasons(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in sorted(SLOWDOWN_REASONS.items()) if mask & bit)


def smi_id(device: torch.device) -> str:
    """nvidia-smi's and NVML's id for this GPU: its UUID (an index would count outside CUDA_VISIBLE_DEVICES)."""
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    if not uuid:
        return str(device.index or 0)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def _nvml_state(device: torch.device) -> GpuState | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(smi_id(device))
        return GpuState(
            pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            _reasons(getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons",
                             getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))(handle)),
            len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle)),
        )
    except Exception:  # an NVML without a call or a device it cannot see: fall back on nvidia-smi
        return None


def _smi(args: list[str]) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _smi_state(device: torch.device) -> GpuState | None:
    gpu = f"--id={smi_id(device)}"
    for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):  # new name, old name
        line = _smi([f"--query-gpu=clocks.sm,clocks.mem,temperature.gpu,{reasons}", "--format=csv,noheader,nounits", gpu])
        if line:
            break
    else:
        return None
    apps = _smi(["--query-compute-apps=pid", "--format=csv,noheader", gpu])
    try:
        sm, mem, temp, mask = (v.strip() for v in line.splitlines()[0].split(","))
        return GpuState(int(sm), int(mem), int(temp), _reasons(int(mask, 16)), len((apps or "").splitlines()))
    except ValueError:
        return None


def read_state(device: torch.device) -> GpuState | None:
    """The GPU's clocks, temperature, slowdown reasons and process count; None on CPU or when unreadable."""
    if device.type != "cuda":
        return None
    return _nvml_state(device) or _smi_state(device)


def disturbance(before: GpuState, after: GpuState) -> str | None:
    """Why a block timed between these two readings is not to be trusted, or None."""
    why = []
    if after.sm_mhz < before.sm_mhz * CLOCK_DROP:
        why.append(f"SM clock {before.sm_mhz} -> {after.sm_mhz} MHz")
    if after.mem_mhz < before.mem_mhz * CLOCK_DROP:
        why.append(f"memory clock {before.mem_mhz} -> {after.mem_mhz} MHz")
    if started := sorted(set(after.slowdown) - set(before.slowdown)):
        why.append(f"throttling started: {', '.join(started)}")
    if after.processes > before.processes:
        why.append(f"other process(es) appeared: {before.processes} -> {after.processes}")
    return "; ".join(why) or None


def guarded(fn, device: torch.device, retries: int = 1, read=read_state):
    """(fn(), guard): fn run between two GPU state readings, re-run up to `retries` times when disturbed.

    guard is a JSON-ready dict for a row's detail["guard"]: disturbed (why the last run is
    not trusted, or None), reruns, earlier (why earlier runs were discarded), before/after
    (the last run's readings) or clocks (why nothing was recorded)."""
    earlier: list[str] = []
    while True:
        before = read(device)
        if before is None:
            reason = "not recorded on cpu" if device.type != "cuda" else "no NVML or nvidia-smi answer"
            return fn(), {"disturbed": None, "reruns": 0, "clocks": reason}
        result = fn()
        after = read(device)
        why = disturbance(before, after) if after is not None else "GPU state unreadable after the block"
        if why is None or len(earlier) >= retries:
            return result, {"disturbed": why, "reruns": len(earlier), "earlier": earlier,
                            "before": asdict(before), "after": asdict(after) if after else None}
        earlier.append(why)
