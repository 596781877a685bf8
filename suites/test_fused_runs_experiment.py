"""ci/experiments/fused_runs (issue 28's production runs judged) on CPU, on the committed H100 run files of afa7656:
each target judged from the files, and its twins: every target made to hold, a failing verdict, a missing run, a file
of another case, of another commit, runs that name no commit, a malformed file, and a run over files already there
(none overwritten)."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from ci.experiments.fused_runs import fused_runs as exp
from suites.helpers import set_samples

RUNS = Path(__file__).resolve().parents[1] / "docs" / "evidence" / "fused" / "runs-afa7656-h100"


@pytest.fixture
def out(tmp_path):
    for f in RUNS.glob("run*.json"):
        shutil.copy(f, tmp_path)
    return tmp_path


def edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def fused_row(doc: dict, metric: str) -> dict:
    return next(r for r in doc["rows"] if r["strategy"] == exp.STRATEGY and r["metric"] == metric)


def scale_attention(factor: float):
    def change(doc):
        row = fused_row(doc, "attn_us")
        set_samples(row, [s * factor for s in row["samples"]])
    return change


def test_the_cases_are_the_targets_cases():
    assert set(exp.CASES) == {t.case for t in exp.TARGETS} | {t.base for t in exp.TARGETS if isinstance(t, exp.Gap)}
    assert all(exp.run_path(Path("o"), 1, c).name.startswith("run1-") for c in exp.CASES)


def test_each_target_judged_from_the_run_files(out, capsys):
    assert exp.main([str(out), "--judge-only", "--runs", "1"]) == 1  # GLM-5 b32 and DeepSeek-V3 b32's gap miss
    doc = json.loads((out / "summary.json").read_text())
    holds = {t["target"]: t["holds"] for t in doc["targets"]}
    assert list(holds.values()) == [False, True, True, False, True] and doc["verdicts_pass"]
    # the b32 figure, computed apart from the module: the upper quartile of attn_us over the attention's floor
    raw = json.loads((out / "run1-glm5-tp8-b32-l4096.json").read_text())
    q3 = statistics.quantiles(fused_row(raw, "attn_us")["samples"], n=4)[2]
    assert doc["targets"][0]["values"] == [pytest.approx(q3 / fused_row(raw, "floor_ratio")["detail"]["attn_floor_us"])]
    assert "| GLM-5 b32-l4096 attention <= 1.2x" in (out / "summary.md").read_text()
    assert doc["commit"].startswith("afa7656") and "H100" in doc["gpu"]


def test_every_target_held_passes_and_a_failing_verdict_does_not(out):
    edit(out / "run1-glm5-tp8-b32-l4096.json", scale_attention(0.9))  # 1.269x -> 1.142x
    edit(out / "run1-deepseek-v3-tp8-b32-l4096.json", scale_attention(0.8))  # within 0.1 of it
    assert exp.main([str(out), "--judge-only", "--runs", "1"]) == 0
    assert all(t["holds"] for t in json.loads((out / "summary.json").read_text())["targets"])

    def fail(doc):
        row = fused_row(doc, "verdict")
        row["value"] = row["detail"]["status"] = "fail"
    edit(out / "run1-glm5-tp8-b128-l2048.json", fail)
    assert exp.main([str(out), "--judge-only", "--runs", "1"]) == 1
    assert not json.loads((out / "summary.json").read_text())["verdicts_pass"]


@pytest.mark.parametrize("fault, message", [
    ("missing", "run2-glm5-tp8-b1-l4096.json: missing"),
    ("other_case", "run1-glm5-tp8-b32-l4096.json: case is deepseek-v3-tp8 b32-l4096 prod, expected glm5-tp8 b32-l4096 prod"),
    ("other_commit", "run1-glm5-tp8-b128-l2048.json: commit 'beef'"),
    ("no_commit", "run1-glm5-tp8-b32-l4096.json: no environment.git_commit"),
    ("malformed", "run1-deepseek-v3-tp8-b128-l2048.json: "),
    ("no_attention", "run1-glm5-tp8-b1-l4096.json: no fused_fp8 attn_us value"),
])
def test_a_run_that_cannot_be_judged_is_one_error_naming_it(out, capsys, fault, message):
    runs = "2" if fault == "missing" else "1"
    if fault == "other_case":
        shutil.copy(out / "run1-deepseek-v3-tp8-b32-l4096.json", out / "run1-glm5-tp8-b32-l4096.json")
    elif fault == "other_commit":
        edit(out / "run1-glm5-tp8-b128-l2048.json", lambda d: d["environment"].update(git_commit="beef"))
    elif fault == "no_commit":
        for f in out.glob("run1-*.json"):
            edit(f, lambda d: d["environment"].update(git_commit=None))
    elif fault == "malformed":
        (out / "run1-deepseek-v3-tp8-b128-l2048.json").write_text('{"schema": "mla-harness-results/5", "rows": [')
    elif fault == "no_attention":
        edit(out / "run1-glm5-tp8-b1-l4096.json", lambda d: d.update(rows=[r for r in d["rows"] if r["metric"] != "attn_us"]))
    assert exp.main([str(out), "--judge-only", "--runs", runs]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fused_runs: error: ") and message in err[0]
    assert not (out / "summary.json").exists()


def test_an_out_dir_that_is_a_file_is_one_error(tmp_path, capsys):
    (tmp_path / "out").write_text("not a folder")
    assert exp.main([str(tmp_path / "out"), "--runs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path / "out") in err[0] and (tmp_path / "out").read_text() == "not a folder"


def test_a_run_over_files_already_there_overwrites_none(out, capsys):
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert exp.main([str(out), "--runs", "1"]) == 2  # refused before any harness run starts
    assert "already there" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
