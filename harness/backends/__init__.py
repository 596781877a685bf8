"""Attention backends: `torch` (CPU and CUDA) and `flashinfer` (CUDA), picked per device.

FAMILIES is the one list of backends: each family's kernels (a backend's name is its family, or
"<family>-<kernel>"), from which the --backend / --kernel choices and the keys tolerance rows may
name (`backend_keys`) derive. torch is imported only by `make_backend` (the CLI lists names without it).
"""

from __future__ import annotations

from harness.errors import HarnessError

# family -> the kernels it can be forced to run (the first choice per device comes from the arch policy)
FAMILIES: dict[str, tuple[str, ...]] = {"torch": (), "flashinfer": ("fa3", "fa2")}
BACKENDS = ("auto", *FAMILIES)
KERNEL_CHOICES = ("auto", *dict.fromkeys(k for kernels in FAMILIES.values() for k in kernels))


def backend_keys() -> tuple[str, ...]:
    """Every backend name a results row or tolerance row may carry: each family and family-kernel."""
    return tuple(key for family, kernels in FAMILIES.items() for key in (family, *(f"{family}-{k}" for k in kernels)))


def backend_family(key: str) -> str:
    """The `--backend` that selects a backend key a run recorded ("flashinfer-fa3" -> "flashinfer"): the kernel part
    is the kernel choice's outcome on that GPU, not an option value."""
    return key.partition("-")[0]


def make_backend(name: str, device, kernel: str = "auto"):
    """The backend called `name` for `device` (a torch.device); "auto" is flashinfer on CUDA, torch on CPU.

    kernel: the FlashInfer kernel, "auto" = the arch policy's first choice for BF16 KV (fa3 on
    SM90, fa2 on SM120); "fa2"/"fa3" force one (fa2 on an H200 runs SM120's code path)."""
    import torch

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
        if kernel is None:  # the default backend on CUDA: say which one runs here
            raise HarnessError("--backend", f"{reason} (--backend torch runs what it can on this GPU without FlashInfer)")
    elif kernel not in support(capability, torch.bfloat16).kernels:
        found = support(capability, torch.bfloat16)
        raise HarnessError("--kernel", f"{kernel} does not run on {found.arch}: {found.reason or 'policy lists ' + ', '.join(found.kernels)}")
    return FlashInferBackend(device, kernel)
