"""Planted faults: each must turn a correctness verdict red (negative controls)."""

from __future__ import annotations

from enum import Enum

from harness.errors import HarnessError


class Fault(str, Enum):
    SHADOW_SKIPPED_STEP = "shadow-skipped-step"  # shadow: no BF16 write on the last step
    REMAP_OFF_BY_ONE = "remap-off-by-one"  # gather_cast: sequential indices start at 1
    SCALE_ERROR = "scale-error-1pct"  # native_fp8: kv scale 1.01 instead of 1.0
    STALE_AFTER_REUSE = "stale-after-reuse"  # shadow: no BF16 write into a reused slot
    DROPPED_LAST_TOKEN = "dropped-last-token"  # any: each request's newest token is not attended
    NAN_IN_POOL = "nan-in-pool"  # any: the first token written holds a NaN code


# The built-in scenario that exercises each fault (slot reuse, several steps, short requests).
CONTROL_SCENARIO = {
    Fault.SHADOW_SKIPPED_STEP: "multistep-reuse",
    Fault.REMAP_OFF_BY_ONE: "b1-l500",
    Fault.SCALE_ERROR: "b1-l4096",
    Fault.STALE_AFTER_REUSE: "multistep-reuse",
    Fault.DROPPED_LAST_TOKEN: "b1-l500",
    Fault.NAN_IN_POOL: "b1-l500",
}

NAN_CODE = 0x7F


def parse_faults(names) -> frozenset[Fault]:
    faults = set()
    for name in names or ():
        try:
            faults.add(Fault(name))
        except ValueError:
            known = ", ".join(f.value for f in Fault)
            raise HarnessError("--plant-fault", f"unknown fault {name!r}; choose from {known}") from None
    return frozenset(faults)


def cannot_fire(faults, strategies, case) -> None:
    """Refuse (HarnessError) a planted fault that this run cannot trigger: its strategy is not
    selected, or the scenario lacks what it corrupts (slot reuse, a checked first request)."""
    from harness.strategies import FAULT_TARGET

    for fault in sorted(faults):
        target = FAULT_TARGET[fault]
        if target is not None and target not in strategies:
            raise HarnessError("--plant-fault", f"{fault.value} lives in {target}, which is not selected (--strategy)")
        if fault == Fault.STALE_AFTER_REUSE:
            if not any(len(b.reused_slots) for b in case.schedule().steps):
                raise HarnessError("--plant-fault", f"{fault.value} needs slot reuse; scenario {case.scenario.name} reuses none (try multistep-reuse)")
        if fault == Fault.NAN_IN_POOL:
            first = case.schedule().steps[0].request_ids[0]
            if first not in case.checked_request_ids():
                raise HarnessError("--plant-fault", f"{fault.value} poisons request {first}, which {case.name} does not check")


def did_not_fire(faults, results) -> None:
    """After a run: every planted fault must have turned a strategy it lives in red."""
    from harness.strategies import FAULT_TARGET

    for fault in sorted(faults):
        target = FAULT_TARGET[fault]
        hit = [r for r in results if target in (None, r.strategy)]
        if not any(r.verdict.status.value in ("fail", "error") for r in hit):
            ran = ", ".join(f"{r.strategy} {r.verdict.status.value}" for r in hit) or "no strategy ran"
            raise HarnessError("--plant-fault", f"{fault.value} did not fire ({ran}): the negative control proves nothing")
