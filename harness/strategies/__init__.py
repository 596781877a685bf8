"""The strategy registry. Adding a strategy = one module with a `@register(...)` class + one line here."""

from harness.faults import Fault
from harness.strategies import fused_fp8, gather_cast, native_fp8, shadow, stock  # noqa: F401  (one line per strategy)
from harness.strategies.base import REGISTRY, Strategy

ORDER = tuple(sorted(REGISTRY, key=lambda name: REGISTRY[name].order))
BASELINE = next(name for name in ORDER if REGISTRY[name].baseline)  # the bitwise anchor: stock
# The strategy whose code path each fault lives in (None: a fault of the shared inputs, any strategy).
FAULT_TARGET = {f: next((n for n in ORDER if f in REGISTRY[n].faults_owned), None) for f in Fault}

__all__ = ["REGISTRY", "ORDER", "BASELINE", "FAULT_TARGET", "Strategy"]
