"""ci/experiments/isolation's CPU-side logic: block order, and the idle-vs-loaded judgement (a planted shift must be caught)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import numpy as np
import pytest

from ci.experiments.isolation import isolation


def test_blocks_alternate_abba():
    assert isolation.abba(3) == ["idle", "loaded", "loaded", "idle", "idle", "loaded"]


def _blocks(shift: float, rounds: int = 3, n: int = 20) -> list[dict]:
    rng = np.random.default_rng(1)
    out = []
    for i, load in enumerate(isolation.abba(rounds)):
        scale = 1 + shift if load == "loaded" else 1.0
        out.append({"scenario": "b1-l4096", "strategy": "stock", "metric": "cast_us", "round": i // 2, "block": i,
                    "load": load, "samples": list(825 * scale * (1 + 0.01 * rng.standard_normal(n)))})
    return out


def test_quiet_neighbour_is_unchanged():
    [row] = isolation.summarize(_blocks(0.0), tolerance=0.10)
    assert row["status"] == "unchanged"
    assert row["samples"] == (60, 60) and len(row["round_ratios"]) == 3
    assert row["ratio"] == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("shift, status", [(0.25, "regressed"), (0.04, "slower")])
def test_negative_control_planted_neighbour_shift_is_caught(shift, status):
    [row] = isolation.summarize(_blocks(shift), tolerance=0.10)
    assert row["status"] == status
    assert all(r == pytest.approx(1 + shift, rel=0.02) for r in row["round_ratios"])
    assert f"| {status} |" in isolation.table([row], "t")


FAKE_METER = """
import json, sys
print(json.dumps({"ready": True, "pinned": None, "gpu": "fake"}), flush=True)
for i, _ in enumerate(sys.stdin):
    value = 100.0 * (1.3 if open(sys.argv[1]).read() == "run" else 1.0)
    print(json.dumps({"rows": [{"scenario": "b1-l4096", "strategy": "stock", "metric": "cast_us",
                                "samples": [value + k * 0.1 for k in range(8)]}]}), flush=True)
"""
FAKE_NEIGHBOUR = """
import json, sys
print(json.dumps({"ready": True, "pinned": None}), flush=True)
for line in sys.stdin:
    open(sys.argv[1], "w").write(line.strip())
    print(json.dumps({"running": True} if line.strip() == "run" else {"casts": 1, "seconds": 1.0, "gbps": 1.0}), flush=True)
"""


def test_orchestration_with_fake_processes_catches_a_planted_neighbour_effect(tmp_path, monkeypatch):
    """experiment() drives a measuring and a neighbour process; the fake meter reads 30% slower while the
    fake neighbour runs, so the loaded blocks must come out regressed."""
    state = tmp_path / "neighbour-state"
    state.write_text("")
    scripts = {"measure": FAKE_METER, "neighbour": FAKE_NEIGHBOUR}

    def spawn(role, gpu, args, pin):
        return subprocess.Popen([sys.executable, "-c", scripts[role], str(state)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, bufsize=1)

    monkeypatch.setattr(isolation, "_spawn", spawn)
    args = argparse.Namespace(gpus="0,1", rounds=2, tolerance=0.10)
    result = isolation.experiment(args, pin=False, log=lambda text: None)
    assert [b["load"] for b in result["blocks"]] == ["idle", "loaded", "loaded", "idle"]
    assert len(result["neighbour"]) == 2
    [row] = result["rows"]
    assert row["status"] == "regressed" and row["ratio"] == pytest.approx(1.3, rel=0.01)
