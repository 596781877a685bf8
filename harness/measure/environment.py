"""The environment fingerprint of a run: machine, versions, GPU and its clocks (schema.Environment)."""

from __future__ import annotations

import hashlib
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import torch

from harness import CHECKOUT, envvars
from harness.measure.clocks import smi_id
from harness.results.schema import Environment

# point git at another repository, index or work tree than the folder's own (set in git hooks, `git --git-dir`, a
# worktree's scripts): the variables `git rev-parse --local-env-vars` lists, which git itself clears for a submodule
REPOSITORY_ENV = ("GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_CONFIG", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT",
                  "GIT_OBJECT_DIRECTORY", "GIT_DIR", "GIT_WORK_TREE", "GIT_IMPLICIT_WORK_TREE", "GIT_GRAFT_FILE",
                  "GIT_INDEX_FILE", "GIT_NO_REPLACE_OBJECTS", "GIT_REPLACE_REF_BASE", "GIT_PREFIX",
                  "GIT_INTERNAL_SUPER_PREFIX", "GIT_SHALLOW_FILE", "GIT_COMMON_DIR")
HARNESS_SOURCES = ("*.py", "*.cu", "*.toml")  # what in harness/ decides what a run does: code, kernels, specs and tables


def _git(folder: Path, *args: str) -> str | None:
    """git's answer about the repository `folder` lies in (None on failure), whatever repository the caller's
    environment points git at."""
    env = {k: v for k, v in os.environ.items() if k not in REPOSITORY_ENV}
    try:
        out = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=5, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _git_commit() -> str | None:
    """MLA_HARNESS_GIT_COMMIT, else the HEAD of the checkout this harness/ is the top-level package of ("-dirty" with
    changes to tracked files there, or a source file of harness/ or a golden file git does not track yet: a scenario
    or strategy found by its folder runs from it); None when it is no checkout's own (a copy, or one inside another project's repository)."""
    if commit := envvars.read("MLA_HARNESS_GIT_COMMIT"):
        return commit  # a checkout copied without .git (e.g. to a GPU box) says where it came from
    top = _git(CHECKOUT, "rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != CHECKOUT or not (head := _git(CHECKOUT, "rev-parse", "HEAD")):
        return None
    untracked = _git(CHECKOUT, "ls-files", "--others", "--exclude-standard", "--", *(f"harness/{p}" for p in HARNESS_SOURCES), "golden")
    return head + ("-dirty" if _git(CHECKOUT, "status", "--porcelain", "--untracked-files=no") or untracked else "")


def _cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux); else what platform says (often only the architecture)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _installed(distribution: str) -> str | None:
    """The installed version of `distribution`, without importing it; None when it is not installed."""
    try:
        from importlib.metadata import version

        return version(distribution)
    except Exception:
        return None


def _imported(name: str) -> tuple[str | None, Path | None]:
    """(__version__, package folder) of `name` as this process imported it; (None, None) when it did not."""
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)  # a namespace package of the same name has none
    if module is None or not file:
        return None, None
    return getattr(module, "__version__", None), Path(file).resolve().parent


def _flashinfer() -> dict:
    version, folder = _imported("flashinfer")
    if version is None:
        version = _installed("flashinfer-python")
    return {"flashinfer": version, "flashinfer_path": str(folder) if folder else None}


def source_digest(folder: Path, patterns: tuple[str, ...] = ("*.py",)) -> str:
    """sha256 of a package's source: every file under `folder` matching `patterns`, its relative path and bytes, in
    path order. Two runs of the same version from the same folder whose code differs (a patch edited in place, no git)
    differ here."""
    h = hashlib.sha256()
    for path in sorted({p for pattern in patterns for p in folder.rglob(pattern)}):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def _sglang(version: str | None = None, folder: Path | None = None) -> dict:
    """The SGLang this run imported (or the one at `folder`): version, folder, the digest of its source (source_digest),
    and commit (the HEAD of the SGLang checkout the folder is `python/sglang` of, "-dirty" with local changes there;
    else MLA_HARNESS_SGLANG_COMMIT, which ci.sglang_gate sets for a commit it installed without .git, also when that
    commit did not import; else None)."""
    if folder is None:
        version, folder = _imported("sglang")
    if folder is None:
        return {"sglang_commit": envvars.read("MLA_HARNESS_SGLANG_COMMIT")}
    commit, top = None, _git(folder, "rev-parse", "--show-toplevel")
    if top and Path(top).resolve() / "python" / "sglang" == folder and (head := _git(folder, "rev-parse", "HEAD")):
        commit = head + ("-dirty" if _git(folder, "status", "--porcelain", "--", ".") else "")
    return {"sglang": version, "sglang_path": str(folder), "sglang_digest": source_digest(folder),
            "sglang_commit": commit or envvars.read("MLA_HARNESS_SGLANG_COMMIT")}


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


# Run by another interpreter: (version, folder) of each package it imports, and its Python version, as JSON.
SOFTWARE_PROBE = """import json, os, platform
def of(name):
    try:
        m = __import__(name)
    except Exception:
        return None, None
    return getattr(m, "__version__", None), os.path.dirname(os.path.abspath(m.__file__))
import sglang
print(json.dumps({"python": platform.python_version(), **{n: of(n) for n in ("sglang", "torch", "triton", "flashinfer")}}))"""


def software_of(probe: dict) -> dict:
    """The environment fields of another interpreter's software from SOFTWARE_PROBE's output: what `tpot --engine
    sglang` runs is that interpreter's Python, torch, Triton, FlashInfer and SGLang, not this process's."""
    (torch_v, _), (triton_v, _), (fi_v, fi_dir), (sgl_v, sgl_dir) = (probe[n] for n in ("torch", "triton", "flashinfer", "sglang"))
    return {"python": probe["python"], "torch": torch_v, "triton": triton_v, "flashinfer": fi_v, "flashinfer_path": fi_dir,
            **_sglang(sgl_v, Path(sgl_dir).resolve())}


def environment(device: torch.device) -> dict:
    """Where and with what the numbers were made (schema.Environment: a key it does not declare is a TypeError)."""
    env = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "triton": _imported("triton")[0] or _installed("triton"),
        "harness": _installed("mla-harness"),
        "harness_digest": source_digest(CHECKOUT / "harness", HARNESS_SOURCES),  # the code that ran, git or not
        "device": str(device),
        "git_commit": _git_commit(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),  # another kernel (fused_fp8's CUDA one is not run under it)
        **_flashinfer(),
        **_sglang(),
    }
    if device.type == "cuda":
        env.update(_gpu_fingerprint(device))
    return msgspec.structs.asdict(Environment(**env))  # the declared record: every field, null where unknown
