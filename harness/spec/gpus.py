"""How records name a GPU: two names that differ only in case or spacing are one GPU (a results file's
environment, the gate's comparison, the launch table's gpu entries)."""

from __future__ import annotations


def gpu_key(name: str) -> str:
    """A GPU's name as records compare it: "NVIDIA  H200" is "nvidia h200"."""
    return " ".join(name.lower().split())
