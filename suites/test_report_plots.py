"""The reports' plots: names from the files are drawn as text (never parsed as mathtext), and the TPOT report writes
tpot.md and tpot.png together, each in full before either is moved in (a failed or interrupted plot leaves both)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.results.document import Case, Row, document
from harness.tpot.report import main as tpot_report

pytest.importorskip("matplotlib")

CASE = dict(preset="glm5-tp8", scale="ci", scenario="b1-l500", backend="torch")
ENV = {"device": "cpu", "hostname": "ci", "git_commit": "abc"}
MATHTEXT = "x$\\undefinedcmd{$"  # a strategy name the schema accepts; as mathtext, matplotlib raises on it


def _write(path: Path, command: str, strategy: str) -> Path:
    """A results file of `command` with `strategy` (and stock) measured."""
    record = Case(command=command, **CASE, slots=2048, layers=2, kernel="auto", workload="0" * 64, workload_v4=None)
    rows = []
    for name in (strategy, "stock"):
        if command == "run":
            rows += [Row(**CASE, strategy=name, metric="verdict", value="pass"),
                     Row(**CASE, strategy=name, metric="step_ms", value=2.0, samples=[2.0]),
                     Row(**CASE, strategy=name, metric="cast_us", value=10.0, samples=[10.0])]
        else:
            rows += [Row(**CASE, strategy=name, metric="tpot_ms", value=400.0, samples=[400.0], detail={"layers": 2}),
                     Row(**CASE, strategy=name, metric="attn_path_ms", value=150.0, samples=[150.0])]
    path.write_text(json.dumps(document(rows, ENV, f"python -m harness {command}", record)))
    return path


def test_a_strategy_named_like_mathtext_is_drawn_as_text(tmp_path, capsys):
    """A strategy named `x$\\undefinedcmd{$` crashed both reports with a mathtext traceback (exit 1). Now it renders:
    exit 0, every file written, the name as written. Twin: a plain name renders as before."""
    for strategy in (MATHTEXT, "gather_cast"):
        out = tmp_path / strategy.replace("\\", "_")
        assert main(["report", str(_write(tmp_path / "run.json", "run", strategy)), "--out", str(out / "run")]) == 0
        assert {"report.md", "step_ms.png", "cast_us.png"} <= {p.name for p in (out / "run").iterdir()}
        assert f"| {strategy} |" in (out / "run" / "report.md").read_text()
        assert tpot_report([str(_write(tmp_path / "tpot.json", "tpot", strategy)), "--out", str(out / "tpot")]) == 0
        assert {p.name for p in (out / "tpot").iterdir()} == {"tpot.md", "tpot.png"}
        assert f"| {strategy} |" in (out / "tpot" / "tpot.md").read_text()
    capsys.readouterr()


@pytest.mark.parametrize("error, code", [(KeyboardInterrupt, 130), (RuntimeError, None)], ids=["ctrl-c", "error"])
def test_a_plot_that_fails_leaves_the_tpot_reports_files_as_they_were(tmp_path, monkeypatch, capsys, error, code):
    """tpot.md was written and only then the plot rendered: a failure or Ctrl-C while plotting left a new tpot.md
    beside the old tpot.png. Now both are written together once the plot is made: --force over an earlier report whose
    plot fails leaves both files byte for byte. Twin: the plot made, both are replaced."""
    from matplotlib.figure import Figure

    results = _write(tmp_path / "tpot.json", "tpot", "gather_cast")
    out = tmp_path / "out"
    out.mkdir()
    old = {"tpot.md": b"# an earlier report\n", "tpot.png": b"\x89PNG an earlier plot"}
    for name, data in old.items():
        (out / name).write_bytes(data)

    def fail(*args, **kwargs):
        raise error("plotting failed")

    with monkeypatch.context() as patch:
        patch.setattr(Figure, "savefig", fail)
        if code is None:
            with pytest.raises(error):
                tpot_report([str(results), "--out", str(out), "--force"])
        else:
            assert tpot_report([str(results), "--out", str(out), "--force"]) == code
    assert {p.name: p.read_bytes() for p in out.iterdir()} == old
    assert tpot_report([str(results), "--out", str(out), "--force"]) == 0
    assert all((out / name).read_bytes() != data for name, data in old.items())
    capsys.readouterr()
