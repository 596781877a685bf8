"""Hostile edits of real results files that the gate must refuse (issue: adversarial audit of compare's inputs)."""

from __future__ import annotations

import json
from pathlib import Path

from harness import CHECKOUT
from harness.gate.compare import main_compare
from harness.results.metrics import METRICS
from suites.helpers import set_samples

RUNS = CHECKOUT / "docs" / "evidence" / "fused" / "runs-6258360-h100"  # two H100 runs of one case, as written


def _doc(n: int) -> dict:
    return json.loads((RUNS / f"run{n}-glm5-tp8-b32-l4096.json").read_text())


def _slower(doc: dict, factor: float) -> dict:
    row = next(r for r in doc["rows"] if r["strategy"] == "fused_fp8" and r["metric"] == "attn_us")
    set_samples(row, [v * factor for v in row["samples"]])
    return doc


def _relabelled_cpu(doc: dict, gating: str) -> dict:
    """environment.device edited to cpu, each row's gating made to agree with it ('flipped') or left out ('null')."""
    doc["environment"]["device"] = "cpu"
    for row in doc["rows"]:
        row["gating"] = METRICS[row["metric"]].gates("cpu") if gating == "flipped" else None
    return doc


def _compare(tmp_path: Path, base: dict, head: dict, capsys) -> tuple[int, str, str]:
    bp, hp = tmp_path / "base.json", tmp_path / "head.json"
    bp.write_text(json.dumps(base))
    hp.write_text(json.dumps(head))
    code = main_compare(bp, hp, "5%")
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_both_files_relabelled_to_cpu_with_their_gating_are_bad_input(tmp_path, capsys):
    """Two H100 files both relabelled `device: cpu`, every row's gating edited to agree (or left out): their CUDA timings
    were judged as a CPU file's (informational), so a 2x attention slowdown passed (exit 0). A run records
    environment.gpu on CUDA only. Twin: the files as written fail on the slowdown."""
    for gating in ("flipped", "null"):
        code, out, err = _compare(tmp_path, _relabelled_cpu(_doc(1), gating), _relabelled_cpu(_slower(_doc(2), 2.0), gating), capsys)
        assert code == 2, (gating, out)
        (line,) = err.strip().splitlines()
        assert line.startswith("error: ") and "base.json: environment.gpu" in line and "'cpu'" in line, line
    code, out, _ = _compare(tmp_path, _doc(1), _slower(_doc(2), 2.0), capsys)
    assert code == 1 and "fused_fp8/attn_us regressed" in out, out
