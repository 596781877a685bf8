"""A results file holds its own command's rows: the metric table declares which commands write each metric
(harness/results/metrics.py), and a row of a metric the file's case.command never writes is bad input for every
reader (compare, report, the TPOT report), one line naming the row and the command."""

from __future__ import annotations

import json
from typing import get_args

import pytest

from harness.cli import main
from harness.errors import HarnessError
from harness.gate.compare import main_compare
from harness.results.document import Case, Row, document, write_results
from harness.results.metrics import METRICS
from harness.results.schema import Command, read_results
from harness.tpot.report import main as tpot_report
from suites.helpers import another_run

CASE = dict(preset="glm5-tp8", scale="ci", scenario="b1-l500", backend="torch")
ENV = {"device": "cpu", "hostname": "ci", "git_commit": "abc"}


def _record(command: str) -> Case:
    return Case(command=command, **CASE, slots=2048, layers=2, kernel="auto", workload="0" * 64, workload_v4=None)


def _timed(strategy: str, metric: str, value: float, **extra) -> Row:
    return Row(**CASE, strategy=strategy, metric=metric, value=value, samples=[value * 0.99, value, value * 1.01], **extra)


def _docs() -> dict[str, dict]:
    """A `run` and a `tpot` results document, each of its own command's rows, as the writer writes them."""
    run = [_timed("gather_cast", "cast_us", 10.0), Row(**CASE, strategy="gather_cast", metric="verdict", value="pass"),
           Row(**CASE, strategy="gather_cast", metric="extra_bytes", value=4096),
           _timed("control", "control_copy_gbps", 8.0)]
    tpot = [_timed("gather_cast", "tpot_ms", 400.0, detail={"layers": 2}), _timed("gather_cast", "attn_path_ms", 150.0),
            Row(**CASE, strategy="gather_cast", metric="step_kv_bytes", value=1 << 20),
            _timed("control", "control_copy_gbps", 8.5)]
    return {command: document(rows, ENV, f"python -m harness {command}", _record(command))
            for command, rows in (("run", run), ("tpot", tpot))}


def _write(path, doc: dict):
    path.write_text(json.dumps(doc))
    return path


def test_every_metric_is_written_by_a_command():
    for name, m in METRICS.items():
        assert m.commands and m.commands <= set(get_args(Command)), name
    assert {n for n, m in METRICS.items() if m.commands == {"run", "tpot"}} == {"control_copy_gbps"}


@pytest.mark.parametrize("command, other", [("tpot", "run"), ("run", "tpot")])
def test_a_file_holding_another_commands_rows_is_bad_input(tmp_path, capsys, command, other):
    """A `tpot` file's rows replaced by a `run` file's (its case record kept) compared as '10 missing (info), 29
    added', exit 0, and both reports rendered it. Every reader refuses it: one line naming rows[i] and the command,
    exit 2, nothing written. Twin: the file as written compares and renders."""
    docs = _docs()
    good = _write(tmp_path / "good.json", docs[command])
    bad = _write(tmp_path / "bad.json", {**docs[command], "rows": another_run(docs[other])["rows"]})
    readers = {"compare": lambda p, out: main_compare(good, p, "5%"),
               "report": lambda p, out: main(["report", str(p), "--out", str(out)])}
    if command == "tpot":
        readers["tpot report"] = lambda p, out: tpot_report([str(p), "--out", str(out)])
    for name, read in readers.items():
        assert read(bad, tmp_path / "out") == 2, name
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"error: {bad}") and "rows[0].metric" in line and f"never by the file's case.command {command!r}" in line, line
        assert not (tmp_path / "out").exists()
    twin = _write(tmp_path / "twin.json", another_run(docs[command]))
    for name, read in readers.items():
        assert read(twin, tmp_path / name) == 0, (name, capsys.readouterr().err)


def test_rows_written_without_a_case_record_are_their_metrics_commands(tmp_path):
    """document() without `case` recorded command "run" whatever the rows: a tpot's rows were refused by the writer's
    own check (a row of another command's results). The command is now the one every row's metric declares: the file
    reads back as that command's. Rows of both commands (or only ones either writes) are one line naming `rows`."""
    rows = {"tpot": [_timed("gather_cast", "tpot_ms", 400.0), _timed("control", "control_copy_gbps", 8.5)],
            "run": [_timed("gather_cast", "cast_us", 10.0), _timed("control", "control_copy_gbps", 8.0)]}
    for command, written in rows.items():
        write_results(tmp_path / f"{command}.json", written, ENV, f"python -m harness {command}")
        assert read_results(tmp_path / f"{command}.json").case.command == command
    with pytest.raises(HarnessError, match=r"^rows: their metrics \(tpot_ms, control_copy_gbps, cast_us\) belong to no one command"):
        document(rows["tpot"] + rows["run"][:1], ENV, "")
    with pytest.raises(HarnessError, match=r"^rows: their metrics \(control_copy_gbps\) belong to run and tpot: pass the case"):
        document(rows["tpot"][1:], ENV, "")
