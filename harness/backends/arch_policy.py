"""Arch policy as data: which FlashInfer MLA kernel runs on which GPU, per KV dtype.

The table lives in arch_policy.toml beside this file; this module only loads,
validates and queries it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from harness.datafiles import read_toml
from harness.errors import HarnessError

POLICY_PATH = Path(__file__).with_name("arch_policy.toml")
KERNELS = ("fa3", "fa2")
SCALE_MODES = ("default", "kv-per-tensor")
KV_KEYS = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8"}


@dataclass(frozen=True)
class Support:
    """What an arch offers for one KV dtype: kernels in preference order, or why none."""

    arch: str  # "SM90", "SM120", ...
    kernels: tuple[str, ...]
    scale_mode: str  # flashinfer plan scale_mode; "" when unsupported
    reason: Optional[str]  # "unsupported on SM120: ...", None when kernels is non-empty


def arch_name(capability: tuple[int, int]) -> str:
    return f"SM{capability[0]}{capability[1]}"


def kv_key(kv_dtype: torch.dtype) -> str:
    if kv_dtype not in KV_KEYS:
        raise HarnessError("kv_dtype", f"expected torch.bfloat16 or torch.float8_e4m3fn, got {kv_dtype}")
    return KV_KEYS[kv_dtype]


class ArchPolicy:
    """A validated policy table, keyed by (major, minor) compute capability."""

    def __init__(self, table: dict, source: str):
        self.source = source
        default = table.get("default", {}).get("unsupported")
        if not isinstance(default, str) or not default:
            raise HarnessError(f"{source}: default.unsupported", "missing reason for unlisted archs")
        self.default_reason = default
        self.entries: dict[tuple[int, int], dict[str, dict]] = {}
        for name, arch in table.get("arch", {}).items():
            where = f"{source}: arch.{name}"
            if not isinstance(arch.get("capabilities"), list) or not arch["capabilities"]:
                raise HarnessError(f"{where}.capabilities", "must list at least one 'major.minor'")
            entry = {key: self._dtype_entry(f"{where}.{key}", arch.get(key)) for key in KV_KEYS.values()}
            for text in arch["capabilities"]:
                capability = self._capability(f"{where}.capabilities", text)
                if capability in self.entries:
                    raise HarnessError(f"{where}.capabilities", f"{text} is listed twice")
                self.entries[capability] = entry

    @staticmethod
    def _capability(where: str, text: object) -> tuple[int, int]:
        parts = text.split(".") if isinstance(text, str) else []
        if len(parts) != 2 or not all(part.isdigit() for part in parts):
            raise HarnessError(where, f"expected 'major.minor', got {text!r}")
        return int(parts[0]), int(parts[1])

    @staticmethod
    def _dtype_entry(where: str, entry: object) -> dict:
        if not isinstance(entry, dict) or ("kernels" in entry) == ("unsupported" in entry):
            raise HarnessError(where, "needs exactly one of `kernels` or `unsupported`")
        if "unsupported" in entry:
            if not isinstance(entry["unsupported"], str) or not entry["unsupported"]:
                raise HarnessError(f"{where}.unsupported", "must be a non-empty reason")
            return {"kernels": (), "scale_mode": "", "unsupported": entry["unsupported"]}
        kernels = entry["kernels"]
        if not kernels or not isinstance(kernels, list) or any(k not in KERNELS for k in kernels):
            raise HarnessError(f"{where}.kernels", f"must be a non-empty list drawn from {KERNELS}, got {kernels!r}")
        if entry.get("scale_mode") not in SCALE_MODES:
            raise HarnessError(f"{where}.scale_mode", f"must be one of {SCALE_MODES}, got {entry.get('scale_mode')!r}")
        return {"kernels": tuple(kernels), "scale_mode": entry["scale_mode"], "unsupported": None}

    def support(self, capability: tuple[int, int], kv_dtype: torch.dtype) -> Support:
        arch = arch_name(capability)
        entry = self.entries.get(tuple(capability))
        if entry is None:
            return Support(arch, (), "", f"unsupported on {arch}: {self.default_reason}")
        found = entry[kv_key(kv_dtype)]
        reason = found["unsupported"]
        return Support(arch, found["kernels"], found["scale_mode"], reason and f"unsupported on {arch}: {reason}")

    def select_kernel(self, capability: tuple[int, int], kv_dtype: torch.dtype) -> tuple[Optional[str], Optional[str]]:
        found = self.support(capability, kv_dtype)
        return (found.kernels[0], None) if found.kernels else (None, found.reason)


def load_policy(path: Path) -> ArchPolicy:
    return ArchPolicy(read_toml(path), str(path))


@functools.cache
def default_policy() -> ArchPolicy:
    return load_policy(POLICY_PATH)


def support(capability: tuple[int, int], kv_dtype: torch.dtype) -> Support:
    """Kernels (preference order) and scale mode for this GPU and KV dtype, or why none."""
    return default_policy().support(capability, kv_dtype)


def select_kernel(capability: tuple[int, int], kv_dtype: torch.dtype) -> tuple[Optional[str], Optional[str]]:
    """(preferred kernel, None) or (None, "unsupported on SMxy: <reason>")."""
    return default_policy().select_kernel(capability, kv_dtype)
