"""pytest-benchmark perf tests (GPU, glm5-tp8 prod, b1-l4096): one decode step and one layer's cast
per strategy, host-clocked around a synchronized call (plan, writes and launches included).

Targets are not asserted here; gate them by comparing saved runs:
  pytest suites/gpu/test_perf.py -m gpu --benchmark-enable --benchmark-save=base
  pytest suites/gpu/test_perf.py -m gpu --benchmark-enable --benchmark-compare=0001 --benchmark-compare-fail=median:10%
(without --benchmark-enable, as in `pytest suites/ -m gpu`, each runs once as a smoke test).
"""

import pytest
import torch

from harness.backends import make_backend
from harness.cases import load_case
from harness.decode import DecodeSession, make_step_data
from harness.pool import KVPool
from harness.strategies import REGISTRY

pytestmark = [pytest.mark.gpu, pytest.mark.prod]
STRATEGIES = ("stock", "stock_vectorized", "gather_cast", "shadow", "native_fp8")


@pytest.fixture(scope="module")
def prod_case(gpu_device):
    case = load_case("glm5-tp8.prod.b1-l4096")
    schedule = case.schedule()
    pool = KVPool(case.geometry, case.scenario.seed, gpu_device)
    return case, schedule, pool, make_step_data(case.preset, schedule, pool), make_backend("flashinfer", gpu_device)


def _session(prod_case, strategy):
    case, schedule, pool, data, backend = prod_case
    cls = REGISTRY[strategy]
    if reason := cls.unsupported_reason(pool.device, backend):
        pytest.skip(reason)
    return DecodeSession(cls(pool, backend, case.preset), schedule, data)


def _synced(fn):
    def call():
        fn()
        torch.cuda.synchronize()

    return call


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_decode_step(benchmark, prod_case, strategy):
    with _session(prod_case, strategy) as session:
        last = session.schedule.steps[-1]
        session.run_all(())
        benchmark.pedantic(_synced(lambda: session.step(last)), rounds=20, warmup_rounds=3)


@pytest.mark.parametrize("strategy", ("stock", "stock_vectorized", "gather_cast"))
def test_layer_cast(benchmark, prod_case, strategy):
    with _session(prod_case, strategy) as session:
        session.run_all(())
        benchmark.pedantic(_synced(lambda: session.strategy.prepare_kv(0)), rounds=50, warmup_rounds=5)
