"""Attention backends: `torch` (CPU and CUDA) and `flashinfer` (CUDA), picked per device."""

from __future__ import annotations

import torch

from harness.errors import HarnessError

BACKENDS = ("auto", "torch", "flashinfer")


def make_backend(name: str, device: torch.device):
    """The backend called `name` for `device`; "auto" is flashinfer on CUDA, torch on CPU."""
    if name not in BACKENDS:
        raise HarnessError("--backend", f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if name == "auto":
        name = "flashinfer" if device.type == "cuda" else "torch"
    if name == "torch":
        from harness.backends.torch_backend import TorchBackend

        return TorchBackend(device)
    if device.type != "cuda":
        raise HarnessError("--backend", "flashinfer needs a CUDA device")
    from harness.backends.arch_policy import select_kernel
    from harness.backends.flashinfer import FlashInferBackend

    kernel, reason = select_kernel(torch.cuda.get_device_capability(device), torch.bfloat16)
    if kernel is None:
        raise HarnessError("--backend", reason)
    return FlashInferBackend(device, kernel)
