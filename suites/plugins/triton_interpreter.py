"""pytest plugin for the TRITON_INTERPRET=1 child runs (suites.helpers.run_under_interpreter):
one language patch per kernel launch instead of one more per device-function call.

Under the interpreter a launch (GridExecutor.__call__) patches triton.language's builtins for
the launch and restores them at its end; every call of a @triton.jit helper inside the kernel
(InterpretedFunction.__call__) calls `_patch_lang` again, which walks the same modules with
inspect.getmembers, finds them patched already and re-sets the same attributes (its scope is
never restored: the launch's restore undoes them). That repeat is ~30% of an interpreted
fused-MLA test. Here, while a launch's patch is live, a device-function call whose globals see
no triton.language module other than the ones the launch patched gets an empty scope instead;
so does one whose modules an earlier device-function call patched for good (Triton's own
library, triton.language.standard, sees only triton.language.core: the first such call patches
that module's builtins, and nothing ever restores them). Anything else (no launch live, a first
call from such a module, a Triton without these internals) goes to Triton's own `_patch_lang`. A missing patch cannot pass silently: an unpatched
builtin raises outside a JIT context. Installed only where run_under_interpreter asks for it
(MLA_HARNESS_INTERPRETER_CHILD=1).
"""

from __future__ import annotations

import inspect
import os

CHILD = "MLA_HARNESS_INTERPRETER_CHILD"
_LANGS: dict = {}
_state = {"installed": False, "entering": False, "live": [], "nested": set()}


def _langs(fn) -> frozenset[int]:
    """The triton.language modules `fn` sees (what Triton's `_patch_lang` patches for it), per function."""
    langs = _LANGS.get(fn)
    if langs is None:
        import triton.language as tl

        langs = _LANGS[fn] = frozenset({id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and (v is tl or v is tl.core)})
    return langs


def install() -> bool:
    """Install the shim (once); False where this Triton lacks the internals it relies on."""
    if _state["installed"]:
        return True
    try:
        from triton.runtime import interpreter as ti
    except ImportError:
        return False
    grid, scope_cls, original = getattr(ti, "GridExecutor", None), getattr(ti, "_LangPatchScope", None), getattr(ti, "_patch_lang", None)
    if grid is None or scope_cls is None or original is None or "_patch_lang" not in inspect.getsource(grid.__call__):
        return False
    grid_call = grid.__call__

    def patch_lang(fn):
        live = _state["live"]
        if _state["entering"]:  # the launch's own patch: real, and live until its restore
            _state["entering"] = False
            scope = original(fn)
            live.append(_langs(fn))
            restore = scope.restore

            def restore_and_leave():
                live.pop()
                restore()

            scope.restore = restore_and_leave
            return scope
        langs = _langs(fn)
        if live and (langs <= live[-1] or langs in _state["nested"]):  # a device-function call inside a patched launch
            return scope_cls()
        if live:  # its patches of modules the launch did not patch (tl.core for triton.language.standard) stay
            _state["nested"].add(langs)
        return original(fn)

    def launch(self, *args, **kwargs):
        _state["entering"] = True
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            _state["entering"] = False

    ti._patch_lang = patch_lang
    grid.__call__ = launch
    _state["installed"] = True
    return True


def pytest_configure(config):
    if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get(CHILD) == "1":
        install()
