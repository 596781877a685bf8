"""The environment fingerprint of a run: machine, versions, GPU and its clocks (schema.Environment)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path

import msgspec
import numpy as np
import torch

from harness import envvars
from harness.measure.clocks import smi_id
from harness.results.schema import Environment


def _git_commit() -> str | None:
    if commit := envvars.read("MLA_HARNESS_GIT_COMMIT"):
        return commit  # a checkout copied without .git (e.g. to a GPU box) says where it came from
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _gpu_fingerprint(device: torch.device) -> dict:
    props = torch.cuda.get_device_properties(device)
    info = {
        "gpu": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "gpu_memory_bytes": props.total_memory,
        "cuda": torch.version.cuda,
    }
    try:
        query = "driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit,temperature.gpu"
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader", f"--id={smi_id(device)}"],
            capture_output=True, text=True, timeout=10,
        )
        keys = ["driver", "clock_sm", "clock_mem", "clock_sm_max", "power_limit", "temperature"]
        info.update(dict(zip(keys, (v.strip() for v in out.stdout.strip().split(",")))))
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def environment(device: torch.device) -> dict:
    """Where and with what the numbers were made (schema.Environment: a key it does not declare is a TypeError)."""
    env = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "device": str(device),
        "git_commit": _git_commit(),
    }
    try:
        from importlib.metadata import version

        env["flashinfer"] = version("flashinfer-python")
    except Exception:
        env["flashinfer"] = None
    if device.type == "cuda":
        env.update(_gpu_fingerprint(device))
    return msgspec.structs.asdict(Environment(**env))  # the declared record: every field, null where unknown
