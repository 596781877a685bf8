"""Leaving a decode session hands the strategy's cached memory back to the driver, so that the next
strategy's timing allocates from the same state whatever ran before it."""

import pytest
import torch

from harness.cases import load_case
from harness.prepared import PreparedCase

pytestmark = pytest.mark.gpu

CASE = "glm5-tp8.ci.b1-l500"
EMPTY_CACHE = torch.cuda.empty_cache  # the real one, whatever a planted fault does to the attribute


def _cache_left_by(prep: PreparedCase, strategy: str) -> tuple[int, int]:
    """(bytes torch still reserves after a `strategy` session beyond what it reserved before, the
    session's peak growth)."""
    torch.cuda.synchronize()
    EMPTY_CACHE()  # what earlier tests in this process left cached would serve the session's buffers
    before = torch.cuda.memory_reserved()
    with prep.session(strategy) as s:
        s.step(s.schedule.steps[-1])
        peak = torch.cuda.memory_reserved() - before
    return torch.cuda.memory_reserved() - before, peak


def test_session_exit_returns_the_strategy_buffers(gpu_device, monkeypatch):
    """shadow's BF16 copy of the pool is gone from torch's cache once its session ends. Planted fault:
    with empty_cache disarmed the same session leaves it cached, and the check sees it."""
    prep = PreparedCase(load_case(CASE), gpu_device, "torch").build()
    shadow_bytes = prep.extra_bytes("shadow")
    assert shadow_bytes > 16 << 20
    _cache_left_by(prep, "shadow")  # the first step also makes what the case keeps (backend workspace)
    left, peak = _cache_left_by(prep, "shadow")
    assert peak >= shadow_bytes and left < 4 << 20, (left, peak)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    left, _ = _cache_left_by(prep, "shadow")
    assert left >= shadow_bytes, "the planted fault (no empty_cache) went unseen"
