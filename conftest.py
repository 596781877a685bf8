"""Top-level pytest configuration: GPU tests skip on CPU with a reason; per-GPU binding under xdist."""

import pytest
import torch

pytest_plugins = ["suites.plugins.gpu_binding"]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
