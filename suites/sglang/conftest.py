"""The `sglang` oracle suite: real SGLang code (pools, FlashInfer MLA backend, kv-indices
kernel, model config) run on CPU against the harness.

Run it in its own pytest process (`python -m pytest suites/sglang -m sglang`): SGLang's
Triton kernels run under the Triton interpreter, and TRITON_INTERPRET must be set before
triton is first imported. Install: `bash ci/install_sglang_cpu.sh VENV` (CPU torch plus
ci/sglang-cpu-pins.txt), or `pip install -e` your own SGLang checkout.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _sglang_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang") is not None


def pytest_configure(config):
    """The oracle session (`-m sglang`, its own process): SGLang's Triton kernels run in the interpreter, switched on
    before triton's first import. A session that only collects this folder (`pytest suites/` with SGLang installed)
    is left compiled: the main suite's CPU expectations hold there, and these tests skip saying how to run them."""
    if _sglang_installed() and "triton" not in sys.modules and (config.getoption("markexpr") or "").strip() == "sglang":
        os.environ.setdefault("TRITON_INTERPRET", "1")


STUBS = Path(__file__).parent / "stubs"


def _torchvision_stub() -> None:
    """Put the torchvision stand-in on sys.path unless a real torchvision is installed.

    transformers probes torchvision once (cached) and would then import torchvision.io;
    probing before the stub is visible keeps it on its no-torchvision path."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        return
    try:
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()
    except ImportError:
        pass
    sys.path.insert(0, str(STUBS))


if _sglang_installed():
    _torchvision_stub()
