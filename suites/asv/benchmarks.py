"""asv benchmarks: per-commit cast µs, decode step ms and peak memory per strategy x scenario.

Values are device-timed by the harness's own timing module (flashinfer.testing on CUDA, host
timers on CPU) and reported as `track_` values, so asv compares exactly what `harness run`
reports. On CUDA: glm5-tp8 at production scale; on CPU: ci scale (so CI can exercise them).
MLA_ASV_SCENARIOS / MLA_ASV_STRATEGIES (comma lists) narrow the matrix.
"""

import os
import sys

import torch

CUDA = torch.cuda.is_available()
SCENARIOS = os.environ.get("MLA_ASV_SCENARIOS", "b1-l4096,b32-l4096" if CUDA else "b1-l500").split(",")
STRATEGIES = os.environ.get("MLA_ASV_STRATEGIES", "stock,gather_cast,shadow,native_fp8").split(",")
REPEATS = int(os.environ.get("MLA_ASV_REPEATS", "30" if CUDA else "3"))


def _measure(scenario: str, strategy: str) -> dict:
    """{metric: value} of one strategy on one scenario, measured the way `harness run` does."""
    from harness.backends import make_backend
    from harness.cases import Case
    from harness.decode import DecodeSession, make_step_data
    from harness.pool import KVPool
    from harness.presets import get_preset, get_scale
    from harness.runner import _measure as measure_step
    from harness.scenario import load_scenario
    from harness.strategies import REGISTRY

    device = torch.device("cuda" if CUDA else "cpu")
    case = Case(get_preset("glm5-tp8"), get_scale("prod" if CUDA else "ci"), load_scenario(scenario))
    backend = make_backend("auto", device)
    cls = REGISTRY[strategy]
    if reason := cls.unsupported_reason(device, backend):
        print(f"skipped {strategy}: {reason}", file=sys.stderr)  # asv shows it with --show-stderr
        raise NotImplementedError(reason)
    schedule = case.schedule()
    pool = KVPool(case.geometry, case.scenario.seed, device)
    data = make_step_data(case.preset, schedule, pool)
    if CUDA:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    with DecodeSession(cls(pool, backend, case.preset), schedule, data) as session:
        session.run_all(())
        metrics, _ = measure_step(session, REPEATS)
    values = {k: s.median for k, s in metrics.items()}
    if CUDA:
        values["peak_bytes"] = torch.cuda.max_memory_allocated(device) - base
    return values


class _Measured:
    """One metric per class, so asv skips (n/a) what a strategy/device does not measure."""

    params = (SCENARIOS, STRATEGIES)
    param_names = ["scenario", "strategy"]
    timeout = 900
    number = 1
    repeat = 1
    metric = ""

    def setup(self, scenario, strategy):
        values = _measure(scenario, strategy)
        if self.metric not in values:
            raise NotImplementedError(f"{self.metric} is not measured for {strategy} on this device")
        self.value = values[self.metric]


class CastUs(_Measured):
    metric = "cast_us"

    def track_cast_us(self, scenario, strategy):
        return self.value

    track_cast_us.unit = "us"


class StepMs(_Measured):
    metric = "step_ms"

    def track_step_ms(self, scenario, strategy):
        return self.value

    track_step_ms.unit = "ms"


class PeakBytes(_Measured):
    metric = "peak_bytes"

    def track_peak_bytes(self, scenario, strategy):
        return self.value

    track_peak_bytes.unit = "bytes"
