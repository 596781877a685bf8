"""Attention backends: `torch` (CPU and CUDA) and `flashinfer` (CUDA), picked per device."""

from __future__ import annotations

import torch

from harness.errors import HarnessError

BACKENDS = ("auto", "torch", "flashinfer")
KERNEL_CHOICES = ("auto", "fa3", "fa2")


def make_backend(name: str, device: torch.device, kernel: str = "auto"):
    """The backend called `name` for `device`; "auto" is flashinfer on CUDA, torch on CPU.

    kernel: the FlashInfer kernel, "auto" = the arch policy's first choice for BF16 KV (fa3 on
    SM90, fa2 on SM120); "fa2"/"fa3" force one (fa2 on an H200 runs SM120's code path)."""
    if name not in BACKENDS:
        raise HarnessError("--backend", f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if kernel not in KERNEL_CHOICES:
        raise HarnessError("--kernel", f"unknown kernel {kernel!r}; choose from {', '.join(KERNEL_CHOICES)}")
    if name == "auto":
        name = "flashinfer" if device.type == "cuda" else "torch"
    if name == "torch":
        if kernel != "auto":
            raise HarnessError("--kernel", f"{kernel} is a FlashInfer kernel; the torch backend has none (use --backend flashinfer)")
        from harness.backends.torch_backend import TorchBackend

        return TorchBackend(device)
    if device.type != "cuda":
        raise HarnessError("--backend", "flashinfer needs a CUDA device")
    from harness.backends.arch_policy import select_kernel, support
    from harness.backends.flashinfer import FlashInferBackend

    capability = torch.cuda.get_device_capability(device)
    if kernel == "auto":
        kernel, reason = select_kernel(capability, torch.bfloat16)
        if kernel is None:
            raise HarnessError("--backend", reason)
    elif kernel not in support(capability, torch.bfloat16).kernels:
        found = support(capability, torch.bfloat16)
        raise HarnessError("--kernel", f"{kernel} does not run on {found.arch}: {found.reason or 'policy lists ' + ', '.join(found.kernels)}")
    return FlashInferBackend(device, kernel)
