"""ci/experiments/gate: its kept pair documents are results files `harness compare` reads, and its criteria fail
an A/A pair that regressed or a planted slowdown that was not caught (the twins)."""

import pytest

from ci.experiments.gate import gate as exp
from harness.gate.compare import main_compare


def test_kept_pair_documents_are_results_files_compare_reads(tmp_path, capsys):
    assert exp.main([str(tmp_path), "--device", "cpu", "--scale", "ci", "--scenario", "b1-l500",
                     "--pairs", "1", "--repeats", "3", "--keep-docs"]) == 0
    a, b = (tmp_path / "docs" / f"b1-l500-aa0-{side}.json" for side in "ab")
    assert main_compare(a, b, "5%") == 0  # A/A on CPU: no timed metric gates, nothing is missing
    assert "every criterion holds" in (tmp_path / "gate-experiment.md").read_text()


def _planted(status: str) -> dict:
    return {"fraction": 0.10, "status": status, "metric": "step_device_ms", "ratio": 1.1, "mde": 0.02}


@pytest.mark.parametrize("aa, planted, failed", [
    ({"regressed": [], "exit": 0}, _planted("regressed"), 0),
    ({"regressed": ["step_device_ms"], "exit": 1}, _planted("regressed"), 1),  # an A/A false alarm
    ({"regressed": [], "exit": 0}, _planted("inconclusive"), 1),  # a 10% slowdown slept through
])
def test_criteria(aa, planted, failed):
    assert len(exp.criteria([{"scenario": "b1-l500", "aa": [aa], "planted": [planted]}])) == failed
