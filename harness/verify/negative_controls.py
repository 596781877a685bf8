"""Negative controls around a run: refuse a planted fault the run cannot fire, fail one that did not.

A fault's targets are the strategies that claim it with register(faults=...) (FAULT_TARGETS); a fault
no strategy claims (a fault of the shared inputs) targets every strategy.
"""

from __future__ import annotations

from harness.errors import HarnessError
from harness.spec.faults import Fault
from harness.strategies import FAULT_TARGETS


def _names(targets) -> str:
    return targets[0] if len(targets) == 1 else f"{', '.join(targets[:-1])} or {targets[-1]}"


def cannot_fire(faults, strategies, case) -> None:
    """Refuse (HarnessError) a planted fault that this run cannot trigger: none of its strategies is
    selected, or the scenario lacks what it corrupts (slot reuse, a checked first request)."""
    for fault in sorted(faults):
        targets = FAULT_TARGETS[fault]
        if targets and not any(t in strategies for t in targets):
            which = "which is not" if len(targets) == 1 else "neither of which is"
            raise HarnessError("--plant-fault", f"{fault.value} lives in {_names(targets)}, {which} selected (--strategy)")
        if fault == Fault.STALE_AFTER_REUSE:
            if not any(len(b.reused_slots) for b in case.schedule().steps):
                raise HarnessError("--plant-fault", f"{fault.value} needs slot reuse; scenario {case.scenario.name} reuses none (try multistep-reuse)")
        if fault == Fault.LAST_REQUEST_MISREAD and all(b.batch_size < 2 for b in case.schedule().steps):
            raise HarnessError("--plant-fault", f"{fault.value} needs two requests in a step; scenario {case.scenario.name} has one "
                               "(try wide-ragged)")
        if fault == Fault.NAN_IN_POOL:
            first = case.schedule().steps[0].request_ids[0]
            if first not in case.checked_request_ids():
                raise HarnessError("--plant-fault", f"{fault.value} poisons request {first}, which {case.name} does not check")


def did_not_fire(faults, results) -> None:
    """After a run: every planted fault must have turned red a strategy it lives in (a fault of the
    shared inputs: any strategy) and, where several claim it, each of them that ran."""
    for fault in sorted(faults):
        targets = FAULT_TARGETS[fault]
        hit = [r for r in results if not targets or r.strategy in targets]
        red = [r.verdict.status.value in ("fail", "error") for r in hit]
        ran = [ok for r, ok in zip(hit, red) if r.verdict.status.value != "unsupported"]
        if not any(red) or (targets and not all(ran)):
            said = ", ".join(f"{r.strategy} {r.verdict.status.value}" for r in hit) or "no strategy ran"
            raise HarnessError("--plant-fault", f"{fault.value} did not fire ({said}): the negative control proves nothing")
