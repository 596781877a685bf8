"""Planted faults: each must turn a correctness verdict red (negative controls).

The strategies whose code path a fault lives in are declared by register(faults=...) only
(harness.strategies.FAULT_TARGETS); harness.verify.negative_controls refuses a fault a run cannot fire
and fails one that did not fire."""

from __future__ import annotations

from enum import Enum

from harness.errors import HarnessError


class Fault(str, Enum):
    """A planted fault: its --plant-fault name and the built-in scenario that exercises it (slot reuse, several steps,
    short requests), declared together so no fault lacks its negative control (CONTROL_SCENARIO)."""

    def __new__(cls, value: str, scenario: str):
        fault = str.__new__(cls, value)
        fault._value_, fault.scenario = value, scenario
        return fault

    SHADOW_SKIPPED_STEP = "shadow-skipped-step", "multistep-reuse"  # no BF16 shadow write on the last step
    REMAP_OFF_BY_ONE = "remap-off-by-one", "b1-l500"  # sequential (compact-buffer) indices start at 1
    SCALE_ERROR = "scale-error-1pct", "b1-l4096"  # kv scale 1.01 instead of 1.0 (the FP8 paths)
    STALE_AFTER_REUSE = "stale-after-reuse", "multistep-reuse"  # no BF16 shadow write into a reused slot
    DROPPED_LAST_TOKEN = "dropped-last-token", "b1-l500"  # each request's newest token is not attended (every strategy)
    NAN_IN_POOL = "nan-in-pool", "b1-l500"  # the first token written holds a NaN code (every strategy)
    REQ_TO_TOKEN_OFF_BY_ONE = "req-to-token-off-by-one", "b1-l500"  # SGLang's req_to_token names the next slot for each newest token
    # the batch's last request reads the first's rows (the FP8 paths); its scenario's last request is one the golden does not store
    LAST_REQUEST_MISREAD = "last-request-misread", "wide-ragged"


CONTROL_SCENARIO = {fault: fault.scenario for fault in Fault}  # fault -> the scenario of its negative control

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
