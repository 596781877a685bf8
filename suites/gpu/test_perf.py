"""pytest-benchmark perf tests (GPU, glm5-tp8 prod, b1-l4096): one decode step (eager, and replayed
through its SGLang-style bucket graph) and one layer's cast per strategy, host-clocked around a
synchronized call. The case is prepared once (one pool build, shared with the case's other tests:
suites/plugins/pool_groups.py) for every test here.

Targets are not asserted here; gate them by comparing saved runs:
  pytest suites/gpu/test_perf.py -m gpu --benchmark-enable --benchmark-save=base
  pytest suites/gpu/test_perf.py -m gpu --benchmark-enable --benchmark-compare=0001 --benchmark-compare-fail=median:10%
(without --benchmark-enable, as in `pytest suites/ -m gpu`, each runs once as a smoke test).
"""

import pytest
import torch

from harness.inputs.cases import load_case
from harness.strategies import ORDER, REGISTRY
from harness.strategies.base import Strategy
from suites.plugins.pool_groups import SharedPreparedCase

CASTING = [name for name in ORDER if REGISTRY[name].cast_bytes.__func__ is not Strategy.cast_bytes.__func__]

pytestmark = [pytest.mark.gpu, pytest.mark.prod]
CASE = "glm5-tp8.prod.b1-l4096"


@pytest.fixture(scope="module")
def prep(gpu_device):
    return SharedPreparedCase(load_case(CASE), gpu_device, "flashinfer").build()


def _session(prep, strategy):
    if reason := prep.unsupported_reason(strategy):
        pytest.skip(reason)
    return prep.session(strategy)


def _synced(fn):
    def call():
        fn()
        torch.cuda.synchronize()

    return call


@pytest.mark.parametrize("strategy", ORDER)
def test_decode_step(benchmark, prep, strategy):
    with _session(prep, strategy) as session:
        last = session.schedule.steps[-1]
        session.run_all(())
        benchmark.pedantic(_synced(lambda: session.step(last)), rounds=20, warmup_rounds=3)


@pytest.mark.parametrize("strategy", ORDER)
def test_decode_step_bucket_replay(benchmark, prep, strategy):
    with _session(prep, strategy) as session:
        last = session.schedule.steps[-1]
        session.run_all(())
        graph = session.bucket_graph(last)

        def step():
            graph.load(last)
            graph.replay()

        benchmark.pedantic(_synced(step), rounds=20, warmup_rounds=3)


@pytest.mark.parametrize("strategy", CASTING)  # only strategies with a per-step cast kernel
def test_layer_cast(benchmark, prep, strategy):
    assert REGISTRY[strategy].cast_bytes(prep.geometry, prep.schedule.steps[-1]) > 0
    with _session(prep, strategy) as session:
        session.run_all(())
        benchmark.pedantic(_synced(lambda: session.strategy.prepare_kv(0)), rounds=50, warmup_rounds=5)
