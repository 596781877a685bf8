"""asv benchmarks: per-commit end-to-end TPOT (model-shaped decode step of one glm5-tp8 rank) per
strategy x scenario, and the attention path's share of it — what `harness tpot` reports.

On CUDA: production pool, the full 78-layer GLM-5 TP8 rank (4 rotated weight sets), no all-reduce
time (MLA_ASV_ALLREDUCE_TABLE=path adds the measured latency stand-in). On CPU only with
MLA_ASV_TPOT=1 (the shrunk model on a 2,048-slot pool), so the CPU asv test of benchmarks.py does
not pay for them. MLA_ASV_SCENARIOS / MLA_ASV_STRATEGIES /
MLA_ASV_REPEATS narrow the matrix as for benchmarks.py (default strategies: the registry's BENCHMARKED).
"""

import os
import sys

import torch

CUDA = torch.cuda.is_available()
SCENARIOS = os.environ.get("MLA_ASV_SCENARIOS", "b1-l4096,b32-l4096" if CUDA else "b1-l500").split(",")


def benchmarked() -> str:
    """The default strategies: the registry's (every registered strategy but register(benchmark=False)
    ones), so a new strategy is timed here and by the perf gate without another edit. asv runs these
    files against older commits too (the perf gate's base): a harness from before the registry
    declared `benchmark` has every strategy timed."""
    from harness import strategies

    if hasattr(strategies, "BENCHMARKED"):
        return ",".join(strategies.BENCHMARKED)
    return ",".join(n for n in strategies.ORDER if getattr(strategies.REGISTRY[n], "benchmark", True))


STRATEGIES = (os.environ["MLA_ASV_STRATEGIES"] if "MLA_ASV_STRATEGIES" in os.environ else benchmarked()).split(",")
REPEATS = int(os.environ.get("MLA_ASV_REPEATS", "20" if CUDA else "2"))


def _measure(scenario: str, strategy: str) -> dict:
    from harness.backends import make_backend
    from harness.cases import Case
    from harness.model.allreduce import AllReduce, LatencyAllReduce, load_table
    from harness.model.config import load_shape
    from harness.model.tpot import build_context, time_strategy
    from harness.presets import get_preset, get_scale
    from harness.scenario import load_scenario
    from harness.strategies import REGISTRY

    device = torch.device("cuda" if CUDA else "cpu")
    if reason := REGISTRY[strategy].unsupported_reason(device, make_backend("auto", device)):
        print(f"skipped {strategy}: {reason}", file=sys.stderr)
        raise NotImplementedError(reason)
    scale = get_scale("prod") if CUDA else get_scale("ci", slots=2048)
    case = Case(get_preset("glm5-tp8"), scale, load_scenario(scenario))
    table = os.environ.get("MLA_ASV_ALLREDUCE_TABLE")
    allreduce = LatencyAllReduce(load_table(table), device) if (table and CUDA) else AllReduce()
    ctx = build_context(case, load_shape("glm5-tp8", shrink=not CUDA), device, "auto", 4, allreduce)
    r = time_strategy(strategy, ctx, REPEATS)
    return {"tpot_ms": r.tpot, "attn_share": r.attn_share}


ENABLED = CUDA or os.environ.get("MLA_ASV_TPOT") == "1"


class _Tpot:
    params = (SCENARIOS, STRATEGIES)
    param_names = ["scenario", "strategy"]
    timeout = 900
    number = 1
    repeat = 1

    def setup(self, scenario, strategy):
        self.values = _measure(scenario, strategy)


if ENABLED:

    class TpotMs(_Tpot):
        def track_tpot_ms(self, scenario, strategy):
            return self.values["tpot_ms"]

        track_tpot_ms.unit = "ms"

    class AttnShare(_Tpot):
        def track_attn_share(self, scenario, strategy):
            return self.values["attn_share"]

        track_attn_share.unit = "ratio"
