"""A results file's case is the workload, not only its names: `case.workload` fingerprints the preset's and
the scenario's definitions (and tpot's model and flags), so a scenario file named like a built-in, or a
shrunk model, is another case for `compare` (exit 2 naming case.workload), and a scenario's description (prose) is
no part of it; files older than version 4 are upgraded with workload null, version-4 files (whose digest took in
the description) with it in workload_v4. Also: a `schema` field that is not a string is one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.results.schema import SCHEMA, SCHEMA_V3, SCHEMA_V4, Row, read_results, sample_iqr
from suites.helpers import another_run, nudged

SMALL = ("--device", "cpu", "--slots", "2048", "--repeats", "1")


def _run(tmp_path: Path, name: str, *args: str) -> Path:
    out = tmp_path / name
    assert main(["run", *SMALL, "--strategy", "gather_cast", *args, "--json", str(out)]) == 0
    return out


def _error_line(capsys) -> str:
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


def test_a_scenario_file_named_like_a_builtin_is_another_case(tmp_path, capsys):
    builtin = _run(tmp_path, "base.json", "--scenario", "b1-l500")
    again = _run(tmp_path, "again.json", "--scenario", "b1-l500")
    scenario = tmp_path / "b1-l500.toml"
    scenario.write_text('name = "b1-l500"\ndescription = "not the built-in"\nseed = 99\nsteps = 1\n'
                        'kv_lens = [64, 64]\nlayout = "contiguous"\n')
    impostor = _run(tmp_path, "head.json", "--scenario-file", str(scenario))
    cases = [json.loads(p.read_text())["case"] for p in (builtin, again, impostor)]
    assert cases[0] == cases[1] and {k: v for k, v in cases[2].items() if k != "workload"} == \
        {k: v for k, v in cases[0].items() if k != "workload"}  # the names alone agree
    capsys.readouterr()
    assert main(["compare", str(builtin), str(impostor)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"error: {impostor}: case.workload") and "only results of the same case compare" in line
    assert main(["compare", str(builtin), str(again)]) == 0  # twin: the same workload twice


def test_a_scenario_description_is_prose_not_another_case(tmp_path, capsys):
    """A scenario file whose description alone changed is the same case (before: the digest took in the description,
    and compare refused the pair, exit 2 naming case.workload); its seed changed, it is another."""
    scenario = tmp_path / "mine.toml"
    runs = []
    for i, (description, seed) in enumerate([("first words", 5), ("other words", 5), ("other words", 6)]):
        scenario.write_text(f'name = "mine"\ndescription = "{description}"\nseed = {seed}\nsteps = 1\nkv_lens = [40, 7]\n')
        runs.append(_run(tmp_path, f"r{i}.json", "--scenario-file", str(scenario)))
    cases = [json.loads(p.read_text())["case"] for p in runs]
    assert cases[0] == cases[1] != cases[2]
    assert main(["compare", str(runs[0]), str(runs[1])]) == 0
    capsys.readouterr()
    assert main(["compare", str(runs[1]), str(runs[2])]) == 2
    assert _error_line(capsys).startswith(f"error: {runs[2]}: case.workload")


def test_a_version_4_file_compares_by_its_own_digest(tmp_path, capsys):
    """A version-4 file's digest (the description in it) moves to case.workload_v4: two version-4 files compare when
    their digests are equal and are two cases when not; beside a newer file one is refused, saying to re-run it."""
    run = _run(tmp_path, "r.json", "--scenario", "b1-l500")
    doc = json.loads(run.read_text())
    olds = []
    for day, digest in ((1, "a" * 64), (2, "a" * 64), (3, "c" * 64)):  # another day: another run, not a copy
        case = {k: v for k, v in doc["case"].items() if k != "workload_v4"} | {"workload": digest}
        olds.append(tmp_path / f"v4-{day}.json")
        olds[-1].write_text(json.dumps({**nudged(doc, day), "schema": SCHEMA_V4, "case": case, "created": f"2026-01-0{day}T00:00:00+00:00"}))
    assert (read_results(olds[0]).case.workload, read_results(olds[0]).case.workload_v4) == (None, "a" * 64)
    assert main(["compare", str(olds[0]), str(olds[1])]) == 0
    capsys.readouterr()
    assert main(["compare", str(olds[0]), str(olds[2])]) == 2
    assert _error_line(capsys).startswith(f"error: {olds[2]}: case.workload_v4")
    assert main(["compare", str(olds[0]), str(run)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"error: {run}: case.workload") and "older than schema version 5: re-run it" in line


def test_a_shrunk_tpot_model_is_another_case(tmp_path, capsys):
    args = ["tpot", *SMALL, "--scenario", "b1-l500", "--strategy", "gather_cast", "--layers", "2", "--no-breakdown"]
    full, shrunk = tmp_path / "full.json", tmp_path / "shrunk.json"
    assert main([*args, "--json", str(full)]) == 0
    assert main([*args, "--shrink", "--json", str(shrunk)]) == 0
    capsys.readouterr()
    assert main(["compare", str(full), str(shrunk)]) == 2
    assert _error_line(capsys).startswith(f"error: {shrunk}: case.workload")


def test_a_version_3_file_is_upgraded_without_a_workload(tmp_path, capsys):
    runs = [_run(tmp_path, f"r{i}.json", "--scenario", "b1-l500") for i in range(2)]
    olds = []
    for path in runs:
        doc = json.loads(path.read_text())
        assert doc["schema"] == SCHEMA and len(doc["case"]["workload"]) == 64
        olds.append(path.with_name(f"v3-{path.name}"))
        olds[-1].write_text(json.dumps({**doc, "schema": SCHEMA_V3,
                                        "case": {k: v for k, v in doc["case"].items() if k not in ("workload", "workload_v4")}}))
    assert read_results(olds[0]).case.workload is None
    assert main(["compare", str(olds[0]), str(olds[1])]) == 0  # two old files: compared by their names, as before
    capsys.readouterr()
    assert main(["compare", str(olds[0]), str(runs[1])]) == 2  # unrecorded is not the same workload
    assert _error_line(capsys).startswith(f"error: {runs[1]}: case.workload")


@pytest.mark.parametrize("schema", [{}, [], 3, None])
def test_a_schema_that_is_not_a_version_string_is_one_error_line(tmp_path, capsys, schema):
    good = _run(tmp_path, "r.json", "--scenario", "b1-l500")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(good.read_text()), "schema": schema}))
    capsys.readouterr()
    assert main(["compare", str(good), str(bad)]) == 2
    assert _error_line(capsys).startswith(f"error: {bad}: schema")


def _edited(tmp_path: Path, source: Path, edit) -> tuple[Path, int]:
    """A copy of `source` with one row edited by `edit(row) -> bool` (True for the row it changed); its index."""
    doc = another_run(json.loads(source.read_text()))  # the copy is not the same run
    index = next(i for i, row in enumerate(doc["rows"]) if edit(row))
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(doc))
    return out, index


def _verdict_says_fail(row) -> bool:
    if row["metric"] == "verdict" and row["value"] == "pass":
        row["detail"]["status"] = "fail"
        return True
    return False


def _more_mismatches_than_values(row) -> bool:
    stats = (row.get("detail") or {}).get("stats") or {}
    if row["metric"] == "verdict" and stats.get("total"):
        stats["mismatches"] = stats["total"] + 1
        return True
    return False


def _samples_not_the_value(row) -> bool:
    if row["metric"] == "cast_us" and row["samples"]:
        row["samples"] = [s / 2 for s in row["samples"]]  # the value still says what the run measured
        return True
    return False


def _iqr_not_the_samples(row) -> bool:
    if row["metric"] == "cast_us" and row["iqr"]:
        row["iqr"] /= 4  # whiskers a quarter as wide as the samples' spread: `report` draws them
        return True
    return False


@pytest.mark.parametrize("edit, field, words", [(_verdict_says_fail, "detail.status", "contradicts the verdict 'pass'"),
                                               (_more_mismatches_than_values, "detail.stats.mismatches", "more than total"),
                                               (_samples_not_the_value, "value", "is not the median of its samples"),
                                               (_iqr_not_the_samples, "iqr", "is not the interquartile range of its 4 samples")])
def test_a_row_that_contradicts_itself_is_bad_input(tmp_path, capsys, edit, field, words):
    good = _run(tmp_path, "r.json", "--scenario", "b1-l500", "--repeats", "4")
    bad, index = _edited(tmp_path, good, edit)
    capsys.readouterr()
    assert main(["compare", str(good), str(bad)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"error: {bad}: ") and f"rows[{index}].{field}" in line and words in line, line
    twin, _ = _edited(tmp_path, good, lambda row: row["metric"] == "verdict")  # twin: the same copy, unedited
    assert main(["compare", str(good), str(twin)]) == 0


def test_a_rows_iqr_is_its_samples_spread():
    """The iqr `report` draws must be the samples' (sample_iqr); under 4 samples none is told, and the 0 that `tpot`
    recorded there before is still read. Twins: a spread no sample backs, and one told of 3 samples, are refused."""
    case = dict(preset="glm5-tp8", scale="ci", scenario="b1-l500", strategy="stock", backend="torch", metric="cast_us")
    four = [1.0, 2.0, 3.0, 4.0]
    assert Row(**case, value=2.5, iqr=sample_iqr(four), samples=four).iqr == 2.5
    for iqr in (None, 0.0):
        Row(**case, value=2.0, iqr=iqr, samples=[1.0, 2.0, 3.0])
    for iqr, samples, value in ((0.6, four, 2.5), (None, four, 2.5), (0.5, [1.0, 2.0, 3.0], 2.0)):
        with pytest.raises(ValueError, match=r"^iqr: .* is not the interquartile range of its \d samples"):
            Row(**case, value=value, iqr=iqr, samples=samples)
