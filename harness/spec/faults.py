"""Planted faults: each must turn a correctness verdict red (negative controls).

The strategies whose code path a fault lives in are declared by register(faults=...) only
(harness.strategies.FAULT_TARGETS); harness.verify.negative_controls refuses a fault a run cannot fire
and fails one that did not fire."""

from __future__ import annotations

from enum import Enum

from harness.errors import HarnessError


class Fault(str, Enum):
    SHADOW_SKIPPED_STEP = "shadow-skipped-step"  # no BF16 shadow write on the last step
    REMAP_OFF_BY_ONE = "remap-off-by-one"  # sequential (compact-buffer) indices start at 1
    SCALE_ERROR = "scale-error-1pct"  # kv scale 1.01 instead of 1.0 (the FP8 paths)
    STALE_AFTER_REUSE = "stale-after-reuse"  # no BF16 shadow write into a reused slot
    DROPPED_LAST_TOKEN = "dropped-last-token"  # each request's newest token is not attended (every strategy)
    NAN_IN_POOL = "nan-in-pool"  # the first token written holds a NaN code (every strategy)
    REQ_TO_TOKEN_OFF_BY_ONE = "req-to-token-off-by-one"  # SGLang's req_to_token names the next slot for each newest token
    LAST_REQUEST_MISREAD = "last-request-misread"  # the batch's last request reads the first's rows (the FP8 paths)


# The built-in scenario that exercises each fault (slot reuse, several steps, short requests).
CONTROL_SCENARIO = {
    Fault.SHADOW_SKIPPED_STEP: "multistep-reuse",
    Fault.REMAP_OFF_BY_ONE: "b1-l500",
    Fault.SCALE_ERROR: "b1-l4096",
    Fault.STALE_AFTER_REUSE: "multistep-reuse",
    Fault.DROPPED_LAST_TOKEN: "b1-l500",
    Fault.NAN_IN_POOL: "b1-l500",
    Fault.REQ_TO_TOKEN_OFF_BY_ONE: "b1-l500",
    Fault.LAST_REQUEST_MISREAD: "wide-ragged",  # its last request is one the golden does not store
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
