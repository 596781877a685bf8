"""asv benchmarks: per-commit device-timed samples per strategy x scenario x preset, and peak memory.

One `setup_cache` (run once per commit, in one process) prepares each preset and scenario's case once
(`PreparedCase`: one pool build per case) and measures every strategy and metric from it
with the harness's own timing (`harness.measure.collect`: CUDA events / flashinfer.testing on CUDA,
host timers on CPU), returning JSON. The `time_` benchmarks hand those samples to asv through
a sample clock (`timer`): each timed call advances the clock by one measured sample, so asv
stores the real distribution (median, IQR, CI) and `asv continuous` / `asv compare` apply their
own statistical test instead of judging one number per commit. `PoolBuilds.track_pool_builds`
records how many pools setup_cache built per case (1 when the pool is shared).
On CUDA: every preset at production scale; on CPU: glm5-tp8 at ci scale (so CI can exercise them).
MLA_ASV_PRESETS / MLA_ASV_SCENARIOS / MLA_ASV_STRATEGIES (comma lists; default strategies: the registry's
`BENCHMARKED`) narrow the matrix; MLA_ASV_REPEATS sets samples (harness/envvars.py checks them:
a bad value fails setup_cache with one line naming the variable). A name this commit's harness lacks (the
lists are HEAD's, and asv runs them against older commits too) makes its benchmarks n/a here; one the
checkout's own harness refuses too (a typo) fails setup_cache.
"""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path


@functools.cache
def cuda() -> bool:
    """Whether this process benchmarks on CUDA. torch is imported here, on first use: asv starts a
    process per benchmark and parameter set (launch_method spawn), and one whose matrix and samples
    MLA_ASV_PRESETS, MLA_ASV_SCENARIOS and MLA_ASV_REPEATS set only reads setup_cache's JSON, so it never needs it."""
    import torch

    return torch.cuda.is_available()


try:
    from harness import envvars
    from harness.errors import HarnessError
except ImportError:  # a base commit from before harness/envvars.py (the perf gate benchmarks it too)
    envvars = None

LAYOUT_MOVE = {"harness.execute.prepared": "harness.prepared", "harness.inputs.cases": "harness.cases",  # new: before
               "harness.measure.collect": "harness.measure", "harness.spec.presets": "harness.presets",
               "harness.spec.scenario": "harness.scenario", "harness.tpot.allreduce": "harness.model.allreduce",
               "harness.tpot.config": "harness.model.config", "harness.tpot.tpot": "harness.model.tpot"}


def harness_module(name: str):
    """A harness module by its name in the pipeline layout, or by its earlier flat name (harness/<module>.py,
    harness/model/): asv runs these files against older commits too (the perf gate's base, `asv run` history)."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        if name not in LAYOUT_MOVE:
            raise
        return importlib.import_module(LAYOUT_MOVE[name])


BAD_ENV: list[str] = []  # a bad MLA_ASV_* value: setup_cache raises it (at import it would be a discovery traceback)
CHECKOUT = Path(__file__).resolve().parents[2]  # the checkout these files belong to: HEAD, whose lists asv runs everywhere
CPU_PRESET = "glm5-tp8"  # the one preset timed on CPU (harness run's default)


# How a variable is read where this commit's harness/envvars.py lacks it (a base commit's): else a comma list.
UNCHECKED_PARSE = {"MLA_ASV_REPEATS": int, "MLA_ASV_TPOT": lambda v: v == "1", "MLA_ASV_ALLREDUCE_TABLE": str}


def env_value(name: str, default):
    """The variable parsed by harness.envvars (its names unchecked: `absent` checks them in setup); unset (or bad,
    kept in BAD_ENV): default()."""
    if name not in os.environ:
        return default()
    if envvars is None or name not in envvars.BY_NAME:  # as a base commit's benchmarks read it (a variable it lacks)
        return UNCHECKED_PARSE.get(name, lambda v: v.split(","))(os.environ[name])
    try:
        return envvars.read(name, check_names=False)
    except HarnessError as exc:
        BAD_ENV.append(str(exc))
        return default()


def check_env() -> None:
    """Raise the first bad MLA_ASV_* value as one clear error (names are checked by `absent`, against the registries:
    importing them at discovery would import torch in every asv process)."""
    if BAD_ENV:
        raise ValueError(f"bad asv environment: {BAD_ENV[0]}")


def at_head(*args: str) -> subprocess.CompletedProcess:
    """`python ARGS` on the checkout's own harness (HEAD's), whichever commit's this process imports."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(CHECKOUT), os.environ.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, *args], cwd=CHECKOUT, env=env, capture_output=True, text=True)


def check_at_head() -> None:
    """Raise a MLA_ASV_* value the checkout's own harness refuses (a typo) as one clear error: `python -m
    harness.envvars` there, the check ci.asv_gate makes before asv runs."""
    proc = at_head("-m", "harness.envvars")
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or [f"python -m harness.envvars exited {proc.returncode}"])[-1]
        raise ValueError(f"bad asv environment: {last.removeprefix('error: ')}")


def absent(presets, scenarios, strategies) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """{name: why} for each of the presets, scenarios and strategies named that this commit's harness does not
    declare: a name newer than this commit, whose benchmarks are n/a here. A name the checkout's harness refuses
    too is a typo: `check_at_head` raises it."""
    from harness import strategies as registry

    declared = (harness_module("harness.spec.presets").PRESETS, harness_module("harness.spec.scenario").builtin_names(),
                registry.REGISTRY)
    out = tuple({n: f"{n} is not in this commit's harness" for n in names if n not in known}
                for names, known in zip((presets, scenarios, strategies), declared))
    if any(out):
        check_at_head()
    return out


def benchmarked() -> list[str]:
    """The default strategies: the registry's (every registered strategy but register(benchmark=False)
    ones), so a new strategy is timed here and by the perf gate without another edit. asv runs these
    files against older commits too (the perf gate's base): a harness from before the registry
    declared `benchmark` has every strategy timed."""
    from harness import strategies

    if hasattr(strategies, "BENCHMARKED"):
        return list(strategies.BENCHMARKED)
    return [n for n in strategies.ORDER if getattr(strategies.REGISTRY[n], "benchmark", True)]


def default_presets() -> list[str]:
    """On CUDA every preset the checkout's harness (HEAD) declares: asv pairs each commit's results by parameter index,
    so every commit gets HEAD's list (a preset it lacks is n/a there); on CPU CPU_PRESET alone (one pool per scenario)."""
    if not cuda():
        return [CPU_PRESET]
    proc = at_head("-c", "from harness.spec.presets import PRESETS; print(','.join(PRESETS))")
    if proc.returncode:
        raise RuntimeError(f"{CHECKOUT}: the harness there does not list its presets: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip().split(",")


SCENARIOS = list(env_value("MLA_ASV_SCENARIOS", lambda: ["b1-l4096", "b32-l4096"] if cuda() else ["b1-l500"]))
STRATEGIES = list(env_value("MLA_ASV_STRATEGIES", benchmarked))
PRESETS = list(env_value("MLA_ASV_PRESETS", default_presets))
REPEATS = env_value("MLA_ASV_REPEATS", lambda: 30 if cuda() else 3)
# Every per-strategy benchmark's axes (bench_tpot.py's too). The preset comes last: asv names a result
# `Class.method(scenario, strategy, preset)`, as the gate's readers expect the scenario first.
PARAMS, PARAM_NAMES = (SCENARIOS, STRATEGIES, PRESETS), ["scenario", "strategy", "preset"]
TO_SECONDS = {"ms": 1e-3, "us": 1e-6}


def _measure_all() -> str:
    """JSON {preset: {scenario: {"builds": n, "strategies": {strategy: {metric: [seconds...], "disturbed": {metric: why}}
    | {"skipped": why}}} | {"skipped": why}}}: a timing the clock guard found disturbed fails its benchmark (the gate
    cannot judge it)."""
    check_env()
    import torch

    PreparedCase = harness_module("harness.execute.prepared").PreparedCase
    Case = harness_module("harness.inputs.cases").Case
    presets, load_scenario = harness_module("harness.spec.presets"), harness_module("harness.spec.scenario").load_scenario
    get_preset, get_scale = presets.get_preset, presets.get_scale

    CUDA = cuda()
    device = torch.device("cuda" if CUDA else "cpu")
    no_preset, no_scenario, no_strategy = absent(PRESETS, SCENARIOS, STRATEGIES)
    out = {}
    for preset in PRESETS:
        out[preset] = {}
        for scenario in SCENARIOS:
            if why := no_preset.get(preset) or no_scenario.get(scenario):
                out[preset][scenario] = {"skipped": why}
                continue
            prep = PreparedCase(Case(get_preset(preset), get_scale("prod" if CUDA else "ci"), load_scenario(scenario)), device)
            out[preset][scenario] = _measure_case(prep, device, no_strategy)
            del prep
    return json.dumps(out)


def _measure_case(prep, device, no_strategy: dict[str, str]) -> dict:
    """{"builds": n, "strategies": ...} of one prepared case (`_measure_all`)."""
    import torch

    measure = harness_module("harness.measure.collect").measure
    CUDA = device.type == "cuda"
    runnable = [s for s in STRATEGIES if s not in no_strategy and not prep.unsupported_reason(s)]
    per = {s: {"skipped": no_strategy.get(s) or prep.unsupported_reason(s)} for s in STRATEGIES if s not in runnable}
    if runnable:
        prep.memory_plan(runnable).check(device)
        prep.build()
    for strategy in runnable:
        if CUDA:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        with prep.session(strategy) as session:
            session.run_all(())
            values = {"peak_bytes": torch.cuda.max_memory_allocated(device) - base} if CUDA else {}
            measured = measure(session, REPEATS)
        values.update({m: [v * TO_SECONDS[s.unit] for v in s.values] for m, s in measured.metrics.items() if s.unit in TO_SECONDS})
        guards = getattr(measured, "guards", {})  # a harness from before the clock guard records none
        values["disturbed"] = {m: g["disturbed"] for m, g in guards.items() if g.get("disturbed")}
        per[strategy] = values
        for metric, why in measured.skipped.items():
            print(f"{prep.case.name}/{strategy}: {metric} not measured: {why}", file=sys.stderr)
    return {"builds": type(prep).builds[prep.case.name], "strategies": per}


class _SampleClock:
    """An asv `timer` over measured samples: each timed call moves it on by the next sample (s)."""

    def __init__(self):
        self.now, self.samples, self.next, self.key = 0.0, (), 0, None

    def __call__(self) -> float:
        return self.now

    def load(self, key, samples) -> None:
        if key != self.key:  # asv re-runs setup before every sample: keep the position
            self.key, self.samples, self.next = key, tuple(samples), 0

    def tick(self) -> None:
        if self.next >= len(self.samples):
            raise RuntimeError(f"asv asked for sample {self.next + 1} of {len(self.samples)} measured")
        self.now += self.samples[self.next]
        self.next += 1


CLOCK = _SampleClock()


def _case(cache: str, scenario: str, preset: str) -> dict:
    """setup_cache's entry of one case; NotImplementedError (asv: n/a) when this commit's harness lacks its preset
    or scenario."""
    case = json.loads(cache)[preset][scenario]
    if "skipped" in case:
        raise NotImplementedError(case["skipped"])
    return case


class _Measured:
    """Shared by every benchmark: one setup_cache (one pool per case), one metric per class."""

    params, param_names = PARAMS, PARAM_NAMES
    timeout = 3600
    metric = ""

    def setup_cache(self):
        return _measure_all()

    setup_cache.timeout = 3600

    def _values(self, cache, scenario, strategy, preset):
        values = _case(cache, scenario, preset)["strategies"][strategy]
        if "skipped" in values:
            raise NotImplementedError(values["skipped"])
        if self.metric not in values:
            raise NotImplementedError(f"{self.metric} is not measured for {strategy} on this device")
        if why := values.get("disturbed", {}).get(self.metric):  # failed, not skipped: the gate cannot judge (exit 2)
            raise RuntimeError(f"{self.metric} of {strategy} in {preset} {scenario}: clock guard: {why}; no measurement to judge")
        return values[self.metric]


class _Timed(_Measured):
    number = 1
    rounds = 1  # the samples were taken once; a second round would hand asv the same samples again
    warmup_time = 0
    repeat = (REPEATS, REPEATS, 1e9)
    timer = CLOCK

    def setup(self, cache, scenario, strategy, preset):
        CLOCK.load((type(self).__name__, scenario, strategy, preset), self._values(cache, scenario, strategy, preset))


class CastUs(_Timed):
    metric = "cast_us"

    def time_cast(self, cache, scenario, strategy, preset):
        CLOCK.tick()


class AttnUs(_Timed):
    metric = "attn_us"

    def time_attn(self, cache, scenario, strategy, preset):
        CLOCK.tick()


class StepDeviceMs(_Timed):
    metric = "step_device_ms"

    def time_step_device(self, cache, scenario, strategy, preset):
        CLOCK.tick()


class StepHostMs(_Timed):
    metric = "step_host_ms"

    def time_step_host(self, cache, scenario, strategy, preset):
        CLOCK.tick()


class StepMs(_Timed):
    metric = "step_ms"

    def time_step(self, cache, scenario, strategy, preset):
        CLOCK.tick()


class PeakBytes(_Measured):
    metric = "peak_bytes"

    def setup(self, cache, scenario, strategy, preset):  # asv skips (n/a) what setup refuses
        self.value = self._values(cache, scenario, strategy, preset)

    def track_peak_bytes(self, cache, scenario, strategy, preset):
        return self.value

    track_peak_bytes.unit = "bytes"


class PoolBuilds:
    """How many pools setup_cache built for each case: 1 = every metric came from one pool."""

    params = (SCENARIOS, PRESETS)
    param_names = ["scenario", "preset"]
    timeout = 3600

    setup_cache = _Measured.setup_cache

    def setup(self, cache, scenario, preset):  # asv skips (n/a) what setup refuses
        self.builds = _case(cache, scenario, preset)["builds"]

    def track_pool_builds(self, cache, scenario, preset):
        return self.builds

    track_pool_builds.unit = "builds"
