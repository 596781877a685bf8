"""A missing result never passes the gate, nor renders as a report: files that measured nothing (`tpot` of strategies
all unsupported here: a null tpot_ms and the control), files with no rows, and a head that lost a row its base measured
while still reporting the strategy. Real CPU `harness tpot --json` files, edited as the auditor edited them."""

from __future__ import annotations

import copy
import json

import pytest

from harness.cli import main
from harness.gate.compare import main_compare
from harness.results.document import Case, Row, write_results
from harness.tpot.report import main as tpot_report
from suites.helpers import another_run

SMALL = ("--device", "cpu", "--shrink", "--slots", "2048", "--scenario", "b1-l500", "--repeats", "1", "--layers", "2",
         "--weight-sets", "1", "--no-breakdown")


@pytest.fixture(scope="module")
def tpot_files(tmp_path_factory) -> tuple[dict, dict]:
    """(gather_cast and stock timed, stock_vectorized alone: unsupported on CPU, exit 1 with its file written)."""
    folder = tmp_path_factory.mktemp("tpot")
    assert main(["tpot", *SMALL, "--strategy", "gather_cast", "--strategy", "stock", "--json", str(folder / "t.json")]) == 0
    assert main(["tpot", *SMALL, "--strategy", "stock_vectorized", "--json", str(folder / "none.json")]) == 1
    return tuple(json.loads((folder / name).read_text()) for name in ("t.json", "none.json"))


def _write(path, doc: dict):
    path.write_text(json.dumps(doc))
    return path


def _compare(tmp_path, base: dict, head: dict, capsys) -> tuple[int, str, str]:
    code = main_compare(_write(tmp_path / "base.json", base), _write(tmp_path / "head.json", another_run(head)), "5%")
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_error_line(err: str, *words: str) -> None:
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and all(w in line for w in words), line


def _on_gpu(doc: dict) -> dict:
    """`doc` relabelled as a CUDA run's (its rows' recorded gating dropped, which would tell)."""
    doc = copy.deepcopy(doc)
    doc["environment"].update(device="cuda:0", gpu="NVIDIA H200")
    for row in doc["rows"]:
        row.pop("gating", None)
    return doc


# a file that measured nothing


@pytest.mark.parametrize("relabel", [lambda d: d, _on_gpu], ids=["cpu", "relabelled-cuda"])
def test_a_file_whose_rows_but_the_control_hold_no_value_is_bad_input(tpot_files, tmp_path, capsys, relabel):
    """Two `tpot --json` files of a strategy unsupported here (a null tpot_ms, detail.unsupported, and the control)
    compared as '2 rows (0 gating): 2 unchanged', exit 0: nothing measured passed the gate. Either side so is bad
    input naming the file. Twin: the measured file against another run of it passes."""
    timed, nothing = (relabel(d) for d in tpot_files)
    for base, head, named in ((nothing, nothing, "base.json"), (timed, nothing, "head.json"), (nothing, timed, "base.json")):
        code, out, err = _compare(tmp_path, base, head, capsys)
        assert code == 2 and out == "", out
        _one_error_line(err, f"{named}: rows: no row but the control holds a value: nothing was measured")
    code, out, err = _compare(tmp_path, timed, timed, capsys)
    assert err == "" and (code == 0 or "TOO FEW SAMPLES" in out), out  # on CUDA its one-sample timings gate: too few


def test_a_run_file_of_unsupported_strategies_still_compares(tmp_path, capsys):
    """A verdict `unsupported` is a value: a run whose every strategy is unsupported here (verdict rows, null timings
    saying why) compares as before (unchanged, exit 0), as the verdict rules expect."""
    case = dict(preset="glm5-tp8", scale="ci", scenario="b1-l500", backend="torch")
    record = Case(command="run", **case, slots=2048, layers=2, kernel="auto", workload="0" * 64, workload_v4=None)
    rows = [Row(**case, strategy="stock_vectorized", metric="verdict", value="unsupported",
                detail={"status": "unsupported", "reason": "cuda only"}),
            Row(**case, strategy="stock_vectorized", metric="cast_us", value=None, detail={"unsupported": "cuda only"})]
    paths = [tmp_path / f"{side}.json" for side in ("base", "head")]
    for path, host in zip(paths, ("a", "b")):
        write_results(path, rows, {"device": "cpu", "hostname": host}, "python -m harness run", record)
    assert main_compare(*paths, "5%") == 0
    assert "2 unchanged" in capsys.readouterr().out


# reports refuse what compare refuses


@pytest.mark.parametrize("edit, why", [(lambda d: d.update(rows=[]), "empty"),
                                       (lambda d: d.update(rows=[r for r in d["rows"] if r["metric"] == "control_copy_gbps"]),
                                        "no row but the control holds a value")], ids=["empty", "control-only"])
def test_reports_refuse_a_file_compare_calls_bad_input(tpot_files, tmp_path, capsys, edit, why):
    """`harness report` and `python -m harness.tpot.report` rendered a file with no rows (exit 0, a report of no
    results) that compare refuses: one error line naming the file, exit 2, nothing written. Twin: the file unedited
    renders with both."""
    good = _write(tmp_path / "good.json", tpot_files[0])
    doc = copy.deepcopy(tpot_files[0])
    edit(doc)
    bad = _write(tmp_path / "bad.json", doc)
    for render in (lambda p, out: main(["report", str(p), "--out", str(out)]), lambda p, out: tpot_report([str(p), "--out", str(out)])):
        assert render(bad, tmp_path / "out") == 2
        captured = capsys.readouterr()
        _one_error_line(captured.err, f"{bad}: rows: {why}")
        assert not (tmp_path / "out").exists()
    assert main_compare(good, bad, "5%") == 2
    _one_error_line(capsys.readouterr().err, f"{bad}: rows: {why}")
    assert main(["report", str(good), "--out", str(tmp_path / "r1")]) == 0
    assert tpot_report([str(good), "--out", str(tmp_path / "r2")]) == 0
