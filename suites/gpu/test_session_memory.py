"""Leaving a decode session hands the strategy's cached memory back to the driver, so that the next
strategy's timing allocates from the same state whatever ran before it."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

# In a fresh process: the allocator state of a test worker (other tests' live tensors keep segments
# that the strategy's buffers would be carved from) would hide what a session leaves cached.
CHILD = """
import json, sys, torch
from harness.inputs.cases import load_case
from harness.execute.prepared import PreparedCase

prep = PreparedCase(load_case("glm5-tp8.ci.b1-l500"), torch.device("cuda"), "torch").build()

def cache_left_by(strategy):
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    with prep.session(strategy) as s:
        s.step(s.schedule.steps[-1])
        peak = torch.cuda.memory_reserved() - before
    return torch.cuda.memory_reserved() - before, peak

cache_left_by("shadow")  # the first step also makes what the case keeps (backend workspace)
left, peak = cache_left_by("shadow")
if sys.argv[1] == "disarmed":  # planted fault: empty_cache does nothing
    torch.cuda.empty_cache = lambda: None
    left, peak = cache_left_by("shadow")
print(json.dumps(dict(left=left, peak=peak, shadow=prep.extra_bytes("shadow"))))
"""


def _cache_left(mode: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_session_exit_returns_the_strategy_buffers(gpu_device):
    """shadow's BF16 copy of the pool is gone from torch's cache once its session ends. Planted fault:
    with empty_cache disarmed the same session leaves it cached, and the check sees it."""
    armed = _cache_left("armed")
    assert armed["shadow"] > 16 << 20 and armed["peak"] >= armed["shadow"] and armed["left"] < 4 << 20, armed
    disarmed = _cache_left("disarmed")
    assert disarmed["left"] >= disarmed["shadow"], f"the planted fault (no empty_cache) went unseen: {disarmed}"
