"""The run loop: a crashing strategy is an `error` verdict while the others still run; the dumps are written together at the end."""

import pytest
import safetensors.torch
import torch
from rich.console import Console

from harness.api import RunConfig, run
from harness.inputs.cases import load_case
from harness.strategies.gather_cast import GatherCast
from harness.verify.check import Status


def test_crashing_strategy_is_an_error_verdict_and_others_still_run(monkeypatch):
    def broken(self, layer):
        raise RuntimeError("planted kernel crash")

    monkeypatch.setattr(GatherCast, "cast_call", broken)
    cfg = RunConfig(case=load_case("glm5-tp8.ci.b1-l500"), device=torch.device("cpu"),
                    strategies=("stock", "gather_cast", "shadow"), repeats=0)
    outcome = run(cfg, Console(quiet=True))
    verdicts = {r.strategy: r.verdict for r in outcome.results}
    assert verdicts["gather_cast"].status == Status.ERROR
    assert "planted kernel crash" in verdicts["gather_cast"].reason
    assert verdicts["stock"].passed and verdicts["shadow"].passed


def test_stock_runs_first_so_the_bitwise_tier_applies_in_any_order(monkeypatch):
    cfg = RunConfig(case=load_case("glm5-tp8.ci.b1-l500"), device=torch.device("cpu"),
                    strategies=("shadow", "stock"), repeats=0)
    calls = []
    original = __import__("harness.api", fromlist=["check_bitwise"]).check_bitwise
    monkeypatch.setattr("harness.api.check_bitwise", lambda *a: calls.append(a[-1]) or original(*a))
    outcome = run(cfg, Console(quiet=True))
    assert [r.strategy for r in outcome.results] == ["shadow", "stock"]
    assert calls and set(calls) == {"stock"}


def test_nothing_runnable_is_a_failed_check_not_a_pass(monkeypatch):
    from harness.backends.torch_backend import TorchBackend
    from harness.errors import CheckFailed

    monkeypatch.setattr(TorchBackend, "unsupported_reason", lambda self, device, dtype: "planted: no kernel")
    cfg = RunConfig(case=load_case("glm5-tp8.ci.b1-l500"), device=torch.device("cpu"), strategies=("native_fp8",), repeats=0)
    try:
        run(cfg, Console(quiet=True))
    except CheckFailed as exc:
        assert "nothing was checked" in str(exc) and "planted: no kernel" in str(exc)
    else:
        raise AssertionError("a run that checked nothing passed")


def test_bitwise_strategy_brings_stock_along():
    cfg = RunConfig(case=load_case("glm5-tp8.ci.b1-l500"), device=torch.device("cpu"), strategies=("shadow",), repeats=0)
    outcome = run(cfg, Console(quiet=True))
    assert [r.strategy for r in outcome.results] == ["stock", "shadow"] and all(r.verdict.passed for r in outcome.results)


def test_missing_stock_outputs_fail_the_bitwise_tier():
    from harness.api import _verdict
    from harness.verify import golden

    gold = golden.load("glm5-tp8.ci.b1-l500")
    outputs = {k: (gold.out(*k).to(torch.bfloat16), gold.lse(*k)) for k in gold.keys()}
    assert _verdict("shadow", "torch", outputs, gold, outputs, "bitwise").passed
    verdict = _verdict("shadow", "torch", outputs, gold, None, "bitwise")
    assert not verdict.passed and "bitwise tier not checked" in verdict.reason


def _dump_cfg(folder):
    return RunConfig(case=load_case("glm5-tp8.ci.b1-l500"), device=torch.device("cpu"), strategies=("stock", "gather_cast"), repeats=0,
                     dump_outputs=folder)


def test_an_interrupted_run_leaves_every_earlier_dump_as_it_was(tmp_path, monkeypatch):
    """Each strategy's dump was written as it finished: a Ctrl-C in the second left a new stock dump beside an old
    gather_cast one. Now all are written together after the last strategy."""
    import harness.api

    old = {tmp_path / f"glm5-tp8.ci.b1-l500.{n}.safetensors": f"old {n}".encode() for n in ("stock", "gather_cast")}
    for path, data in old.items():
        path.write_bytes(data)
    execute = harness.api._execute

    def interrupted(prep, name, cfg, console):
        if name == "gather_cast":
            raise KeyboardInterrupt
        return execute(prep, name, cfg, console)

    monkeypatch.setattr(harness.api, "_execute", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(_dump_cfg(tmp_path), Console(quiet=True))
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == old


def test_a_finished_run_dumps_every_strategys_outputs(tmp_path):
    outcome = run(_dump_cfg(tmp_path), Console(quiet=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"glm5-tp8.ci.b1-l500.{n}.safetensors" for n in ("gather_cast", "stock")]
    for r in outcome.results:
        dumped = safetensors.torch.load_file(tmp_path / f"glm5-tp8.ci.b1-l500.{r.strategy}.safetensors")
        for (step, layer), (out, lse) in r.outputs.items():
            assert torch.equal(dumped[f"s{step}.l{layer}.out"], out) and torch.equal(dumped[f"s{step}.l{layer}.lse"], lse)
