"""asv benchmarks of the SGLang gate: the harness's (suites/asv/benchmarks.py) plus each strategy's verdict.

ci/sglang_gate.py points asv here. Every class of suites/asv/benchmarks.py is kept under its name (the
asv gate reads the metric from it; derived from that module, so a new metric's class needs no edit here) and
shares one setup_cache that runs the harness's measurement and then checks the same case as `harness run`
does (runner.run, no timing: golden, and bitwise against `stock` for a bitwise-tier strategy), so a commit
of SGLang that times well but computes wrong is caught too: `Verdict.track_verdict` is 0 when the verdict
passes, 1 when it fails or errors, and n/a (skipped by setup, as the strategy's timings are) when it is unsupported; asv's comparison marks 0 -> 1 worse,
which the gate fails on (the `verdict` metric gates everywhere), and the gate fails a head whose verdict
is 1 whatever the base had (asv calls 1 -> 1 unchanged), while pass -> n/a is a benchmark the head lost. When no SGLang-backed strategy runs (each unsupported: say the commit's
SGLang does not import; `stock` passing alone gates none of it) setup_cache fails, so the gate exits 2 instead of calling nothing "unchanged".
Presets, scenarios, strategies and samples: MLA_ASV_* as in suites/asv/benchmarks.py.
"""

import json

from ci import sglang_gate
from suites.asv import benchmarks as harness_bench


def _measure_and_check(_self=None) -> str:
    """(A setup_cache: asv passes the benchmark instance.) The harness's measurement JSON, each case it measured with
    {"verdicts": {strategy: status}} added."""
    import torch
    from rich.console import Console

    from harness.api import RunConfig, run
    from harness.inputs.cases import Case
    from harness.spec.presets import get_preset, get_scale
    from harness.spec.scenario import load_scenario

    out = json.loads(harness_bench._measure_all())
    device = torch.device("cuda" if harness_bench.cuda() else "cpu")
    for preset, cases in out.items():
        for scenario, measured in cases.items():
            if "skipped" in measured:  # a preset or scenario this commit lacks: n/a, its timings too
                continue
            case = Case(get_preset(preset), get_scale("prod" if device.type == "cuda" else "ci"), load_scenario(scenario))
            outcome = run(RunConfig(case, device, strategies=tuple(harness_bench.STRATEGIES), repeats=0), Console(quiet=True))
            measured["verdicts"] = checked({r.strategy: (r.verdict.status.value, r.verdict.reason) for r in outcome.results}, case.name)
    return json.dumps(out)


def checked(verdicts: dict[str, tuple[str, str | None]], case: str) -> dict[str, str]:
    """{strategy: status} of `verdicts` ({strategy: (status, reason)}), or RuntimeError (setup_cache fails: the gate
    exits 2) when no SGLang-backed strategy ran (`ci.sglang_gate.unchecked`, the --json mode's rule): a commit whose
    SGLang cannot be imported, or strategies that cannot run here, never pass as unchanged."""
    if why := sglang_gate.unchecked(verdicts):
        raise RuntimeError(f"{case}: nothing requested could be checked: {why}")
    return {s: status for s, (status, _) in verdicts.items()}


class _Shared:
    setup_cache = _measure_and_check  # one process per commit: a pool per scenario, then the check
    _measure_and_check.timeout = 3600


for _name, _bench in vars(harness_bench).copy().items():  # every benchmark class of the harness's, under its name
    if isinstance(_bench, type) and not _name.startswith("_") and _bench.__module__ == harness_bench.__name__:
        globals()[_name] = type(_name, (_Shared, _bench), {"__module__": __name__})


class Verdict(_Shared):
    """0 when the strategy's verdict on the scenario passes, 1 otherwise (lower is better, as asv assumes)."""

    params, param_names = harness_bench._Measured.params, harness_bench._Measured.param_names
    timeout = 3600

    def setup(self, cache, scenario, strategy, preset):  # asv skips (n/a) what setup refuses; from the benchmark: failed
        verdict = harness_bench._case(cache, scenario, preset)["verdicts"][strategy]
        if verdict == "unsupported":  # n/a, as its timings are: not a failure at both commits, nor a pass
            raise NotImplementedError(f"{strategy} is unsupported on {preset} {scenario} here")
        self.value = 0 if verdict == "pass" else 1

    def track_verdict(self, cache, scenario, strategy, preset):
        return self.value

    track_verdict.unit = "failed"
