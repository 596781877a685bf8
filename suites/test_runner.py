"""The run loop: a crashing strategy is an `error` verdict while the others still run."""

import torch
from rich.console import Console

from harness.cases import load_case
from harness.check import Status
from harness.runner import RunConfig, run
from harness.strategies.gather_cast import GatherCast


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
    original = __import__("harness.runner", fromlist=["check_bitwise"]).check_bitwise
    monkeypatch.setattr("harness.runner.check_bitwise", lambda *a: calls.append(a[-1]) or original(*a))
    outcome = run(cfg, Console(quiet=True))
    assert [r.strategy for r in outcome.results] == ["shadow", "stock"]
    assert calls and set(calls) == {"stock"}
