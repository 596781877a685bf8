"""harness.measure.timing.device_time_ms: single-kernel samples come from separately captured rounds."""

import sys
import types

import pytest

from harness.measure import timing


@pytest.fixture
def fake_bench(monkeypatch):
    """flashinfer.testing.bench_gpu_time stand-in: each call returns its call number as samples."""
    calls = []

    def bench_gpu_time(fn, *, repeat_iters, use_cuda_graph, **kw):
        calls.append(dict(repeat_iters=repeat_iters, use_cuda_graph=use_cuda_graph, **kw))
        return [float(len(calls))] * repeat_iters

    testing = types.ModuleType("flashinfer.testing")
    testing.bench_gpu_time = bench_gpu_time
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.testing", testing)
    return calls


def test_graph_timings_span_separate_captures(fake_bench):
    samples = timing.device_time_ms(lambda: None, 10, use_cuda_graph=True)
    assert len(fake_bench) == timing.GRAPH_ROUNDS > 1
    assert len(samples) == 10 and set(samples) == set(map(float, range(1, timing.GRAPH_ROUNDS + 1)))
    assert all(c["cold_l2_cache"] for c in fake_bench)


def test_step_timings_are_one_call_of_events(fake_bench):
    samples = timing.device_time_ms(lambda: None, 7)
    assert len(fake_bench) == 1 and samples == [1.0] * 7
    assert not fake_bench[0]["use_cuda_graph"] and not fake_bench[0]["cold_l2_cache"]
