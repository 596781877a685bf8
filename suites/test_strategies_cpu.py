"""Every strategy matches the goldens on CPU; stock, gather_cast and shadow agree bit for bit."""

import pytest
import torch

from harness.cases import golden_case_names

from suites.helpers import run_strategies

CI_CASES = [n for n in golden_case_names() if ".ci." in n]
STRATEGIES = ("stock", "gather_cast", "shadow", "native_fp8")


@pytest.mark.parametrize("case_name", CI_CASES)
def test_all_strategies_pass_golden(case_name):
    results = run_strategies(case_name, STRATEGIES)
    for name, (_, verdict) in results.items():
        assert verdict.passed, f"{name}: {verdict.reason}"
    stock = results["stock"][0]
    for name in ("gather_cast", "shadow"):
        for key, (out, lse) in results[name][0].items():
            assert torch.equal(out.view(torch.int16), stock[key][0].view(torch.int16)), f"{name} {key}"
            assert torch.equal(lse, stock[key][1])
