"""Import the installed SGLang for the SGLang-backed strategies, or say in one line why it cannot run."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import sys
import traceback
from pathlib import Path

import torch

from harness.errors import HarnessError
from harness.integrations.sglang import stand_in

MLA_BACKEND = "sglang.srt.layers.attention.flashinfer_mla_backend"
FA3_BACKEND = "sglang.srt.layers.attention.flashattention_backend"
MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
INSTALL_HINT = "pip install sglang==0.5.23, or on a runner without it the bundle of ci/build_sglang_bundle.sh"


@functools.cache
def import_failure(module: str) -> tuple[str, bool] | None:
    """None when `module` of SGLang imports, else (why not, whether SGLang's own code is at fault). On CUDA a missing
    sgl_kernel is replaced by the import-time stand-in first (SGLang imports it there; the MLA decode path never calls it)."""
    if importlib.util.find_spec("sglang") is None:
        return f"sglang is not installed ({INSTALL_HINT})", False
    if torch.cuda.is_available():
        stand_in.install()
    try:
        import_module(module)
    except (Exception, SystemExit) as error:  # a missing or broken install is a reason, not a crash (nor an exit)
        return f"{module} is not importable: {type(error).__name__}: {error}", _own_fault(error)
    return None


def import_reason(module: str) -> str | None:
    """Why `module` cannot run here (an unsupported verdict): no SGLang, or a package it needs missing or of another
    version. A failure of SGLang's own code (a user's patch with a syntax error, a name it no longer defines) is no
    such reason: `load` raises it where the strategy runs, an error verdict, so a broken SGLang never passes quietly."""
    failure = import_failure(module)
    return failure[0] if failure and not failure[1] else None


def _own_fault(error: BaseException) -> bool:
    """Whether a failed import was raised by SGLang's own code rather than by a dependency it names (ImportError of
    sgl_kernel, torchvision, a triton without a name...) or by the code of one."""
    if isinstance(error, ImportError) and (error.name or "sglang").partition(".")[0] != "sglang":
        return False
    if isinstance(error, SyntaxError):
        where = error.filename or ""
    else:  # the innermost frame of real code (the import system's frozen frames skipped)
        frames = [f.filename for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<")]
        where = frames[-1] if frames else ""
    roots = getattr(importlib.util.find_spec("sglang"), "submodule_search_locations", None) or []
    return bool(where) and any(Path(where).resolve().is_relative_to(Path(root).resolve()) for root in roots)


def _forget_orphans(top: str) -> None:
    """Drop the submodules of package `top` that a failed import of it left behind. Python removes the package whose
    __init__ raised but keeps the submodules it had finished: a namespace package among them (SGLang's sglang.srt has
    no __init__.py) then needs its missing parent to find anything, and every later import raises KeyError: 'sglang'
    instead of the import's own error (the missing module a skip reason must name)."""
    if top not in sys.modules:
        for name in [n for n in sys.modules if n.startswith(top + ".")]:
            del sys.modules[name]


def import_module(module: str):
    """importlib.import_module(module); a failure leaves no partial package behind, so each attempt raises the import's
    own error (e.g. ModuleNotFoundError naming a missing dependency), not a KeyError from an earlier attempt's leftovers."""
    top = module.partition(".")[0]
    _forget_orphans(top)
    try:
        return importlib.import_module(module)
    finally:
        _forget_orphans(top)


def load(module: str):
    """The imported SGLang module; HarnessError naming the reason when it cannot be imported."""
    if failure := import_failure(module):
        raise HarnessError("sglang", failure[0] + (" (raised by SGLang's own code)" if failure[1] else ""))
    return sys.modules[module]


def version() -> str:
    return load("sglang").__version__


SINGLE_RANK = {"dcp_enabled": False, "attn_dcp_size": 1, "attn_dcp_rank": 0, "attn_tp_size": 1}


def has_field(parallel, name: str) -> bool:
    """Whether SGLang's ParallelContext `parallel` knows the field `name`. Reading an unknown one raises AttributeError;
    a known one is either published or raises that it is not (ValueError, RuntimeError, AssertionError: no server)."""
    try:
        getattr(parallel, name)
    except AttributeError:
        return False
    except Exception:
        return True
    return True


def single_rank_fields(parallel) -> dict:
    """SINGLE_RANK cut to the fields `parallel` has: an SGLang whose context has no decode-context-parallel fields
    (sglang 0.5.15: its DCP is off without a DCP group) rejects an override naming them."""
    return {name: value for name, value in SINGLE_RANK.items() if has_field(parallel, name)}


def single_rank() -> contextlib.AbstractContextManager:
    """SGLang's parallel context forced to one rank without decode-context parallelism (no server runs)."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    return parallel.override(**single_rank_fields(parallel))
