"""The strategy registry. Adding a strategy = one module with a `@register(...)` class + one line here."""

from harness.faults import Fault
from harness.strategies import fused_fp8, gather_cast, native_fp8, shadow, stock  # noqa: F401  (one line per strategy)
from harness.strategies.base import REGISTRY, Strategy

ORDER = tuple(sorted(REGISTRY, key=lambda name: REGISTRY[name].order))
BASELINE = next(name for name in ORDER if REGISTRY[name].baseline)  # the bitwise anchor: stock
# The strategy whose code path each fault lives in (None: a fault of the shared inputs, any strategy).
FAULT_TARGET = {f: next((n for n in ORDER if f in REGISTRY[n].faults_owned), None) for f in Fault}



def select(names, default: tuple[str, ...]) -> tuple[str, ...]:
    """The --strategy list (repeats dropped, order kept), or `default`; an unknown name is bad input."""
    from harness.errors import HarnessError

    chosen = tuple(dict.fromkeys(names)) if names else default
    for name in chosen:
        if name not in REGISTRY:
            raise HarnessError("--strategy", f"unknown strategy {name!r}; choose from {', '.join(ORDER)}")
    return chosen


__all__ = ["REGISTRY", "ORDER", "BASELINE", "FAULT_TARGET", "Strategy", "select"]
