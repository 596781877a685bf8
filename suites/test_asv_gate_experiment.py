"""ci/experiments/asv_gate: the planted slowdown is real code in the planted commit, and the criteria."""

import ast
import shutil
from pathlib import Path

import pytest

from ci.experiments.asv_gate import asv_gate as exp
from harness.measure.control import copy_bytes_per_ms

ROOT = Path(__file__).resolve().parents[1]


def test_plant_adds_a_copy_after_every_replay(tmp_path):
    (tmp_path / "harness" / "execute").mkdir(parents=True)
    shutil.copy(ROOT / "harness" / "execute" / "decode.py", tmp_path / "harness" / "execute" / "decode.py")
    exp.plant(tmp_path, 0.10)
    text = (tmp_path / "harness" / "execute" / "decode.py").read_text()
    ast.parse(text)
    assert "        self.graph.replay()\n        _planted_copy(self)\n" in text
    assert "0.1 * step_ms * copy_bytes_per_ms(" in text
    assert callable(copy_bytes_per_ms)  # what the planted code imports exists


def test_plant_refuses_a_changed_replay(tmp_path):  # twin: nothing to plant into
    (tmp_path / "harness" / "execute").mkdir(parents=True)
    (tmp_path / "harness" / "execute" / "decode.py").write_text("class BucketGraph:\n    pass\n")
    with pytest.raises(SystemExit, match="cannot plant"):
        exp.plant(tmp_path, 0.10)


SCENARIOS = ["b1-l500", "b32-l4096"]
CAUGHT = [f"benchmarks.StepDeviceMs.time_step_device('{s}', 'gather_cast') (1.0ms -> 1.1ms, ratio 1.10)" for s in SCENARIOS]


@pytest.mark.parametrize("role, pair, ok", [
    ("aa", {"exit": 0, "slower": []}, True),
    ("aa", {"exit": 1, "slower": CAUGHT[:1]}, False),
    ("planted", {"exit": 1, "slower": CAUGHT}, True),
    ("planted", {"exit": 1, "slower": CAUGHT[:1]}, False),  # one scenario slipped through
    ("planted", {"exit": 0, "slower": []}, False),
])
def test_criteria(role, pair, ok):
    assert exp.met(role, pair, SCENARIOS) is ok
