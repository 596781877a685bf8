"""Each planted fault turns the checker red; the same run without the fault is green."""

import pytest
import torch

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


def test_nan_code_propagates_to_the_output():
    """A NaN code (0x7F) in the pool must reach the output as NaN, in every CPU strategy: failing
    through a large finite error (0x7F decoded as 480) would hide a broken NaN decode."""
    strategies = ("stock", "gather_cast", "shadow", "native_fp8")
    faulty = run_strategies("glm5-tp8.ci.b1-l500", strategies, faults=frozenset([Fault.NAN_IN_POOL]))
    assert set(faulty) == set(strategies)
    for name, (outputs, verdict) in faulty.items():
        assert not verdict.passed and verdict.stats.nonfinite > 0, f"{name}: NaN did not propagate ({verdict.reason})"
        assert not all(torch.isfinite(out).all() for out, _ in outputs.values()), name


@pytest.mark.parametrize("code", [0x7F, 0xFF])
def test_e4m3_nan_codes_decode_to_nan(code):
    """Both e4m3fn NaN codes decode to NaN in the reference and the torch backend's casts."""
    from harness.reference import StepInputs, mla_decode_f64

    rows = torch.zeros(4, 576, dtype=torch.uint8)
    rows[1, 3] = code
    q = torch.ones(1, 8, 576, dtype=torch.bfloat16)
    inputs = StepInputs(None, q[..., :512], q[..., 512:], [rows])
    out, _ = mla_decode_f64(inputs, 512, 0.0625)
    assert torch.isnan(out).any()
    assert torch.isnan(rows.view(torch.float8_e4m3fn).to(torch.bfloat16)).any()
