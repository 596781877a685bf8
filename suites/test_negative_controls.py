"""Each planted fault turns the checker red; the same run without the fault is green."""

import pytest

from harness.faults import CONTROL_SCENARIO, Fault
from harness.strategies import FAULT_TARGET

from suites.helpers import run_strategies

CONTROLS = [(fault, f"glm5-tp8.ci.{scenario}") for fault, scenario in CONTROL_SCENARIO.items()]


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
