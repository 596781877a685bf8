"""ci/shard_plan.py: the measured sharding model, and the choice it makes for small and large suites."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci import shard_plan

REPO = Path(__file__).resolve().parents[1]
JUNIT = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
<testcase classname="suites.gpu.test_a" name="test_x[1]" time="14.0"/>
<testcase classname="suites.gpu.test_a" name="test_y" time="1.0"/>
<testcase classname="suites.gpu.test_b" name="test_z" time="0.4"><skipped message="no"/></testcase>
</testsuite></testsuites>"""


def test_fit_from_timed_runs(tmp_path):
    (tmp_path / "j.xml").write_text(JUNIT)
    durations = shard_plan.junit_durations(tmp_path / "j.xml")
    assert durations == {"suites/gpu/test_a.py::test_x[1]": 14.0, "suites/gpu/test_a.py::test_y": 1.0}
    model = shard_plan.fit([(0, 20.0, durations), (1, 50.0, {}), (2, 40.0, {})])
    assert model["overhead_s"] == {"0": 5.0, "1": 35.0, "2": 32.5}
    with pytest.raises(ValueError, match="WORKERS 0"):
        shard_plan.fit([(2, 40.0, durations)])
    with pytest.raises(ValueError, match="all skipped"):
        shard_plan.fit([(0, 20.0, {})])


def test_committed_model_keeps_todays_suite_unsharded():
    """Issue 13's measurement: 15.4 s of tests run faster without xdist than with 1 or 2 workers."""
    model = json.loads((REPO / "ci" / "shard_model.json").read_text())
    assert shard_plan.predict(model, 15.4, 0) == pytest.approx(20.6)
    assert shard_plan.predict(model, 15.4, 2) == pytest.approx(38.0)
    assert shard_plan.choose(model, 15.4, gpus=8)[0] == 0


def test_negative_control_a_large_suite_is_sharded():
    model = json.loads((REPO / "ci" / "shard_model.json").read_text())
    assert shard_plan.choose(model, 300.0, gpus=2)[0] == 2
    workers, why = shard_plan.choose(model, 300.0, gpus=8)
    assert workers == 8 and "-n 8 predicted" in why  # beyond 2 workers: the largest measured xdist overhead
    assert shard_plan.choose(model, 60.0, gpus=2)[0] == 0  # below the 2-GPU threshold (~78 s of tests)


def test_suite_work_counts_unseen_tests_as_typical():
    model = {"durations": {"a": 1.0, "b": 3.0, "c": 10.0}, "work_s": 14.0, "tests": 3}
    assert shard_plan.suite_work(model, ["a", "c", "new"]) == 14.0  # new counts as the median, 3.0
    assert shard_plan.suite_work({"durations": {}, "work_s": 15.0, "tests": 30}, ["x"] * 4) == 2.0
