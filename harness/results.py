"""Writing results: one row per (case, strategy, metric) of one case, with an environment fingerprint
and repro command. The records (Row, Case) are harness/schema.py's, which the readers use too."""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import msgspec
import numpy as np
import torch

from harness.clocks import smi_id
from harness.fsio import write_text
from harness.metrics import METRICS, validate_rows
from harness.schema import CASE_FIELDS, ROW_CASE_FIELDS, SCHEMA, Case, Environment, Row, parse_results

__all__ = ["SCHEMA", "Case", "Row", "case_record", "document", "environment", "repro_command", "write_results"]


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


def repro_command(argv: list[str] | None = None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", "-m", "harness", *args])


def case_record(case, backend: str, kernel: str) -> Case:
    """The case record of a run: `case` (harness.cases.Case), the backend its rows name, the kernel choice."""
    return Case(preset=case.preset.name, scenario=case.scenario.name, scale=case.scale.name, slots=case.scale.slots,
                layers=case.num_layers, backend=backend, kernel=kernel)


def _plain(value):
    """numpy scalars as Python numbers (what json writes)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


def document(rows: list[Row], env: dict, repro: str, case: Case | None = None) -> dict:
    """The results document (checked against the schema it will be read with). Every row's metric must
    be declared in the metric table; each row records whether it gates on this device (`gates_on`).
    Without `case`, the rows' own case fields are used (slots/layers not recorded)."""
    validate_rows(rows)
    if case is None:
        first = rows[0] if rows else None
        case = Case(**{f: getattr(first, f, "") for f in ROW_CASE_FIELDS}, slots=None, layers=None, kernel="auto")
    device_type = str(env.get("device") or "cpu").split(":")[0]
    doc = json.loads(json.dumps({
        "schema": SCHEMA,
        "case": {f: getattr(case, f) for f in CASE_FIELDS},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "repro": repro,
        "rows": [{**asdict(r), "gating": METRICS[r.metric].gates(device_type)} for r in rows],
    }, default=_plain))
    parse_results(doc, "results being written")  # a writer never writes what the readers refuse
    return doc


def write_results(path: str | Path, rows: list[Row], env: dict, repro: str, case: Case | None = None) -> None:
    """Write the results document of `rows` (see `document`)."""
    write_text(path, json.dumps(document(rows, env, repro, case), indent=1) + "\n")
