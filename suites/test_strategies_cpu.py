"""Every CPU strategy matches the goldens; the bitwise tier equals the baseline (stock) bit for bit; the registry."""

import pytest
import torch

from harness.backends import make_backend
from harness.inputs.cases import golden_case_names
from harness.strategies import BASELINE, ORDER, REGISTRY
from suites.helpers import run_strategies

CI_CASES = [n for n in golden_case_names() if ".ci." in n]
# the SGLang-backed strategies run on CPU in the oracle venv: suites/sglang/test_sglang_adapter.py
STRATEGIES = tuple(n for n in ORDER if "cpu" in REGISTRY[n].devices and not REGISTRY[n].runs_sglang)
BITWISE = tuple(n for n in STRATEGIES if REGISTRY[n].tier == "bitwise" and n != BASELINE)


@pytest.mark.parametrize("case_name", CI_CASES)
def test_all_strategies_pass_golden(case_name):
    cpu = torch.device("cpu")
    backend = make_backend("torch", cpu)
    wanted = [n for n in STRATEGIES if REGISTRY[n].unsupported_reason(cpu, backend) is None]
    assert {"stock", "gather_cast", "shadow", "native_fp8"} <= set(wanted), wanted
    # require: a strategy that crashed (an error verdict, no outputs) fails here instead of going missing
    results = run_strategies(case_name, wanted, require=True)
    for name, (_, verdict) in results.items():
        assert verdict.passed, f"{name}: {verdict.reason}"
    stock = results[BASELINE][0]
    for name in BITWISE:
        for key, (out, lse) in results[name][0].items():
            assert torch.equal(out.view(torch.int16), stock[key][0].view(torch.int16)), f"{name} {key}"
            assert torch.equal(lse, stock[key][1])


def test_registry_declares_order_baseline_and_fault_targets():
    from harness.spec.faults import Fault
    from harness.strategies import BASELINE, FAULT_TARGET, ORDER, REGISTRY

    assert ORDER[0] == BASELINE == "stock" and [REGISTRY[n].baseline for n in ORDER].count(True) == 1
    assert list(ORDER) == sorted(REGISTRY, key=lambda n: REGISTRY[n].order)
    assert FAULT_TARGET[Fault.REMAP_OFF_BY_ONE] == "gather_cast" and FAULT_TARGET[Fault.NAN_IN_POOL] is None
    assert set(FAULT_TARGET) == set(Fault)


def test_registering_a_duplicate_or_second_baseline_fails():
    from harness.strategies.base import REGISTRY, Strategy, register

    before = dict(REGISTRY)
    with pytest.raises(ValueError, match="twice"):
        register("stock", order=999, devices=("cpu",), kv_dtype=torch.bfloat16, tier="bitwise")(type("X", (Strategy,), {}))
    with pytest.raises(ValueError, match="second baseline"):
        register("x2", order=998, devices=("cpu",), kv_dtype=torch.bfloat16, tier="bitwise", baseline=True)(type("X2", (Strategy,), {}))
    assert REGISTRY == before


def test_a_strategy_names_its_order_and_a_taken_one_names_its_holder():
    """No default order: one derived from the strategies imported so far collided with a shipped strategy whenever a
    new module sorted before the others in the import line (docs/extending.md's guide, ruff's import order)."""
    from harness.strategies.base import REGISTRY, Strategy, register

    before = dict(REGISTRY)
    with pytest.raises(TypeError, match="order"):
        register("toy", devices=("cpu",), kv_dtype=torch.bfloat16, tier="bitwise")
    with pytest.raises(ValueError, match="order 10 is stock's"):
        register("toy", order=10, devices=("cpu",), kv_dtype=torch.bfloat16, tier="bitwise")(type("T", (Strategy,), {}))
    assert REGISTRY == before


def test_shipped_tolerances_validate_against_the_registry():
    from harness.verify.check import POLICY_FILE, load_policy

    table = load_policy(POLICY_FILE)
    assert "default" in table and "native_fp8.flashinfer" in table


@pytest.mark.parametrize("key, message", [
    ('"nativ_fp8.flashinfer"', "unknown strategy 'nativ_fp8'"),
    ('"native_fp8.flashinfr"', "unknown backend 'flashinfr'"),
])
def test_tolerance_key_typo_is_an_error_naming_file_and_key(tmp_path, key, message):
    """Planted twin: the shipped file with one key misspelt must not load."""
    from harness.errors import HarnessError
    from harness.verify.check import POLICY_FILE, load_policy

    bad = tmp_path / "tolerances.toml"
    bad.write_text(POLICY_FILE.read_text().replace('"native_fp8.flashinfer"', key))
    with pytest.raises(HarnessError) as err:
        load_policy(bad)
    assert str(bad) in str(err.value) and "tolerance." + key.strip('"') in str(err.value) and message in str(err.value)


def test_kernel_flag_is_checked_before_any_work():
    from harness.backends import make_backend
    from harness.errors import HarnessError

    with pytest.raises(HarnessError, match="--kernel"):
        make_backend("torch", torch.device("cpu"), "fa2")
    with pytest.raises(HarnessError, match="--kernel"):
        make_backend("auto", torch.device("cpu"), "fa4")


def test_gather_cast_replan_keeps_the_index_tensor_a_graph_reads():
    """A graph captured over gather_cast's gather indices must see a re-plan: the tensor is refilled in
    place, never replaced (a replaced one is freed and its memory reused under the graph)."""
    import torch

    from harness.execute.prepared import PreparedCase
    from harness.inputs.cases import load_case

    prep = PreparedCase(load_case("glm5-tp8.ci.ragged-mix"), torch.device("cpu")).build()
    first, last = prep.schedule.steps
    with prep.session("gather_cast") as session:
        s = session.strategy
        s.begin_step(last)
        held = s.gather_indices
        s.step_indices(last)  # what replan_step calls, for the same step
        assert s.gather_indices is held
        s.use_graph_capacity(len(last.kv_indices))  # a graph over steps of different lengths
        s.begin_step(last)
        held = s.gather_indices
        s.step_indices(first)
        assert s.gather_indices is held and int(s.count) == len(first.kv_indices)
        assert torch.equal(held[: len(first.kv_indices)], torch.as_tensor(first.kv_indices, dtype=torch.int32))


def test_tolerance_tier_without_a_runnable_stock(monkeypatch):
    """stock anchors every strategy at the requests no golden stores. Where it cannot run (sm_89 has no FlashInfer
    policy, fused_fp8 runs there) the tolerance tier keeps its golden verdict and says what went unchecked; where it
    crashed, that is a failure of the check (twin)."""
    stock = REGISTRY[BASELINE]
    monkeypatch.setattr(stock, "unsupported_reason", classmethod(lambda cls, device, backend: "no policy here"))
    (_, verdict), = run_strategies("glm5-tp8.ci.wide-ragged", ("native_fp8",)).values()
    assert verdict.passed and "stock is unsupported here (no policy here)" in verdict.reason, verdict.reason
    monkeypatch.undo()

    def crash(self, *args):
        raise RuntimeError("stock crashed")

    monkeypatch.setattr(stock, "attend", crash)
    (_, verdict), = run_strategies("glm5-tp8.ci.wide-ragged", ("native_fp8",)).values()
    assert not verdict.passed and "not checked at every request: stock produced no outputs" in verdict.reason, verdict.reason


def _crash(self, *args):
    raise RuntimeError("gather_cast crashed")


def test_gpu_correctness_fails_a_strategy_that_crashed(monkeypatch):
    """The GPU correctness tests run on the CPU here (torch backend, a CI case): a strategy that crashed (an error
    verdict, no outputs) fails them, where it went missing from their results and they passed (twin: they pass
    when it does not crash)."""
    from suites import helpers
    from suites.gpu import test_gpu_correctness as gpu

    cpu = torch.device("cpu")

    def on_cpu(case_name, strategies, device, backend, kernel="auto", **kwargs):  # the prod test's call, on a CI case
        return helpers.run_strategies("glm5-tp8.ci.ragged-mix", strategies, **kwargs)

    monkeypatch.setattr(gpu, "_supported", lambda device, kernel="auto": ["stock", "gather_cast"])
    monkeypatch.setattr(gpu, "run_strategies", on_cpu)
    gpu.test_prod_strategies_match_golden("glm5-tp8.prod.b1-l4096", "fa2", cpu)
    monkeypatch.setattr(gpu, "run_strategies", helpers.run_strategies)
    gpu.test_torch_backend_on_cuda_matches_golden(cpu)
    monkeypatch.setattr(REGISTRY["gather_cast"], "attend", _crash)
    monkeypatch.setattr(gpu, "run_strategies", on_cpu)
    with pytest.raises(AssertionError, match="gather_cast did not run .error: RuntimeError: gather_cast crashed"):
        gpu.test_prod_strategies_match_golden("glm5-tp8.prod.b1-l4096", "fa2", cpu)
    monkeypatch.setattr(gpu, "run_strategies", helpers.run_strategies)
    with pytest.raises(AssertionError, match="gather_cast did not run .error: RuntimeError: gather_cast crashed"):
        gpu.test_torch_backend_on_cuda_matches_golden(cpu)


def test_all_strategies_pass_golden_fails_a_strategy_that_crashed(monkeypatch):
    """The negative control of test_all_strategies_pass_golden: a crashing native_fp8 fails it (it went missing)."""
    def crash(self, *args):
        raise RuntimeError("native_fp8 crashed")

    monkeypatch.setattr(REGISTRY["native_fp8"], "attend", crash)
    with pytest.raises(AssertionError, match="native_fp8 did not run .error: RuntimeError: native_fp8 crashed"):
        test_all_strategies_pass_golden("glm5-tp8.ci.ragged-mix")
