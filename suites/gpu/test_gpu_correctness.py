"""Production-scale correctness on the GPU: every supported strategy against the goldens."""

import pytest
import torch

from harness.backends import make_backend
from harness.inputs.cases import golden_case_names
from harness.spec.faults import CONTROL_SCENARIO
from harness.strategies import BASELINE, FAULT_TARGET, ORDER, REGISTRY
from suites.helpers import flashinfer_or_skip, run_strategies

pytestmark = [pytest.mark.gpu]

PROD_CASES = [n for n in golden_case_names() if ".prod." in n]


def _supported(device, kernel="auto"):
    backend = flashinfer_or_skip(device, kernel)
    return [n for n in ORDER if REGISTRY[n].unsupported_reason(device, backend) is None]


@pytest.mark.prod
@pytest.mark.parametrize("kernel", ["fa3", "fa2"])  # fa2: the kernel SGLang's backend="auto" runs on SM120
@pytest.mark.parametrize("case_name", PROD_CASES)
def test_prod_strategies_match_golden(case_name, kernel, gpu_device):
    # require: a supported strategy that crashed (an error verdict, no outputs) fails here instead of going missing
    results = run_strategies(case_name, _supported(gpu_device, kernel), device=gpu_device, backend="flashinfer", kernel=kernel,
                             require=True)
    for name, (_, verdict) in results.items():
        assert verdict.passed, f"{name}: {verdict.reason}"
    stock = results[BASELINE][0]
    for name in (n for n in ORDER if REGISTRY[n].tier == "bitwise" and n != BASELINE):
        if name in results:
            for key, (out, lse) in results[name][0].items():
                assert torch.equal(out.view(torch.int16), stock[key][0].view(torch.int16)), f"{name} {key} not bitwise"


def test_torch_backend_on_cuda_matches_golden(gpu_device):
    """Every strategy the torch backend runs on this GPU (an SGLang-backed one: suites/gpu/test_sglang_gpu.py)."""
    backend = make_backend("torch", gpu_device)
    wanted = [n for n in ORDER if not REGISTRY[n].runs_sglang and REGISTRY[n].unsupported_reason(gpu_device, backend) is None]
    results = run_strategies("glm5-tp8.ci.ragged-mix", wanted, device=gpu_device, backend="torch", require=True)
    for name, (_, verdict) in results.items():
        assert verdict.passed, f"{name}: {verdict.reason}"


CONTROLS = [(fault, f"glm5-tp8.prod.{scenario}") for fault, scenario in CONTROL_SCENARIO.items()]


@pytest.mark.prod
@pytest.mark.parametrize("fault, case_name", CONTROLS, ids=[f.value for f, _ in CONTROLS])
def test_gpu_negative_controls(fault, case_name, gpu_device):
    target = FAULT_TARGET[fault] or "gather_cast"
    if target not in _supported(gpu_device):
        pytest.skip(f"{target} is unsupported on this GPU")
    faulty = run_strategies(case_name, (target,), device=gpu_device, backend="flashinfer", faults=frozenset([fault]))
    assert not faulty[target][1].passed, f"{fault.value} went unnoticed on the GPU"
