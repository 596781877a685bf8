"""ci/experiments/gate_noise: the gate-noise experiment judges pairs with the gate's own code, checks its two
criteria, and never overwrites an earlier run's files."""

import json

import numpy as np

from ci.experiments.gate_noise import gate_noise


def test_a_small_run_writes_the_table_and_counts_and_a_second_run_refuses(tmp_path, capsys):
    assert gate_noise.main([str(tmp_path), "--trials", "2"]) in (0, 1)
    table, counts = (tmp_path / "gate-noise.md").read_text(), json.loads((tmp_path / "gate-noise.json").read_text())
    assert len(counts["rows"]) == 4 * 2 * 3 * 4 and "| true shift | asv | rule | gate |" in table
    assert all(sum(row[j].values()) == 2 for row in counts["rows"] for j in ("asv", "rule", "gate"))
    before = [p.read_bytes() for p in sorted(tmp_path.iterdir())]
    assert gate_noise.main([str(tmp_path), "--trials", "2"]) == 2  # the earlier run's files are kept
    assert [p.read_bytes() for p in sorted(tmp_path.iterdir())] == before and "exist" in capsys.readouterr().err


def test_each_judge_tells_a_doubled_slowdown_from_none():
    """Control of the judges: at 30 samples and 1% spread, a 10% slowdown fails all three and no shift fails none."""
    rng = np.random.default_rng(0)
    base = gate_noise.draw(rng, "lognormal", 30, 0.01)
    assert set(gate_noise.judge(base, gate_noise.draw(rng, "lognormal", 30, 0.01, 1.10), 1.05).values()) == {"failed"}
    assert "failed" not in gate_noise.judge(base, gate_noise.draw(rng, "lognormal", 30, 0.01), 1.05).values()
