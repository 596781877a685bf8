"""harness.measure.timing, the one timing module: graph rounds for single kernels, the CUDA-event loops (queued or
each from an idle GPU) that every other timing in the harness calls."""

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


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's events and synchronize, recorded in one log; each event pair times 2.0 ms."""
    log = []

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            log.append("record")

        def synchronize(self):
            log.append("wait-event")

        def elapsed_time(self, end):
            return 2.0

    monkeypatch.setattr(timing.torch.cuda, "Event", Event)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda *a: log.append("sync"))
    return log


@pytest.mark.parametrize("queued", [True, False])
def test_event_loop_queues_or_waits_per_sample(fake_cuda, queued):
    """queued: the host records every sample back to back and waits once; otherwise each sample waits for its
    end event (the twin). `before` runs outside the timed region, warm-up included."""
    samples = timing.event_time_ms(lambda: fake_cuda.append("fn"), 3, warmup=1, queued=queued,
                                   before=lambda: fake_cuda.append("before"))
    assert samples == [2.0] * 3
    per_sample = ["before", "record", "fn", "record"] + ([] if queued else ["wait-event"])
    assert fake_cuda == ["before", "fn", "sync"] + per_sample * 3 + ["sync"]


def test_idle_start_times_each_call_from_an_idle_gpu(fake_cuda):
    host, whole = timing.idle_start_ms(lambda: fake_cuda.append("fn"), 2)
    assert whole == [2.0, 2.0] and len(host) == 2 and all(h >= 0 for h in host)
    assert fake_cuda == ["sync", "record", "fn", "record", "wait-event"] * 2


def test_no_other_module_keeps_its_own_event_loop():
    """One timing loop: CUDA events are made in harness/measure/timing.py only (the product and ci/)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    owners = {p.relative_to(root).as_posix() for folder in ("harness", "ci") for p in (root / folder).rglob("*.py")
              if "cuda.Event(" in p.read_text()}
    assert owners == {"harness/measure/timing.py"}
