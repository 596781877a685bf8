"""The strategy registry. Adding a strategy = one module with a `@register(...)` class + one line here.

Every name list is a live view of REGISTRY (read at each use), so a strategy registered later (a
plugin, or a test's toy strategy) is in ORDER, the defaults, FAULT_TARGETS and the contracts at once.
"""

from collections.abc import Mapping, Sequence

from harness.errors import HarnessError
from harness.spec.faults import Fault
from harness.strategies import fused_fp8, gather_cast, native_fp8, sglang_backend, shadow, stock  # noqa: F401  (one line per strategy)
from harness.strategies.base import REGISTRY, Strategy, register, unregister


def _ordered() -> tuple[str, ...]:
    return tuple(sorted(REGISTRY, key=lambda name: REGISTRY[name].order))


class _Order(Sequence):
    """The registered strategy names by `order` (runs, tables, test lists), read from REGISTRY at each use."""

    def __init__(self, keep=lambda cls: True):
        self._keep = keep

    def _names(self) -> tuple[str, ...]:
        return tuple(n for n in _ordered() if self._keep(REGISTRY[n]))

    def __getitem__(self, index):
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self):
        return iter(self._names())

    def __eq__(self, other):
        return tuple(self) == tuple(other) if isinstance(other, Sequence) and not isinstance(other, str) else NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self._names())


class _FaultTargets(Mapping):
    """fault -> the strategies whose code path it lives in (register(faults=...)), by order; () = any strategy."""

    def __getitem__(self, fault: Fault) -> tuple[str, ...]:
        return tuple(n for n in _ordered() if Fault(fault) in REGISTRY[n].faults_owned)

    def __iter__(self):
        return iter(Fault)

    def __len__(self) -> int:
        return len(Fault)


class _FaultTarget(Mapping):
    """fault -> its first target (FAULT_TARGETS[fault][0]), None for a fault of the shared inputs."""

    def __getitem__(self, fault: Fault) -> str | None:
        return next(iter(FAULT_TARGETS[fault]), None)

    def __iter__(self):
        return iter(Fault)

    def __len__(self) -> int:
        return len(Fault)


ORDER = _Order()
BENCHMARKED = _Order(lambda cls: cls.benchmark)  # the asv benchmarks' and `harness tpot`'s default list
RUN_DEFAULT = _Order(lambda cls: not cls.runs_sglang)  # `harness run`'s default list; the SGLang-backed run when named
# the SGLang driver's strategies: the baseline (SGLang's own path) and those declaring register(sglang=...)
SGLANG = _Order(lambda cls: cls.baseline or bool(cls.sglang))
BASELINE = next(name for name in ORDER if REGISTRY[name].baseline)  # the bitwise anchor: stock
FAULT_TARGETS = _FaultTargets()
FAULT_TARGET = _FaultTarget()


def select(names, default) -> tuple[str, ...]:
    """The --strategy list (repeats dropped, order kept), or `default`; an unknown name is bad input."""
    chosen = tuple(dict.fromkeys(names)) if names else tuple(default)
    for name in chosen:
        if name not in REGISTRY:
            raise HarnessError("--strategy", f"unknown strategy {name!r}; choose from {', '.join(ORDER)}")
    return chosen


__all__ = ["REGISTRY", "ORDER", "BENCHMARKED", "RUN_DEFAULT", "SGLANG", "BASELINE", "FAULT_TARGET", "FAULT_TARGETS", "Strategy", "register",
           "unregister", "select"]
