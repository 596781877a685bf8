"""Results: one row per (case, strategy, metric), with an environment fingerprint and repro command."""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from harness.fsio import write_text
from harness.metrics import METRICS, validate_rows

SCHEMA = "mla-harness-results/1"


@dataclass
class Row:
    preset: str
    scale: str
    scenario: str
    strategy: str
    backend: str
    metric: str
    value: object
    unit: str | None = None
    better: str | None = None  # "lower", "higher", or None for non-numeric metrics
    iqr: float | None = None
    samples: list[float] = field(default_factory=list)
    detail: dict | None = None

    def __post_init__(self):
        """Unit and direction come from the metric table (harness/metrics.py) when not given."""
        declared = METRICS.get(self.metric)
        if declared is not None:
            self.better = self.better or declared.better
            self.unit = self.unit or declared.unit

    @property
    def key(self) -> tuple:
        return (self.preset, self.scale, self.scenario, self.strategy, self.backend, self.metric)


def _git_commit() -> str | None:
    if commit := os.environ.get("MLA_HARNESS_GIT_COMMIT"):
        return commit  # a checkout copied without .git (e.g. to a GPU box) says where it came from
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _smi_id(props, device: torch.device) -> str:
    """nvidia-smi's id for this GPU: its UUID (an index would count outside CUDA_VISIBLE_DEVICES)."""
    uuid = str(getattr(props, "uuid", "") or "")
    if not uuid:
        return str(device.index or 0)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


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
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader", f"--id={_smi_id(props, device)}"],
            capture_output=True, text=True, timeout=10,
        )
        keys = ["driver", "clock_sm", "clock_mem", "clock_sm_max", "power_limit", "temperature"]
        info.update(dict(zip(keys, (v.strip() for v in out.stdout.strip().split(",")))))
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def environment(device: torch.device) -> dict:
    """Where and with what the numbers were made."""
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
    else:
        env["gpu"] = None
    return env


def repro_command(argv: list[str] | None = None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", "-m", "harness", *args])


def write_results(path: str | Path, rows: list[Row], env: dict, repro: str) -> None:
    """Write the results document; every row's metric must be declared in the metric table.
    Each row records whether it gates on this device (the table's `gates_on`)."""
    validate_rows(rows)
    device_type = str(env.get("device") or "cpu").split(":")[0]
    doc = {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "repro": repro,
        "rows": [{**asdict(r), "gating": METRICS[r.metric].gates(device_type)} for r in rows],
    }
    write_text(path, json.dumps(doc, indent=1) + "\n")
