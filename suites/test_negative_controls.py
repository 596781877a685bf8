"""Each planted fault turns the checker red; the same run without the fault is green."""

import pytest

from harness.faults import FAULT_TARGET, Fault

from helpers import run_strategies

# (fault, case that exercises it); multistep-reuse has slot reuse, short requests and several steps.
CONTROLS = [
    (Fault.SHADOW_SKIPPED_STEP, "glm5-tp8.ci.multistep-reuse"),
    (Fault.REMAP_OFF_BY_ONE, "glm5-tp8.ci.b1-l500"),
    (Fault.SCALE_ERROR, "glm5-tp8.ci.b1-l4096"),
    (Fault.STALE_AFTER_REUSE, "glm5-tp8.ci.multistep-reuse"),
    (Fault.DROPPED_LAST_TOKEN, "glm5-tp8.ci.b1-l500"),
    (Fault.NAN_IN_POOL, "glm5-tp8.ci.b1-l500"),
]


@pytest.mark.parametrize("fault, case_name", CONTROLS, ids=[f.value for f, _ in CONTROLS])
def test_fault_fails_the_checker(fault, case_name):
    target = FAULT_TARGET[fault] or "gather_cast"
    clean = run_strategies(case_name, (target,))
    assert clean[target][1].passed, clean[target][1].reason
    faulty = run_strategies(case_name, (target,), faults=frozenset([fault]))
    verdict = faulty[target][1]
    assert not verdict.passed, f"{fault.value} went unnoticed"
    assert verdict.reason


def test_stale_shadow_fails_even_without_bitwise_tier():
    """The golden comparison alone (not only the bitwise tier) catches a stale shadow row."""
    faulty = run_strategies("glm5-tp8.ci.multistep-reuse", ("shadow",), faults=frozenset([Fault.STALE_AFTER_REUSE]))
    assert "outside atol" in faulty["shadow"][1].reason
