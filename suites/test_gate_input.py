"""Issue 25's gate repros on real CPU results (`harness run --scenario b1-l500 --json`, `tpot --json`):
every hostile edit of a real file gets its documented exit code and one line naming the field.
Each edit sits beside its untouched twin (the same rows under another `created` stamp exit 0; the
very same file twice is bad input)."""

from __future__ import annotations

import copy
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from harness.cli import main
from harness.errors import HarnessError
from harness.gate.compare import compare_results, load_results, main_compare
from harness.results.schema import SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, read_results
from suites.hang_guard import HANG_GUARD_S
from suites.helpers import another_run, nudged, set_samples

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run_json(tmp_path_factory) -> dict:
    """One real CPU run's results document."""
    path = tmp_path_factory.mktemp("gate") / "a.json"
    assert main(["run", "--scenario", "b1-l500", "--device", "cpu", "--json", str(path)]) == 0
    return json.loads(path.read_text())


@pytest.fixture
def a(run_json):
    return copy.deepcopy(run_json)


def _compare(tmp_path, base: dict, head: dict, capsys, tolerance: str = "5%") -> tuple[int, str, str]:
    bp, hp = tmp_path / "base.json", tmp_path / "head.json"
    bp.write_text(json.dumps(base))
    hp.write_text(json.dumps(nudged(head)))  # a head run apart from the base (the edits under test aside)
    code = main_compare(bp, hp, tolerance)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_error_line(err: str, *words: str) -> None:
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and all(w in line for w in words), line


def _rows(doc: dict, metric: str, strategy: str | None = None) -> list[dict]:
    return [r for r in doc["rows"] if r["metric"] == metric and strategy in (None, r["strategy"])]


def _set_verdict(doc: dict, strategy: str, value: str) -> None:
    """A verdict edited as a writer would record it: its detail's status says the same."""
    row = _rows(doc, "verdict", strategy)[0]
    row["value"], row["detail"]["status"] = value, value


def test_the_real_file_carries_its_case_and_compares_clean(a, tmp_path, capsys):
    assert a["schema"] == "mla-harness-results/5"
    assert a["case"] == {"command": "run", "preset": "glm5-tp8", "scenario": "b1-l500", "scale": "ci", "slots": 16384, "layers": 2,
                         "backend": "torch", "kernel": "auto", "workload": a["case"]["workload"], "workload_v4": None}
    assert len(a["case"]["workload"]) == 64  # its sha256 (suites/test_results_case.py)
    code, out, _ = _compare(tmp_path, a, _rerun(a), capsys)
    assert code == 0 and f"{len(a['rows'])} rows" in out and "unchanged" in out
    for word in ("slower", "regressed", "missing", "failing"):  # identical files: no word of change (repro 10)
        assert word not in out


def _rerun(doc: dict) -> dict:
    """`doc` as another run that measured the same rows (another `created` stamp, one sample one ulp off)."""
    return another_run(doc)


def test_one_run_given_twice_is_bad_input(a, tmp_path, capsys):
    """Repro r13: `compare X X` (or X and a copy of it) passed silently; a CI script that names one file twice."""
    path = _write(tmp_path / "a.json", a)
    copy_path = tmp_path / "copy.json"
    copy_path.write_bytes(path.read_bytes())
    for head in (path, copy_path):
        assert main_compare(path, head, "5%") == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        _one_error_line(captured.err, f"{head}: the same run as the base {path}")
    assert main_compare(path, _write(tmp_path / "rerun.json", _rerun(a)), "5%") == 0  # twin: another run


# 1. missing results fail


def test_empty_head_is_bad_input(a, tmp_path, capsys):
    head = {**a, "rows": []}
    code, out, err = _compare(tmp_path, a, head, capsys)
    assert code == 2 and out == ""
    _one_error_line(err, "head.json: rows: empty")


def test_head_without_its_verdict_rows_fails_naming_them(a, tmp_path, capsys):
    head = {**a, "rows": [r for r in a["rows"] if r["metric"] != "verdict"]}
    code, out, _ = _compare(tmp_path, a, head, capsys)
    assert code == 1 and "missing" in out and "REGRESSION" in out
    assert "stock/verdict missing" in out and "gather_cast/verdict missing" in out


def test_head_with_a_null_extra_bytes_fails(a, tmp_path, capsys):
    head = copy.deepcopy(a)
    for row in _rows(head, "extra_bytes"):
        row["value"] = None
    code, out, _ = _compare(tmp_path, a, head, capsys)
    assert code == 1 and "extra_bytes missing" in out


# 2./3. only like with like: the case record


@pytest.mark.parametrize("field, value", [("preset", "deepseek-v3-tp8"), ("scenario", "b1-l4096"), ("scale", "prod"),
                                          ("backend", "flashinfer-fa3"), ("slots", 20000), ("layers", 1),
                                          ("kernel", "fa2"), ("command", "tpot")])
def test_another_case_is_bad_input_naming_the_field(a, tmp_path, capsys, field, value):
    head = copy.deepcopy(a)
    head["case"][field] = value
    for row in head["rows"]:
        if field in row:
            row[field] = value
    code, out, err = _compare(tmp_path, a, head, capsys)
    assert code == 2 and out == ""
    _one_error_line(err, f"case.{field}", repr(value))


def test_slots_and_layers_are_part_of_the_case(tmp_path, capsys, a):
    """Repro 3: a run with --layers 1 --slots 20000 carries them, so it is not the default case."""
    path = tmp_path / "l1.json"
    assert main(["run", "--scenario", "b1-l500", "--device", "cpu", "--layers", "1", "--slots", "20000",
                 "--strategy", "gather_cast", "--json", str(path)]) == 0
    capsys.readouterr()
    l1 = json.loads(path.read_text())
    assert (l1["case"]["slots"], l1["case"]["layers"], l1["case"]["scale"]) == (20000, 1, "ci")
    code, _, err = _compare(tmp_path, a, l1, capsys)
    assert code == 2
    _one_error_line(err, "case.slots", "20000", "16384")


@pytest.mark.parametrize("field, other", [("scenario", "b1-l4096"), ("preset", "deepseek-v3-tp8"), ("scale", "prod"),
                                          ("backend", "flashinfer")])
def test_a_row_of_another_case_than_its_file_is_bad_input(a, tmp_path, capsys, field, other):
    """Every case field a row repeats (a mutation skipping `backend` passed the scenario-only test); twin: the file
    as written compares."""
    head = copy.deepcopy(a)
    assert head["rows"][3][field] != other
    head["rows"][3][field] = other
    code, _, err = _compare(tmp_path, a, head, capsys)
    assert code == 2
    _one_error_line(err, f"rows[3].{field}", f"case.{field}")
    assert _compare(tmp_path, a, copy.deepcopy(a), capsys)[0] != 2


def test_a_verdict_with_more_mismatches_than_elements_is_bad_input(a, tmp_path, capsys):
    """A verdict's statistics that cannot be (5 mismatches of 3 elements) are refused naming the field; twin: 3 of 3."""
    head = copy.deepcopy(a)
    row = next(r for r in head["rows"] if r["metric"] == "verdict" and (r.get("detail") or {}).get("stats"))
    row["detail"]["stats"].update(mismatches=5, total=3)
    code, _, err = _compare(tmp_path, a, head, capsys)
    assert code == 2
    _one_error_line(err, "detail.stats.mismatches", "more than total 3")
    row["detail"]["stats"].update(mismatches=3, total=3)
    assert _compare(tmp_path, a, head, capsys)[0] != 2


def test_tpot_json_carries_its_case(tmp_path):
    out = tmp_path / "t.json"
    proc = subprocess.run([sys.executable, "-m", "harness", "tpot", "--device", "cpu", "--shrink", "--slots", "2048",
                           "--layers", "2", "--scenario", "b1-l500", "--repeats", "1", "--strategy", "gather_cast",
                           "--no-breakdown", "--json", str(out)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    case = read_results(out).case
    assert (case.command, case.scenario, case.slots, case.layers, case.backend) == ("tpot", "b1-l500", 2048, 2, "torch")
    run = tmp_path / "r.json"  # `harness run` of the very same case: another measurement, never compared with it
    assert main(["run", "--scenario", "b1-l500", "--device", "cpu", "--slots", "2048", "--layers", "2", "--repeats", "1",
                 "--strategy", "gather_cast", "--json", str(run)]) == 0
    run_case = read_results(run).case
    assert run_case == msgspec.structs.replace(case, command="run", workload=run_case.workload)
    for base, head in ((out, run), (run, out)):
        with pytest.raises(HarnessError, match=r"case\.command: '(run|tpot)' is not the base's '(tpot|run)'"):
            compare_results(load_results(base), load_results(head), 0.05, names=(str(base), str(head)))


# version 1 files are upgraded on read


def _as_v1(doc: dict, repro: str) -> dict:
    old = {k: v for k, v in doc.items() if k != "case"}
    old.update(schema=SCHEMA_V1, repro=repro, rows=[{k: v for k, v in r.items() if k != "gating"} for r in doc["rows"]])
    return old


def test_a_v1_file_is_upgraded_with_its_command_line(a, tmp_path, capsys):
    v1 = _as_v1(a, "python -m harness run --scenario b1-l500 --slots 16384 --layers=2 --json a.json")
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(v1))
    a = {**a, "schema": SCHEMA_V3, "case": {k: v for k, v in a["case"].items() if k not in ("workload", "workload_v4")}}  # no workload before v4
    assert load_results(path).case == read_results(_write(tmp_path / "v3.json", a)).case
    code, out, _ = _compare(tmp_path, v1, a, capsys)
    assert code == 0 and f"{len(a['rows']) - 1} unchanged, 1 undersampled" in out  # build_s: one number, too few to judge
    bare = _as_v1(a, "python -m harness run --scenario b1-l500")  # slots/layers not recorded: not the same case
    assert load_results(_write(tmp_path / "bare.json", bare)).case.slots is None
    code, _, err = _compare(tmp_path, bare, a, capsys)
    assert code == 2
    _one_error_line(err, "case.slots", "None")
    mixed = copy.deepcopy(bare)
    mixed["rows"][0]["scenario"] = "b32-l4096"  # a v1 file of two cases has no single case
    code, _, err = _compare(tmp_path, mixed, a, capsys)
    assert code == 2
    _one_error_line(err, "base.json: rows[].scenario", "several cases")


@pytest.mark.parametrize("repro, slots, layers", [
    ("--slots 4096 --slots 16384 --layers 2", 16384, 2),  # argparse keeps the last one
    ("--slot 16384 --layer=2", 16384, 2),  # and takes an abbreviation that names one option
    ("--slots=4096 --sl=16384 --layers 3 --layers=2", 16384, 2),
    ("--slots 4096 --layers 2", 4096, 2),  # twin: one of each, spelled out
])
def test_a_v1_case_is_what_its_command_line_ran(a, tmp_path, repro, slots, layers):
    """A v1 file's case comes from its recorded command line as the v1 CLI parsed it: the first --slots of two, or
    none for `--slot`, judged a 16,384-slot run as another pool size (compare exit 1 on extra_bytes) or as the default."""
    v1 = _as_v1(a, f"python -m harness run --scenario b1-l500 {repro} --json a.json")
    case = load_results(_write(tmp_path / "v1.json", v1)).case
    assert (case.slots, case.layers) == (slots, layers)


@pytest.mark.parametrize("slots", ["²", "9" * 5000])
def test_a_v1_slot_count_in_other_digits_is_not_recorded(a, tmp_path, capsys, slots):
    """'--slots ²' in a v1 command line: '²'.isdigit() held but int('²') raised, a traceback instead of a case;
    so did a count past int()'s 4,300-digit limit."""
    v1 = _as_v1(a, f"python -m harness run --scenario b1-l500 --slots {slots} --layers=2")
    assert load_results(_write(tmp_path / "v1.json", v1)).case.slots is None
    code, _, err = _compare(tmp_path, v1, a, capsys)
    assert code == 2
    _one_error_line(err, "case.slots")


@pytest.mark.parametrize("created", ["not a date", "2026-13-01T00:00:00+00:00", ""])
def test_a_created_stamp_that_is_no_timestamp_is_bad_input(a, tmp_path, capsys, created):
    """`compare` took `created: "not a date"` (exit 0) where `report` refused the same file: the schema refuses it,
    for every reader. Twin: no stamp at all (an older writer's) still compares."""
    code, _, err = _compare(tmp_path, a, {**a, "created": created}, capsys)
    assert code == 2
    _one_error_line(err, "head.json", "created: not an ISO timestamp")
    code, _, _ = _compare(tmp_path, a, {k: v for k, v in a.items() if k != "created"}, capsys)
    assert code == 0


@pytest.mark.parametrize("repro, tpot_row, command", [("python -m harness run --scenario b1-l500", False, "run"),
                                                     ("python -m harness tpot --scenario b1-l500", False, "tpot"),
                                                     ("", True, "tpot"), ("", False, "run")])
def test_a_v2_file_is_upgraded_with_the_command_that_measured_it(a, tmp_path, capsys, repro, tpot_row, command):
    """Version 2 had no case.command: the recorded command line's subcommand, else a tpot_ms row, says which. A tpot
    file holds tpot's rows (here a timed row and the control); one whose rows are another command's is bad input."""
    v2 = copy.deepcopy(a)
    v2["case"] = {k: v for k, v in v2["case"].items() if k not in ("command", "workload", "workload_v4")}  # v3-v5 added them
    v2.update(schema=SCHEMA_V2, repro=repro)
    if command == "tpot":
        timed = {**_rows(v2, "cast_us", "stock")[0], "metric": "tpot_ms" if tpot_row else "attn_path_ms", "unit": "ms"}
        v2["rows"] = [timed, *_rows(v2, "control_copy_gbps")]
    assert load_results(_write(tmp_path / "v2.json", v2)).case.command == command
    if command == "tpot":
        code, _, err = _compare(tmp_path, {**v2, "rows": [*v2["rows"], *_rows(a, "verdict", "stock")]}, a, capsys)
        assert code == 2
        _one_error_line(err, "base.json", "rows[2].metric", "never by the file's case.command 'tpot'")


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_a_key_given_twice_is_bad_input(a, tmp_path, capsys):
    """A head edited to carry two `rows`, its own 1.5x slower ones and then the base's, was read as the
    last (json keeps it) and passed the gate; a key given twice is bad input naming it."""
    base, head = _on_gpu(a), _on_gpu(a)
    for row in (r for r in _rows(base, "cast_us") if r["value"] is not None):
        set_samples(row, [100.0 + i for i in range(5)])
    for row in (r for r in _rows(head, "cast_us") if r["value"] is not None):
        set_samples(row, [150.0 + i for i in range(5)])
    bp, hp = _write(tmp_path / "base.json", base), tmp_path / "head.json"
    text = json.dumps(_rerun(head))
    hp.write_text(text[:-1] + ', "rows": ' + json.dumps(base["rows"]) + "}")
    assert main_compare(bp, hp, "5%") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    _one_error_line(captured.err, f"{hp}: rows", "duplicate key")
    hp.write_text(text)  # twin: the slower rows alone regress
    assert main_compare(bp, hp, "5%") == 1 and "cast_us regressed" in capsys.readouterr().out


# 4. devices


def _on_gpu(doc: dict, device: str = "cuda:0") -> dict:
    doc = copy.deepcopy(doc)
    doc["environment"].update(device=device, gpu="NVIDIA H200")
    for row in doc["rows"]:
        row.pop("gating", None)
    return doc


def test_gpu_base_against_cpu_head_cannot_judge_both_ways(a, tmp_path, capsys):
    gpu = _on_gpu(a)
    slower = copy.deepcopy(a)
    for row in (r for r in _rows(slower, "cast_us") if r["value"] is not None):
        set_samples(row, [v * 1.2 for v in row["samples"]])
    for base, head in ((gpu, slower), (slower, gpu), (gpu, a), (a, gpu)):
        code, out, _ = _compare(tmp_path, base, head, capsys)
        assert code == 2 and "ENVIRONMENTS DIFFER: device" in out and "CANNOT JUDGE" in out


def test_device_names_compare_case_insensitively(a, tmp_path, capsys):
    code, out, _ = _compare(tmp_path, _on_gpu(a, "CUDA:0"), _on_gpu(a, "cuda:0"), capsys)
    assert code == 0 and "ENVIRONMENTS DIFFER" not in out
    code, _, _ = _compare(tmp_path, _on_gpu(a, "CUDA:0"), a, capsys)
    assert code == 2  # twin: cuda vs cpu


@pytest.mark.parametrize("edit", ["no environment", "device None", "device gpu"])
def test_an_unknown_device_is_bad_input_when_timings_gate(a, tmp_path, capsys, edit):
    """Repro r10: an absent or unknown environment.device made every timing non-gating (read as cpu)."""
    gpu = _on_gpu(a)
    bad = copy.deepcopy(gpu)
    if edit == "no environment":
        del bad["environment"]
    else:
        bad["environment"]["device"] = None if edit == "device None" else "gpu"
    for base, head, name in ((gpu, bad, "head.json"), (bad, gpu, "base.json")):
        code, out, err = _compare(tmp_path, base, head, capsys)
        assert code == 2 and out == ""
        _one_error_line(err, f"{name}: environment.device", "is not one of cpu, cuda")
    untimed = [r for r in a["rows"] if r["metric"] in ("verdict", "extra_bytes")]  # twin: nothing timed gates
    code, _, err = _compare(tmp_path, {**bad, "rows": untimed}, {**a, "rows": untimed, "created": "2026-12-04T00:00:00+00:00"}, capsys)
    assert code == 0 and err == ""


def test_a_gpu_named_in_one_file_only_cannot_judge(a, tmp_path, capsys):
    """A CUDA file without its GPU's name cannot be shown to come from the base's GPU: its timings were judged
    (an unchanged head exited 0, a 1.3x slower one 1)."""
    base = _on_gpu(a)
    unnamed = copy.deepcopy(base)
    unnamed["environment"]["gpu"] = None
    for b, h, side in ((base, _rerun(unnamed), "base"), (unnamed, _rerun(base), "head")):
        code, out, _ = _compare(tmp_path, b, h, capsys)
        assert code == 2 and f"ENVIRONMENTS DIFFER: GPU NVIDIA H200 named only in the {side}" in out and "CANNOT JUDGE" in out
    code, out, _ = _compare(tmp_path, base, _rerun(base), capsys)
    assert code == 0 and "ENVIRONMENTS DIFFER" not in out  # twin: both named


def test_a_control_with_too_few_samples_cannot_judge(a, tmp_path, capsys):
    """A control of 3 samples a side was `undersampled`, so the environment guard passed it unread: a head on a GPU
    at half the copy bandwidth had its timings judged (exit 0 for the unchanged head)."""
    base, head = _on_gpu(a), _rerun(_on_gpu(a))
    (control,) = _rows(base, "control_copy_gbps")
    set_samples(control, control["samples"][:3])
    set_samples(_rows(head, "control_copy_gbps")[0], [v / 2 for v in control["samples"]])
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 2 and "control control_copy_gbps cannot be checked: too few samples (3 vs 3" in out and "CANNOT JUDGE" in out
    set_samples(_rows(head, "control_copy_gbps")[0], control["samples"])  # equal medians: still too few to test
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 2 and "control control_copy_gbps cannot be checked: too few samples (3 vs 3" in out
    base, head = _on_gpu(a), _rerun(_on_gpu(a))  # twin: the controls as measured
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 0 and "ENVIRONMENTS DIFFER" not in out


def test_a_control_filed_under_another_strategy_is_still_the_control(a, tmp_path, capsys):
    """The controls were paired by their whole row key: a head whose control row named another strategy ('ctrl') had
    both files 'carry a control' yet none was compared, so a GPU at half the copy bandwidth had its timings judged (exit 0)."""
    base, head = _on_gpu(a), _rerun(_on_gpu(a))
    (control,) = _rows(head, "control_copy_gbps")
    gbps = [3000.0 + 3 * k for k in range(10)]  # a GPU's copy bandwidth, not this CPU's (a loaded CPU's spread can
    set_samples(_rows(base, "control_copy_gbps")[0], gbps)  # reach 2x, and then half of it is no clear drop)
    set_samples(control, [v / 2 for v in gbps])
    control["strategy"] = "ctrl"
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 2 and "ENVIRONMENTS DIFFER: control control_copy_gbps" in out and "CANNOT JUDGE" in out
    set_samples(control, gbps)  # twin: the same control under that name
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 0 and "ENVIRONMENTS DIFFER" not in out



def test_two_control_rows_are_bad_input(a, tmp_path, capsys):
    """A head carrying two control rows (one at the base's bandwidth, one at half) was compared by its first only, so
    which of them a run 'measured' decided whether its timings were judged. A file has one control, else one error line."""
    base, head = _on_gpu(a), _rerun(_on_gpu(a))
    (control,) = _rows(head, "control_copy_gbps")
    second = copy.deepcopy(control)
    second["strategy"] = "ctrl"
    set_samples(second, [v / 2 for v in control["samples"]])
    head["rows"].append(second)
    code, out, err = _compare(tmp_path, base, head, capsys)
    assert code == 2 and out == ""
    _one_error_line(err, "head.json", "rows[", "a second control_copy_gbps row")
    head["rows"].pop()  # the twin: one control
    assert _compare(tmp_path, base, head, capsys)[0] == 0

@pytest.mark.parametrize("guard, field", [("SM clock 1980 -> 1410 MHz", "detail.guard"), ({"disturbed": ""}, "detail.guard.disturbed"),
                                          ({"disturbed": ["SM clock"]}, "detail.guard.disturbed")])
def test_a_malformed_clock_guard_is_bad_input(a, tmp_path, capsys, guard, field):
    """A timing row's clock guard of another shape than the writer's (the reason as a bare string, an empty or a listed
    reason) was read as 'not disturbed' and the row judged (exit 0): a guard that cannot be read is one error line."""
    base, head = _on_gpu(a), _rerun(_on_gpu(a))
    _rows(head, "cast_us", "stock")[0]["detail"] = {"guard": guard}
    code, out, err = _compare(tmp_path, base, head, capsys)
    assert code == 2 and out == ""
    _one_error_line(err, "head.json", field)
    _rows(head, "cast_us", "stock")[0]["detail"] = {"guard": {"disturbed": "SM clock 1980 -> 1410 MHz"}}  # twin: as written
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 2 and "DISTURBED: stock/cast_us (clock guard: SM clock 1980 -> 1410 MHz)" in out


# 5. units


@pytest.mark.parametrize("metric, unit, factor", [("extra_bytes", "MiB", 2), ("cast_us", "ms", 1.2)])
def test_a_unit_change_is_bad_input(a, tmp_path, capsys, metric, unit, factor):
    head = copy.deepcopy(a)
    row = _rows(head, metric, "gather_cast")[0]
    row.update(unit=unit, value=row["value"] * factor)
    if row["samples"]:
        set_samples(row, [v * factor for v in row["samples"]])
    code, out, err = _compare(tmp_path, a, head, capsys)
    assert code == 2 and out == ""
    _one_error_line(err, f"gather_cast/{metric}.unit", repr(unit), "is not the metric table's")


def test_a_unit_the_metric_table_does_not_declare_is_bad_input(a, tmp_path, capsys):
    """cast_us labelled `ms` in both files (20 -> 30 us written as 0.020 -> 0.030) passed as `slower`: its 0.5 us
    resolution was applied to milliseconds. A unit other than the table's is one error line naming the field."""
    base, head = _on_gpu(a), _rerun(_on_gpu(a))
    for doc, scale in ((base, 1.0), (head, 1.5)):
        set_samples(_rows(doc, "cast_us", "stock")[0], [0.020 * scale * (1 + i / 1000) for i in range(10)])
        _rows(doc, "cast_us", "stock")[0]["unit"] = "ms"
    code, out, err = _compare(tmp_path, base, head, capsys)
    assert code == 2 and out == ""
    _one_error_line(err, "base.json: stock/cast_us.unit", "'ms'", "'us'")
    for doc in (base, head):  # twin: the same timings in the table's unit regress
        row = _rows(doc, "cast_us", "stock")[0]
        set_samples(row, [v * 1000 for v in row["samples"]])
        row["unit"] = "us"
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 1 and "stock/cast_us regressed" in out


@pytest.mark.parametrize("metric, unit", [("cast_us", "ms"), ("verdict", "us")])
def test_a_mislabelled_unit_in_the_base_names_the_base(a, tmp_path, capsys, metric, unit):
    """A base whose row carried another unit than the metric table's, beside a sound head, was reported as the head's
    fault ('head.json: stock/cast_us.unit: 'us' is not the base's 'ms''): the one error line names the file at fault."""
    base = copy.deepcopy(a)
    _rows(base, metric, "stock")[0]["unit"] = unit
    code, out, err = _compare(tmp_path, base, _rerun(a), capsys)
    assert code == 2 and out == ""
    _one_error_line(err, f"base.json: stock/{metric}.unit", repr(unit), "metric table's")
    assert "head.json" not in err


# 6. verdicts


@pytest.mark.parametrize("value", ["FAIL", "garbage", None, 0, "Pass"])
def test_a_verdict_outside_the_four_is_bad_input(a, tmp_path, capsys, value):
    head = copy.deepcopy(a)
    index = next(i for i, r in enumerate(head["rows"]) if r["metric"] == "verdict" and r["value"] == "pass")
    head["rows"][index]["value"] = value
    code, _, err = _compare(tmp_path, a, head, capsys)
    assert code == 2
    _one_error_line(err, f"rows[{index}].value")


@pytest.mark.parametrize("base_value, head_value", [("pass", "unsupported"), ("fail", "unsupported"), ("error", "unsupported"),
                                                    ("pass", "fail"), ("error", "fail"),
                                                    ("fail", "fail")])
def test_a_head_that_does_not_pass_fails(a, tmp_path, capsys, base_value, head_value):
    base, head = copy.deepcopy(a), copy.deepcopy(a)
    _set_verdict(base, "gather_cast", base_value)
    _set_verdict(head, "gather_cast", head_value)
    code, out, _ = _compare(tmp_path, base, _rerun(head), capsys)
    assert code == 1 and "gather_cast/verdict failing" in out


def test_unsupported_after_pass_cannot_be_judged_when_the_environment_says_why(a, tmp_path, capsys):
    """Explained, it is not a failure of the commit; but the head gave no result, so neither is it a pass (exit 0
    before: a head whose every strategy turned unsupported passed, nothing judged)."""
    base, head = _on_gpu(a), _on_gpu(a)
    base["environment"]["flashinfer"], head["environment"]["flashinfer"] = "0.7.2.post1", None
    _set_verdict(head, "gather_cast", "unsupported")
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 2 and "flashinfer 0.7.2.post1 -> None" in out and "CANNOT JUDGE (exit 2)" in out
    head["environment"]["flashinfer"] = "0.7.2.post1"  # twin: the same environment
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 1 and "unsupported in the same environment" in out


def test_an_explained_unsupported_strategy_needs_no_other_rows(a, tmp_path, capsys):
    """Repro r12: a run writes only the verdict row of an unsupported strategy; with the environment explaining
    it, its timing and size rows are `unsupported`, not `missing`."""
    base, head = _on_gpu(a), _on_gpu(a)
    base["environment"]["flashinfer"], head["environment"]["flashinfer"] = "0.7.2.post1", None
    head["rows"] = [r for r in head["rows"] if r["strategy"] != "gather_cast" or r["metric"] == "verdict"]
    _rows(head, "verdict", "gather_cast")[0].update(value="unsupported", detail={"status": "unsupported", "reason": "needs flashinfer"})
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 2 and "missing" not in out and "its strategy is unsupported in the head" in out
    head["environment"]["flashinfer"] = "0.7.2.post1"  # twin: the same environment
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 1 and "gather_cast/verdict failing" in out and "gather_cast/extra_bytes missing" in out


def test_a_failing_strategy_turned_unsupported_in_the_same_environment_fails(a, tmp_path, capsys):
    """A base whose strategy errored (a run writes its verdict row alone) against a head that calls it unsupported,
    in the same environment, passed as `changed`: the quickest way to turn a red gate green without a fix."""
    base, head = copy.deepcopy(a), _rerun(a)
    for doc, value in ((base, "error"), (head, "unsupported")):
        doc["rows"] = [r for r in doc["rows"] if r["strategy"] != "gather_cast" or r["metric"] == "verdict"]
        _rows(doc, "verdict", "gather_cast")[0].update(value=value, detail={"status": value, "reason": "no"})
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 1 and "gather_cast/verdict failing" in out and "unsupported in the same environment (error in the base)" in out
    head["environment"]["torch"] = "2.99.0"  # twin: an environment that explains it
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 2 and "failing" not in out and "1 unsupported" in out


# 8. bounded memory


def test_a_million_samples_compare_in_bounded_memory(a, tmp_path):
    base, head = copy.deepcopy(a), copy.deepcopy(a)
    for doc, scale in ((base, 1.0), (head, 1.01)):
        row = _rows(doc, "cast_us", "stock")[0]
        set_samples(row, [row["value"] * scale * (1 + (i % 1000) / 1e5) for i in range(1_000_000)])
    bp, hp = _write(tmp_path / "base.json", base), _write(tmp_path / "head.json", head)
    limit = 1 << 30  # 1 GiB of address space: the old 2000 x n int64 draw needs 16 GB

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run([sys.executable, "-m", "harness", "compare", str(bp), str(hp)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=HANG_GUARD_S, preexec_fn=cap)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "MemoryError" not in proc.stderr and f"{len(a['rows'])} rows" in proc.stdout


def test_timings_at_the_ends_of_the_schemas_range_are_judged(a, tmp_path, capsys):
    """Repro r08: 1e-200 against 1e200 samples regress one way and improve the other (was `unchanged` and a
    math domain error traceback)."""
    base, head = _on_gpu(a), _on_gpu(a)
    for doc, scale in ((base, 1e-200), (head, 1e200)):
        set_samples(_rows(doc, "cast_us", "stock")[0], [scale * (1 + i / 100) for i in range(10)])
    code, out, err = _compare(tmp_path, base, head, capsys)
    assert code == 1 and "stock/cast_us regressed" in out and "inf" in out and err == ""
    code, out, err = _compare(tmp_path, head, base, capsys)
    assert code == 0 and "improved" in out and err == ""


# 10. the word fits


def _shift(doc: dict, metric: str, strategy: str, factor: float) -> dict:
    doc = copy.deepcopy(doc)
    row = _rows(doc, metric, strategy)[0]
    set_samples(row, [v * factor for v in row["samples"]])
    return doc


def test_a_faster_head_is_never_slower(a, tmp_path, capsys):
    gpu = _on_gpu(a)
    for factor in (0.88, 0.97, 0.999):
        head = _shift(gpu, "cast_us", "stock", factor)
        comparison = compare_results(gpu, head, 0.05)
        (change,) = [c for c in comparison.changes if c.key[3] == "stock" and c.key[5] == "cast_us"]
        assert change.status in ("improved", "unchanged", "inconclusive"), (factor, change)
        code, out, _ = _compare(tmp_path, gpu, head, capsys)
        assert "slower" not in out and "regressed" not in out


def test_informational_metrics_never_print_regressed(a, tmp_path, capsys):
    base = _on_gpu(a)  # on CUDA too: step_ms, step_eager_ms inform only
    set_samples(_rows(base, "step_ms", "stock")[0], [10.0 + 0.01 * (i % 7) for i in range(40)])
    head = _shift(base, "step_ms", "stock", 1.68)  # the H200 A/A pair's 1.68x
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 0 and "regressed" not in out and "worse" in out


def test_the_below_resolution_note_is_shown(a, tmp_path, capsys):
    base = _on_gpu(a)
    for row in _rows(base, "cast_us"):
        set_samples(row, [2.0 + 0.01 * (i % 7) for i in range(40)])
    head = copy.deepcopy(base)
    for row in _rows(head, "cast_us"):
        set_samples(row, [2.3 + 0.01 * (i % 7) for i in range(40)])  # +15%, but 0.3 us < 0.5 us
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 0 and "below the metric's resolution 0.5" in out and "regressed" not in out


@pytest.mark.parametrize("text", ["0%", "100%", "150%", "-5%"])
def test_max_regression_outside_0_100_is_bad_input(a, tmp_path, capsys, text):
    code, _, err = _compare(tmp_path, a, a, capsys, tolerance=text)
    assert code == 2
    _one_error_line(err, "--max-regression", "(0%, 100%)") if text != "-5%" else _one_error_line(err, "--max-regression")


# 12. the schema refuses negative or zero timings and sizes


@pytest.mark.parametrize("metric, field, value", [("cast_us", "samples", -1.0), ("cast_us", "samples", 0.0),
                                                  ("cast_us", "value", -3.0), ("extra_bytes", "value", -1),
                                                  ("control_copy_gbps", "value", 0.0)])
def test_negative_or_zero_measurements_are_bad_input(a, tmp_path, capsys, metric, field, value):
    head = copy.deepcopy(a)
    index = next(i for i, r in enumerate(head["rows"]) if r["metric"] == metric)
    row = head["rows"][index]
    if field == "samples":
        row["samples"][0] = value
    else:
        row["value"] = value
    code, _, err = _compare(tmp_path, a, head, capsys)
    assert code == 2
    _one_error_line(err, f"rows[{index}].{field}", metric)


@pytest.mark.parametrize("stat", ["mismatches", "total", "nonfinite"])
def test_negative_counts_in_verdict_statistics_are_bad_input(a, tmp_path, capsys, stat):
    head = copy.deepcopy(a)
    index = next(i for i, r in enumerate(head["rows"]) if r["metric"] == "verdict" and (r["detail"] or {}).get("stats"))
    head["rows"][index]["detail"]["stats"][stat] = -1
    code, _, err = _compare(tmp_path, a, head, capsys)
    assert code == 2
    _one_error_line(err, f"rows[{index}].detail.stats.{stat}")
    head["rows"][index]["detail"]["stats"][stat] = 0  # twin: zero is a count
    assert _compare(tmp_path, a, _rerun(head), capsys)[0] != 2


# the environment is one declared record (schema.Environment), written and read


def test_the_environment_is_the_declared_record(monkeypatch):
    import msgspec
    import torch

    from harness.measure import environment as fingerprint
    from harness.results.schema import Environment

    env = fingerprint.environment(torch.device("cpu"))
    assert set(env) == {f.name for f in msgspec.structs.fields(Environment)} and env["gpu"] is None
    monkeypatch.setattr(fingerprint, "_gpu_fingerprint", lambda device: {"gpu": "NVIDIA H200", "fan_speed": "30 %"})
    with pytest.raises(TypeError, match="fan_speed"):  # twin: a key the record does not declare
        fingerprint.environment(torch.device("cuda"))


@pytest.mark.parametrize("field, text", [("strategy", "gather_cast\nstock"), ("scenario", ""), ("metric", "cast_us\t")])
def test_a_row_key_with_a_control_character_is_bad_input(a, tmp_path, capsys, field, text):
    """A strategy named 'gather_cast\\nstock' was accepted: its REGRESSION line came out as two lines, the second
    reading like another strategy's. Every key field is non-empty printable text, else one error line naming it."""
    head = copy.deepcopy(a)
    _rows(head, "cast_us", "gather_cast")[0][field] = text
    code, out, err = _compare(tmp_path, a, head, capsys)
    assert code == 2 and out == ""
    _one_error_line(err, "head.json", field)
    assert _compare(tmp_path, a, _rerun(a), capsys)[0] == 0  # the twin: another run, its keys plain names


@pytest.mark.parametrize("metric, better", [("step_ms", "higher"), ("extra_bytes", "higher")])
def test_a_direction_other_than_the_metric_tables_is_bad_input(a, tmp_path, capsys, metric, better):
    """A row whose `better` disagrees with the metric table was judged by the table, silently: like a wrong unit, a
    mislabelled row is one error line naming the field. Twin: the untouched rerun compares."""
    head = _rerun(copy.deepcopy(a))
    _rows(head, metric, "gather_cast")[0]["better"] = better
    code, out, err = _compare(tmp_path, a, head, capsys)
    assert code == 2 and out == ""
    _one_error_line(err, f"head.json: gather_cast/{metric}.better", repr(better), "metric table's")
    assert _compare(tmp_path, a, _rerun(a), capsys)[0] == 0


def _slower(doc: dict, strategy: str, factor: float) -> dict:
    """`doc` with `strategy`'s timings as ten tight samples (host timings of a CPU run scatter too far to judge 3x at
    5 samples), `factor` times their median."""
    doc = copy.deepcopy(doc)
    for row in doc["rows"]:
        if row["strategy"] == strategy and row.get("samples"):
            set_samples(row, [row["value"] * factor * (1 + 0.001 * i) for i in range(10)])
    return doc


def test_a_base_that_passed_a_strategy_but_holds_no_timing_of_it_cannot_judge(a, tmp_path, capsys):
    """A base whose gather_cast timing crashed (as a run writes it: one null `timing` row for the strategy, no timing
    rows, the verdict pass) against a head 3x slower: every timing was `added` and the gate passed (exit 0) with nothing
    judged. Twins: with the base's timings it is a regression (exit 1); a base where the strategy was unsupported has
    nothing to lose (its timings are new: exit 0); a metric the base's strategy cannot have (shadow's null cast_us)
    measured in the head is `added`, not a failure to re-run."""
    base, head = _on_gpu(a), _slower(_on_gpu(a), "gather_cast", 3.0)
    timed = [r for r in _rows(base, "verdict", "gather_cast")]
    base["rows"] = [r for r in base["rows"] if r["strategy"] != "gather_cast" or r["metric"] in ("verdict", "extra_bytes")]
    base["rows"].append({**timed[0], "metric": "timing", "value": None, "detail": {"unsupported": "RuntimeError: timing crashed"}})
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 2 and "NO BASE VALUE: gather_cast/" in out and "CANNOT JUDGE (exit 2)" in out, out
    unbased = compare_results(load_results(tmp_path / "base.json"), load_results(tmp_path / "head.json"), 0.05).unbased
    assert unbased and all(c.note.endswith("RuntimeError: timing crashed") for c in unbased)  # the table may wrap it
    code, out, _ = _compare(tmp_path, _slower(_on_gpu(a), "gather_cast", 1.0), head, capsys)
    assert code == 1 and "gather_cast/cast_us regressed" in out
    _set_verdict(base, "gather_cast", "unsupported")
    code, out, _ = _compare(tmp_path, base, head, capsys)
    assert code == 0 and "NO BASE VALUE" not in out
    shadow = _on_gpu(a)
    (cast,) = _rows(shadow, "cast_us", "shadow")
    set_samples(cast, [5.0 + 0.01 * i for i in range(10)])
    code, out, _ = _compare(tmp_path, _on_gpu(a), shadow, capsys)
    assert code == 0 and "NO BASE VALUE" not in out, out


def test_a_file_relabelled_to_another_device_is_bad_input(a, tmp_path, capsys):
    """A CUDA run's file with environment.device edited to cpu: its timings, which gate on CUDA only, were judged as a
    CPU file's (informational), so a 3x slowdown passed. The rows' recorded gating says where it was written. Twin:
    the file as written compares."""
    from harness.results.metrics import METRICS

    gpu = _on_gpu(a)
    for row in gpu["rows"]:
        row["gating"] = METRICS[row["metric"]].gates("cuda")
    relabelled = copy.deepcopy(gpu)
    relabelled["environment"]["device"] = "cpu"
    for base, head in ((_slower(relabelled, "gather_cast", 1.0), _slower(relabelled, "gather_cast", 3.0)), (gpu, relabelled)):
        code, _, err = _compare(tmp_path, base, head, capsys)
        assert code == 2
        _one_error_line(err, ".gating", "written on another device than environment.device 'cpu'")
    code, out, _ = _compare(tmp_path, _slower(gpu, "gather_cast", 1.0), _slower(gpu, "gather_cast", 3.0), capsys)
    assert code == 1 and "regressed" in out
