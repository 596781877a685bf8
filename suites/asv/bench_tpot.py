"""asv benchmarks: per-commit end-to-end TPOT (model-shaped decode step of one tensor-parallel rank of the
preset's model) per strategy x scenario x preset, and the attention path's share of it — what `harness tpot` reports.

On CUDA: production pool, the preset's full rank (GLM-5 TP8: 78 layers; DeepSeek-V3 TP8: 61; 4 rotated weight
sets), no all-reduce time (MLA_ASV_ALLREDUCE_TABLE=path adds the measured latency stand-in). On CPU only with
MLA_ASV_TPOT=1 (the shrunk model on a 2,048-slot pool), so the CPU asv test of benchmarks.py does
not pay for them. MLA_ASV_PRESETS / MLA_ASV_SCENARIOS / MLA_ASV_STRATEGIES /
MLA_ASV_REPEATS narrow the matrix as for benchmarks.py (default strategies: the registry's BENCHMARKED);
harness/envvars.py checks them (a bad value fails setup with one line naming the variable; a name this commit's
harness lacks is n/a, as in benchmarks.py).
"""

import inspect
import sys

import torch

from .benchmarks import BAD_ENV, PARAM_NAMES, PARAMS, absent, check_env, env_value

CUDA = torch.cuda.is_available()

REPEATS = env_value("MLA_ASV_REPEATS", lambda: 20 if CUDA else 2)
ALLREDUCE_TABLE = env_value("MLA_ASV_ALLREDUCE_TABLE", lambda: None)
ENABLED = env_value("MLA_ASV_TPOT", lambda: False) or CUDA or bool(BAD_ENV)  # a bad value: enabled, so setup says so


def _measure(scenario: str, strategy: str, preset: str) -> dict:
    check_env()
    if lacking := [why for names in absent([preset], [scenario], [strategy]) for why in names.values()]:
        raise NotImplementedError(lacking[0])
    from harness.backends import make_backend
    from harness.strategies import REGISTRY

    from .benchmarks import harness_module

    Case = harness_module("harness.inputs.cases").Case
    presets, load_scenario = harness_module("harness.spec.presets"), harness_module("harness.spec.scenario").load_scenario
    get_preset, get_scale = presets.get_preset, presets.get_scale
    allreduce = harness_module("harness.tpot.allreduce")
    AllReduce, LatencyAllReduce, load_table = allreduce.AllReduce, allreduce.LatencyAllReduce, allreduce.load_table
    load_shape = harness_module("harness.tpot.config").load_shape
    tpot = harness_module("harness.tpot.tpot")
    build_context, time_strategy = tpot.build_context, tpot.time_strategy

    device = torch.device("cuda" if CUDA else "cpu")
    if reason := REGISTRY[strategy].unsupported_reason(device, make_backend("auto", device)):
        print(f"skipped {strategy}: {reason}", file=sys.stderr)
        raise NotImplementedError(reason)
    scale = get_scale("prod") if CUDA else get_scale("ci", slots=2048)
    case = Case(get_preset(preset), scale, load_scenario(scenario))
    allreduce = LatencyAllReduce(load_table(ALLREDUCE_TABLE), device) if (ALLREDUCE_TABLE and CUDA) else AllReduce()
    # the strategy's buffer planned with the pool (a base commit's build_context, from before `strategies`, plans none)
    planned = {"strategies": (strategy,)} if "strategies" in inspect.signature(build_context).parameters else {}
    ctx = build_context(case, load_shape(preset, shrink=not CUDA), device, "auto", 4, allreduce, **planned)
    r = time_strategy(strategy, ctx, REPEATS)
    share_row = getattr(tpot, "attn_share_row", None)  # None: a base commit's harness from before it (no share)
    ident = dict(preset=case.preset.name, scale=case.scale.name, scenario=case.scenario.name, backend="auto")
    return {"tpot_ms": r.tpot, "attn_share": share_row(ctx, r, ident) if share_row else None}  # null on CPU, with the reason


class _Tpot:
    params, param_names = PARAMS, PARAM_NAMES  # benchmarks.py's
    timeout = 900
    number = 1
    repeat = 1

    def setup(self, scenario, strategy, preset):  # asv skips (n/a) what setup refuses
        self.values = _measure(scenario, strategy, preset)


if ENABLED:

    class TpotMs(_Tpot):
        def track_tpot_ms(self, scenario, strategy, preset):
            return self.values["tpot_ms"]

        track_tpot_ms.unit = "ms"

    class AttnShare(_Tpot):
        def setup(self, scenario, strategy, preset):  # n/a raised here: asv records one from the benchmark itself as failed
            super().setup(scenario, strategy, preset)
            row = self.values["attn_share"]
            if row is None or row.value is None:
                raise NotImplementedError(row.detail["unsupported"] if row else "attn_share: this commit's harness tpot has no attn_share_row")

        def track_attn_share(self, scenario, strategy, preset):
            return self.values["attn_share"].value

        track_attn_share.unit = "ratio"
