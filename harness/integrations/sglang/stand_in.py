"""An import-time stand-in for `sgl_kernel`, used only when the real module is missing.

On CUDA, SGLang imports sgl_kernel at module level (the quantization package, the FA3 backend's
`merge_state_v2`) although its FlashInfer MLA decode path never calls into it. The real wheel
(sglang-kernel, 373 MB, built against its own torch) cannot travel to every runner, so `install()`
lets `import sgl_kernel` and `from sgl_kernel.x import y` succeed there: every name (and every
attribute of one, e.g. `scalar_types.uint4b8`) is a stand-in that raises `StandInCalled` naming
itself when called. A real sgl_kernel always wins: `install()`
does nothing when one is importable, and the finder sits last on sys.meta_path."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

NAME = "sgl_kernel"
MARK = "__harness_stand_in__"


class StandInCalled(RuntimeError):
    """A function of the sgl_kernel stand-in was called: the code path needs the real sgl-kernel."""


class _Name:
    """A name imported from the stand-in: calling it raises; its attributes are names too."""

    def __init__(self, qualname: str):
        self.__qualname__ = qualname
        self.__name__ = qualname.rsplit(".", 1)[-1]

    def __call__(self, *args, **kwargs):
        raise StandInCalled(f"{self.__qualname__} was called, but sgl_kernel is the harness's import-time stand-in here "
                            "(the real sgl-kernel is not installed); install sgl-kernel to run this path")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _function(f"{self.__qualname__}.{attr}")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self.__qualname__}>"


def _function(qualname: str) -> _Name:
    return _Name(qualname)


class _Module(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _function(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == NAME or fullname.startswith(NAME + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        setattr(module, MARK, True)
        return module

    def exec_module(self, module) -> None:
        pass


_FINDER = _Finder()


def real_available() -> bool:
    """A real sgl_kernel is importable (the stand-in does not count)."""
    if NAME in sys.modules:
        return not is_stand_in(NAME)
    installed = _FINDER in sys.meta_path
    if installed:
        sys.meta_path.remove(_FINDER)
    try:
        return importlib.util.find_spec(NAME) is not None
    finally:
        if installed:
            sys.meta_path.append(_FINDER)


def install() -> bool:
    """Put the stand-in behind every other finder unless a real sgl_kernel exists; True if it is in place."""
    if _FINDER in sys.meta_path:
        return True
    if real_available():
        return False
    sys.meta_path.append(_FINDER)
    return True


def uninstall() -> None:
    """Remove the finder and every stand-in module imported through it."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n, m in sys.modules.items() if (n == NAME or n.startswith(NAME + ".")) and getattr(m, MARK, False)]:
        del sys.modules[name]


def is_stand_in(module: str) -> bool:
    """`module` (e.g. "sgl_kernel.flash_attn") resolves to the stand-in, not real code."""
    found = sys.modules.get(module)
    if found is None:
        try:
            found = importlib.import_module(module)
        except ImportError:
            return False
    return bool(getattr(found, MARK, False))
