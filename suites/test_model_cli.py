"""`harness tpot` and the TPOT report end to end on CPU (shrunk model, small pool)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suites.hang_guard import HANG_GUARD_S
from suites.helpers import another_run, repro_words

ROOT = Path(__file__).resolve().parent.parent
SMALL = ("--device", "cpu", "--shrink", "--slots", "2048", "--scenario", "b1-l500", "--repeats", "1")


def harness(*args, module="harness"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=HANG_GUARD_S)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("tpot") / "t.json"
    proc = harness("tpot", *SMALL, "--strategy", "gather_cast", "--check-rotation",
                   "--layers", "2", "--weight-sets", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_tpot_writes_tpot_ms_and_attn_share(results):
    doc = json.loads(results.read_text())
    rows = {(r["strategy"], r["metric"]): r for r in doc["rows"]}
    for name in ("gather_cast",):
        assert rows[(name, "tpot_ms")]["value"] > 0 and len(rows[(name, "tpot_ms")]["samples"]) == 1
        # on CPU attn_path_ms and tpot_ms are host times of separate runs (it could pass 1): no share, the reason said
        share = rows[(name, "attn_share")]
        assert share["value"] is None and "separate runs" in share["detail"]["unsupported"], share
        assert rows[(name, "step_weight_bytes")]["value"] > 0
    detail = rows[("gather_cast", "tpot_ms")]["detail"]
    assert detail["allreduce"].startswith("none") and detail["kernels"]["routed_experts"] == "torch_per_pair_bf16"
    assert rows[("gather_cast", "rotation_check")]["detail"]["distinct_ms"] > 0
    assert repro_words(doc["repro"])[1][0] == "tpot"


def test_tpot_results_carry_the_control_compare_checks_the_environment_with(results, tmp_path):
    """As `run` does: without the control copy compare could not tell a throttled GPU from a slower commit (twin:
    a head without it is an environment compare cannot check; on a GPU that is exit 2, here nothing gates)."""
    doc = json.loads(results.read_text())
    (control,) = [r for r in doc["rows"] if r["metric"] == "control_copy_gbps"]
    assert control["strategy"] == "control" and control["value"] > 0 and len(control["samples"]) >= 10
    doc["rows"] = [r for r in doc["rows"] if r["metric"] != "control_copy_gbps"]
    head = tmp_path / "head.json"
    head.write_text(json.dumps(another_run(doc)))
    proc = harness("compare", str(results), str(head))
    assert "ENVIRONMENTS DIFFER: control control_copy_gbps only in the base" in proc.stdout, proc.stdout + proc.stderr


CPU_GUARD = {"disturbed": None, "reruns": 0, "clocks": "not recorded on cpu"}


def test_tpot_rows_carry_the_clock_guard_of_their_timing_blocks(results):
    """As `run` does: each timing block under the clock guard, its guard in the detail of the row it timed, each
    breakdown component's in its entry, the rotation check's beside its samples; on CPU it says nothing was recorded
    (before: none, so a throttled or shared GPU's tpot_ms was judged as clean)."""
    rows = {(r["strategy"], r["metric"]): r["detail"] for r in json.loads(results.read_text())["rows"]}
    tpot = rows[("gather_cast", "tpot_ms")]
    assert tpot["guard"] == rows[("gather_cast", "attn_path_ms")]["guard"] == CPU_GUARD
    assert [p["guard"] for p in tpot["breakdown"]["parts"].values()] == [CPU_GUARD] * 5
    assert rows[("gather_cast", "rotation_check")]["rotated_guard"] == rows[("gather_cast", "rotation_check")]["distinct_guard"] == CPU_GUARD


def test_a_tpot_the_clock_guard_found_disturbed_is_not_judged(tmp_path, monkeypatch, capsys):
    """A GPU whose SM clock drops in every timing block: tpot_ms and attn_path_ms marked disturbed after one re-run, and
    compare of two such files cannot judge tpot_ms (DISTURBED, exit 2) instead of comparing a throttled GPU's numbers."""
    from harness.cli import main
    from suites.helpers import as_on_a_gpu_box, clocks_drop_in_every_block

    as_on_a_gpu_box(monkeypatch)
    clocks_drop_in_every_block(monkeypatch)
    files = [tmp_path / "base.json", tmp_path / "head.json"]
    for out in files:
        assert main(["tpot", *SMALL, "--layers", "1", "--no-breakdown", "--strategy", "stock", "--json", str(out)]) == 0
    rows = {r["metric"]: r["detail"] for r in json.loads(files[1].read_text())["rows"] if r["strategy"] == "stock"}
    for metric in ("tpot_ms", "attn_path_ms"):
        assert rows[metric]["guard"]["disturbed"] == "SM clock 1980 -> 1200 MHz" and rows[metric]["guard"]["reruns"] == 1
    capsys.readouterr()
    assert main(["compare", *map(str, files)]) == 2
    out = capsys.readouterr().out
    assert "DISTURBED" in out and "stock/tpot_ms (clock guard: SM clock 1980 -> 1200 MHz)" in out, out


def test_weight_sets_past_the_layer_count_are_the_same_workload(tmp_path):
    """--weight-sets 9 on 2 layers rotates the 2 sets --weight-sets 2 does: compare takes them as one case (before:
    the raw 9 went into the workload fingerprint and compare refused the pair, exit 2)."""
    files = []
    for sets in ("2", "9"):
        files.append(tmp_path / f"w{sets}.json")
        proc = harness("tpot", *SMALL, "--strategy", "gather_cast", "--layers", "2", "--weight-sets", sets, "--json", str(files[-1]))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(files[1].read_text())["case"]["workload"] == json.loads(files[0].read_text())["case"]["workload"]
    proc = harness("compare", *map(str, files))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_report_renders_table_and_articles_figures(results, tmp_path):
    proc = harness(str(results), "--out", str(tmp_path), module="harness.tpot.report")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "tpot.md").read_text()
    assert "| gather_cast |" in text and "95.6" in text and "74.1" in text and "Rotation check" in text


def test_report_sigterm_mid_write_is_an_interruption_that_leaves_no_temporary_file(results, tmp_path):
    """A cancelled job's SIGTERM while tpot.md is being written unwinds as in `python -m harness`: 'interrupted',
    exit 130, --out holds no temporary file (before: killed outright, -15, its .tpot.md.tmp-* left behind)."""
    code = ("import os, signal, sys\nfrom harness.tpot.report import main\n"
            "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGTERM)\nsys.exit(main(sys.argv[1:]))\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", code, str(results), "--out", str(out)], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=HANG_GUARD_S)
    assert proc.returncode == 130 and proc.stderr.strip() == "interrupted", proc.stderr[-2000:]
    assert os.listdir(out) == []


def test_report_rejects_a_non_results_file(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    proc = harness(str(bad), "--out", str(tmp_path / "r"), module="harness.tpot.report")
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {bad}")


def test_report_refuses_bad_inputs_and_protected_outputs(results, tmp_path):
    """Each hostile call: exit 2, one error line naming the file or option, nothing written."""
    (tmp_path / "rows5.json").write_text('{"rows": [5]}')
    (tmp_path / "tp2.json").write_text("[]")
    (tmp_path / "own").mkdir()
    own = tmp_path / "own" / "tpot.md"
    own.write_bytes(results.read_bytes())  # a results file that carries the report's file name
    golden = ROOT / "golden"
    cases = [((str(results), str(tmp_path / "missing.json"), "--out", str(tmp_path / "o1")), "missing.json"),
             ((str(tmp_path / "rows5.json"), "--out", str(tmp_path / "o2")), "rows5.json"),
             ((str(results), "--tp2", str(tmp_path / "tp2.json"), "--out", str(tmp_path / "o3")), "tp2.json"),
             ((str(results), "--tp2", str(tmp_path / "nope.json"), "--out", str(tmp_path / "o4")), "nope.json"),
             ((str(own), "--out", str(tmp_path / "own"), "--force"), "a results file"),
             ((str(results), "--out", str(golden)), "golden folder")]
    before = sorted(p.name for p in golden.iterdir())
    for args, fragment in cases:
        proc = harness(*args, module="harness.tpot.report")
        (line,) = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and line.startswith("error: ") and fragment in line, (args, proc.stderr[-500:])
        assert proc.stdout == ""
    assert own.read_bytes() == results.read_bytes() and sorted(p.name for p in golden.iterdir()) == before


def _main_error(capsys, *args) -> str:
    from harness.cli import main

    assert main(["tpot", *SMALL, *args]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize("args, fragment", [
    (("--weight-sets", "0"), "--weight-sets"),
    (("--strategy", "nope"), "--strategy"),
    (("--preset", "nope"), "--preset"),
    (("--repeats", "0"), "--repeats"),
])
def test_tpot_bad_input_is_one_error_line(capsys, args, fragment):
    assert fragment in _main_error(capsys, *args)


@pytest.mark.parametrize("args, where", [(("--scale", "prod"), "--scale prod"), (("--layers", "5"), "--layers")])
def test_tpot_more_layers_than_the_shrunk_model_names_the_option_given(capsys, args, where):
    """--shrink's 3-layer model under --scale prod (the preset's 78 layers): the line names --scale prod and --shrink
    (before: '--layers', which the user never passed); twin: --layers 5, which the user did pass, is named."""
    line = _main_error(capsys, *args)
    assert line.startswith(f"error: {where}: ") and "has 3 layers" in line and "--layers" not in line.removeprefix(f"error: {where}"), line


@pytest.mark.parametrize("args, flag", [(("--sglang-output-len", "8"), "--sglang-output-len"), (("--sglang-full-tp",), "--sglang-full-tp")])
def test_tpot_an_option_of_the_sglang_engine_is_refused_by_the_harness_engine(capsys, args, flag):
    line = _main_error(capsys, *args)
    assert flag in line and "only --engine sglang reads it" in line, line


@pytest.mark.parametrize("args, flag", [(("--repeats", "5"), "--repeats"), (("--weight-sets", "2"), "--weight-sets"),
                                        (("--backend", "torch"), "--backend"), (("--allreduce-table", "none"), "--allreduce-table"),
                                        (("--check-rotation",), "--check-rotation"), (("--no-breakdown",), "--no-breakdown")])
def test_tpot_an_option_of_the_harness_engine_is_refused_by_the_sglang_engine(capsys, args, flag):
    """SGLang's one-batch benchmark ignores them: a run that said --repeats 5 would have timed output_len - 1 steps."""
    from harness.cli import main

    assert main(["tpot", "--device", "cpu", "--scenario", "b1-l500", "--engine", "sglang", *args]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert line.startswith(f"error: {flag}") and "only --engine harness reads it" in line, line


def test_tpot_bad_allreduce_table_names_the_file(capsys, tmp_path):
    table = tmp_path / "ar.toml"
    table.write_text("[[point]]\nbytes = 10\n")
    line = _main_error(capsys, "--allreduce-table", str(table))
    assert str(table) in line and "point" in line


def test_latency_table_interpolates():
    from harness.tpot.allreduce import LatencyTable

    t = LatencyTable("t", (1000, 2000), (10.0, 20.0))
    assert (t.us(500), t.us(1500), t.us(4000)) == (10.0, 15.0, 40.0)


def test_gpu_scripts_parse_on_cpu():
    """The evidence script passes shellcheck and the TP2 script's argument parser loads (both need GPUs to run)."""
    import shutil

    help_proc = subprocess.run([sys.executable, "-m", "ci.experiments.tp2_allreduce", "--help"], capture_output=True, text=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=HANG_GUARD_S)
    assert help_proc.returncode == 0 and "--layers" in help_proc.stdout, help_proc.stderr
    checker = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(checker).exists():
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run([checker, "ci/experiments/tpot_h200/run.sh"], capture_output=True, text=True, cwd=ROOT, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stdout


def test_tpot_json_says_where_the_time_goes_and_the_memory_plan(results):
    from harness.tpot.step import PARTS

    rows = json.loads(results.read_text())["rows"]
    detail = next(r["detail"] for r in rows if r["metric"] == "tpot_ms")
    bd = detail["breakdown"]
    assert set(bd["parts"]) == set(PARTS) and bd["sum_ms"] > 0 and "each component alone" in bd["how"]
    by = {r["metric"]: r["value"] for r in rows if r["strategy"] == "gather_cast"}
    floors = sum(p["floor_bytes"] for p in bd["parts"].values())
    assert floors == by["step_weight_bytes"] + by["step_kv_bytes"] + by["step_cast_bytes"]  # the floors split the roofline's bytes
    assert detail["memory_plan"].startswith("gather_cast:")


def _breakdown_text(rows) -> str:
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from harness.tpot.cli import _breakdown_tables

    console = Console(record=True, width=300, file=io.StringIO())
    for table in _breakdown_tables([SimpleNamespace(**r) for r in rows]):
        console.print(table)
    return " ".join(console.export_text().split())  # a title wrapped to its table's width, on one line


def test_cpu_breakdown_says_its_parts_do_not_add_up_to_tpot(results, tmp_path):
    """On CPU each part is the host wall time of its own run of the whole forward loop: the console and the report
    printed each as a share of TPOT (summing past 100%) beside an 'unattributed' rest, as if the parts split it; they
    say how the parts were timed and print neither. Twin: CUDA's parts (graphs of their kernels alone) keep both."""
    rows = json.loads(results.read_text())["rows"]
    cpu = _breakdown_text(rows)
    assert "do not add up to TPOT" in cpu and "%" not in cpu and "unattributed" not in cpu, cpu
    assert harness(str(results), "--out", str(tmp_path / "r"), module="harness.tpot.report").returncode == 0
    md = (tmp_path / "r" / "tpot.md").read_text().split("Where the time goes (gather_cast")[1].split("\n\n", 2)
    assert "do not add up to TPOT" in md[0] and "%" not in md[1] and "unattributed" not in md[1], md
    bd = next(r["detail"]["breakdown"] for r in rows if r["metric"] == "tpot_ms")
    cuda = _breakdown_text([{"strategy": "s", "metric": "tpot_ms", "detail": {"breakdown": {**bd, "parts_add_up": True}}}])
    assert "unattributed" in cuda and "%" in cuda, cuda


def test_default_allreduce_table_is_the_committed_h200_tp2_measurement():
    from harness.tpot.allreduce import DEFAULT_TABLE, load_table

    default, measured = load_table(DEFAULT_TABLE), load_table(ROOT / "suites/fixtures/allreduce_h200_tp2_measured.toml")
    assert (default.sizes, default.micros) == (measured.sizes, measured.micros) and "TP2" in default.source
    assert 9 < default.us(32 * 6144 * 2) < 20  # a b32 GLM-5 message: ~11 us


def test_allreduce_model_adds_its_latency_to_the_roofline():
    from harness.tpot.allreduce import AllReduce, LatencyAllReduce, LatencyTable

    lat = object.__new__(LatencyAllReduce)  # no GPU: skip the spin-kernel calibration
    lat.table, lat.default = LatencyTable("t", (1000, 2000), (10.0, 20.0)), True
    assert lat.model_ms(1, 750, 78) == 2 * 78 * 15.0 / 1e3 and "default one-GPU model" in lat.describe()
    assert AllReduce().model_ms(1, 750, 78) == 0.0


def test_tpot_allreduce_none_is_accepted_and_a_missing_table_is_one_error_line(capsys, tmp_path):
    from harness.cli import main

    assert main(["tpot", *SMALL, "--strategy", "native_fp8", "--layers", "1", "--no-breakdown", "--allreduce-table", "none"]) == 0
    capsys.readouterr()
    line = _main_error(capsys, "--allreduce-table", str(tmp_path / "missing.toml"))
    assert "missing.toml" in line


def _corrupt(results, tmp_path, name, edit):
    doc = json.loads(results.read_text())
    edit(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _tpot_details(doc):
    return [r["detail"] for r in doc["rows"] if r["metric"] == "tpot_ms"]


@pytest.mark.parametrize("edit, fragment", [
    (lambda doc: doc["case"].update(command="run"), "case.command"),  # a `harness run` file: not silently left out
    (lambda doc: [r.update(detail=None) for r in doc["rows"] if r["metric"] == "tpot_ms"], "detail"),
    (lambda doc: [d.update(kernels=None) for d in _tpot_details(doc)], "kernels"),
    (lambda doc: [d.update(pool_bytes="big") for d in _tpot_details(doc)], "pool_bytes"),
    (lambda doc: [d.update(breakdown={"x": 1}) for d in _tpot_details(doc)], "breakdown"),
    (lambda doc: [d["breakdown"].update(tpot_ms=0) for d in _tpot_details(doc)], "tpot_ms"),
    (lambda doc: [r["detail"].pop("ratio") for r in doc["rows"] if r["metric"] == "rotation_check"], "ratio"),
    # read as compare reads it (before: a value in µs shown under "TPOT ms", exit 0)
    (lambda doc: [r.update(unit="us") for r in doc["rows"] if r["metric"] == "tpot_ms"], "gather_cast/tpot_ms.unit: 'us'"),
])
def test_report_refuses_a_file_it_cannot_render_naming_the_field(results, tmp_path, edit, fragment):
    """A results file the TPOT report cannot read (a `run` file, a tpot row's detail of other types) is one error line
    naming the file and the field, exit 2, nothing written (a run file was left out and the report said nothing;
    the details raised StopIteration, AttributeError, KeyError, TypeError, ZeroDivisionError); twin: the fixture renders."""
    bad = _corrupt(results, tmp_path, "bad.json", edit)
    proc = harness(str(results), str(bad), "--out", str(tmp_path / "r"), module="harness.tpot.report")
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and line.startswith(f"error: {bad}") and fragment in line, proc.stderr[-800:]
    assert not (tmp_path / "r").exists()
    assert harness(str(results), "--out", str(tmp_path / "ok"), module="harness.tpot.report").returncode == 0


NAN, INF = float("nan"), float("inf")


def _rotation_details(doc):
    return [r["detail"] for r in doc["rows"] if r["metric"] == "rotation_check"]


@pytest.mark.parametrize("edit, fragment", [
    (lambda doc: [d.clear() for d in _tpot_details(doc)], "TpotDetail schema: layers: missing"),  # was StopIteration
    (lambda doc: [d.update(eager_kernels={}) for d in _tpot_details(doc)], "`$.eager_kernels.kernel_ms`"),
    (lambda doc: [d.update(eager_kernels={"kernel_ms": 1.0, "launches": 3}) for d in _tpot_details(doc)], "`$.eager_kernels.top`"),
    (lambda doc: [d["breakdown"]["parts"]["gemm"].update(ms=NAN) for d in _tpot_details(doc)], "`$.breakdown.parts[...].ms`"),
    (lambda doc: [d["breakdown"]["parts"]["moe"].update(floor_ms=INF) for d in _tpot_details(doc)], "`$.breakdown.parts[...].floor_ms`"),
    (lambda doc: [d.update(pool_bytes=INF) for d in _tpot_details(doc)], "`$.pool_bytes`"),
    (lambda doc: [d.update(mean_active_experts=NAN) for d in _tpot_details(doc)], "`$.mean_active_experts`"),
    (lambda doc: [d.update(rotated_ms=NAN) for d in _rotation_details(doc)], "`$.rotated_ms`"),
])
def test_report_refuses_a_detail_it_cannot_render_in_one_line(results, tmp_path, capsys, edit, fragment):
    """A tpot_ms detail of {} (the schema took it: StopIteration), a profile or breakdown missing a field or holding
    NaN / inf (rendered as nan, inf): one line naming the file, rows[i].detail and the field, exit 2, nothing written.
    Twin: the fixture renders."""
    from harness.tpot.report import main as tpot_report

    bad = _corrupt(results, tmp_path, "bad.json", edit)
    assert tpot_report([str(bad), "--out", str(tmp_path / "r")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {bad}: rows[") and ".detail: does not match" in line and fragment in line, line
    assert not (tmp_path / "r").exists()
    assert tpot_report([str(results), "--out", str(tmp_path / "ok")]) == 0


def test_report_shows_a_failed_profile_as_its_error(results, tmp_path):
    """tpot records eager_kernels = {"error": ...} when torch.profiler fails: the report says so (before: KeyError
    'top', exit 1). Twin: a profile that ran shows its kernels."""
    from harness.tpot.report import render

    def profile(value):
        return _corrupt(results, tmp_path, "p.json", lambda doc: [d.update(eager_kernels=value) for d in _tpot_details(doc)])

    md = render([profile({"kernel_ms": None, "error": "RuntimeError: boom"})], None)[0]
    assert "(gather_cast, one eager step, torch.profiler): not profiled: RuntimeError: boom." in md, md
    md = render([profile({"kernel_ms": 1.5, "launches": 4, "top": [{"name": "k", "ms": 1.0, "count": 2}]})], None)[0]
    assert "(gather_cast, one eager step, torch.profiler): 1.50 ms in 4 kernel launches; top: k 1.00 ms x2." in md, md


TP2 = ROOT / "docs/evidence/tpot/tp2_check.json"


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(world=-3), "world"),
    (lambda d: d.update(world=1), "world"),
    (lambda d: d["allreduce_points"][0].update(bytes=-5), "allreduce_points[0].bytes"),
    (lambda d: d["allreduce_points"][0].update(us=NAN), "allreduce_points[0].us"),
    (lambda d: d["allreduce_points"][1].update(us=0), "allreduce_points[1].us"),
    (lambda d: d["step_checks"][0].update(nccl_ms=-INF), "step_checks[0].nccl_ms"),
    (lambda d: d["step_checks"][1].update(modeled_over_nccl=INF), "step_checks[1].modeled_over_nccl"),
    (lambda d: d["step_checks"][0].update(layers=0), "step_checks[0].layers"),
])
def test_report_refuses_a_tp2_check_out_of_bounds(results, tmp_path, capsys, edit, field):
    """--tp2 took world -3, bytes -5, us NaN, nccl_ms -inf and rendered them (exit 0): one line naming the file and
    the field, exit 2, nothing written. Twin: the committed evidence file renders."""
    from harness.tpot.report import main as tpot_report

    doc = json.loads(TP2.read_text())
    edit(doc)
    bad = tmp_path / "tp2.json"
    bad.write_text(json.dumps(doc))
    assert tpot_report([str(results), "--tp2", str(bad), "--out", str(tmp_path / "r")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {bad}: does not match the TP2Check schema") and line.endswith(f"`$.{field}`"), line
    assert not (tmp_path / "r").exists()
    assert tpot_report([str(results), "--tp2", str(TP2), "--out", str(tmp_path / "ok")]) == 0


@pytest.mark.parametrize("name", ["tpot.md", "tpot.png"])
def test_report_force_never_writes_through_a_link_in_out(results, tmp_path, name):
    """--force replaces tpot.md / tpot.png in --out; a link there (to a file elsewhere) is refused before any work,
    the file it leads to kept, as `harness report` does (before: --force wrote the report over the linked file)."""
    precious, out = tmp_path / "precious.txt", tmp_path / "out"
    precious.write_text("mine")
    out.mkdir()
    os.symlink(precious, out / name)
    proc = harness(str(results), "--out", str(out), "--force", module="harness.tpot.report")
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and line.startswith("error: --out: ") and name in line and "is a link to" in line, proc.stderr
    assert proc.stdout == "" and precious.read_text() == "mine" and os.listdir(out) == [name]
    os.unlink(out / name)  # twin: without the link, --force writes the report
    assert harness(str(results), "--out", str(out), "--force", module="harness.tpot.report").returncode == 0
    assert (out / "tpot.md").is_file() and not (out / name).is_symlink()


def test_report_without_matplotlib_leaves_no_earlier_plot_beside_the_new_table(results, tmp_path, monkeypatch, capsys):
    """Without matplotlib, --force wrote a new tpot.md beside the OLD tpot.png, a plot of other data. Now --force removes
    it (the run says so); without --force the earlier plot already refuses the run, exit 2, nothing written or removed."""
    from harness.tpot.report import main as tpot_report

    out = tmp_path / "out"
    out.mkdir()
    (out / "tpot.png").write_bytes(b"\x89PNG an earlier plot")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    assert tpot_report([str(results), "--out", str(out)]) == 2
    assert os.listdir(out) == ["tpot.png"]
    assert tpot_report([str(results), "--out", str(out), "--force"]) == 0
    assert os.listdir(out) == ["tpot.md"] and "the earlier tpot.png removed" in capsys.readouterr().out


def test_tpot_check_rotation_plans_the_distinct_weights(capsys, monkeypatch):
    """--check-rotation allocates a second weight set (every layer distinct) the memory plan left out: on a GPU it could
    run out of memory mid-run. Now the plan names it, refused before any allocation; twin: without it, no such item."""
    from harness.tpot import tpot

    real = tpot.case_memory_plan
    monkeypatch.setattr(tpot, "case_memory_plan", lambda *a: real(*a).check("cpu", available=0))  # no room for tpot's plan
    args = ("--layers", "2", "--weight-sets", "1", "--strategy", "stock")
    line = _main_error(capsys, *args, "--check-rotation")
    assert line.startswith("error: memory plan: needs ") and "distinct weights (2 sets: --check-rotation)" in line, line
    assert "distinct weights" not in _main_error(capsys, *args)


def test_tpot_asks_each_strategy_once_whether_it_runs_here(monkeypatch, tmp_path):
    """cli and build_context each asked every strategy's unsupported_reason (a probe for some): now build_context's answer
    is the run's. Twin: the unsupported one is still recorded as such."""
    from harness.cli import main
    from harness.strategies import REGISTRY

    calls, reals = [], {name: REGISTRY[name].unsupported_reason.__func__ for name in ("stock", "stock_vectorized")}
    for name, real in reals.items():  # each read before any is wrapped: one may inherit the other's
        monkeypatch.setattr(REGISTRY[name], "unsupported_reason",
                            classmethod(lambda cls, device, backend, real=real: calls.append(cls.name) or real(cls, device, backend)))
    out = tmp_path / "r.json"
    assert main(["tpot", *SMALL, "--layers", "1", "--no-breakdown", "--strategy", "stock_vectorized", "--strategy", "stock",
                 "--json", str(out)]) == 0
    assert sorted(calls) == ["stock", "stock_vectorized"], calls
    rows = json.loads(out.read_text())["rows"]
    assert [r["detail"]["unsupported"] for r in rows if r["metric"] == "tpot_ms" and r["value"] is None] == ["stock_vectorized runs on cuda only"]


def test_tpot_json_never_replaces_the_harness_model_or_allreduce_table(capsys):
    """The model shapes (models.toml) and the default all-reduce table are the run's own inputs: --json there is
    refused even with --force, the file as it was (before: models.toml was replaced by the results)."""
    from harness.tpot.allreduce import DEFAULT_TABLE
    from harness.tpot.config import MODELS_FILE

    for path in (MODELS_FILE, DEFAULT_TABLE):
        before = path.read_bytes()
        try:
            line = _main_error(capsys, "--strategy", "stock", "--json", str(path), "--force")
            assert "--json" in line and str(path) in line and path.read_bytes() == before
        finally:
            path.write_bytes(before)  # a failing run must not leave the checkout broken


def test_tpot_timing_is_a_progress_phase(tmp_path):
    """The per-strategy timing says how far it is (on a GPU it runs minutes; before: silent from the header to the table),
    as `run`'s does; off a terminal, its last progress line."""
    proc = harness("tpot", *SMALL, "--layers", "1", "--no-breakdown", "--strategy", "stock", "--strategy", "gather_cast")
    assert proc.returncode == 0, proc.stderr
    assert "timing 2 strategies, 1 samples each: 2/2 in" in proc.stdout, proc.stdout


def test_tpot_check_rotation_times_the_first_strategy_that_runs_here(tmp_path, capsys):
    """stock_vectorized (CUDA only) named first: the rotation check times stock, the first that runs (before: it timed
    the unsupported one, a Triton traceback, exit 1); with none that runs it is one line, exit 2, nothing written."""
    from harness.cli import main

    out = tmp_path / "r.json"
    assert main(["tpot", *SMALL, "--layers", "2", "--weight-sets", "1", "--no-breakdown", "--strategy", "stock_vectorized",
                 "--strategy", "stock", "--check-rotation", "--json", str(out)]) == 0
    (rotation,) = [r for r in json.loads(out.read_text())["rows"] if r["metric"] == "rotation_check"]
    assert rotation["strategy"] == "stock" and rotation["detail"]["strategy"] == "stock"
    line = _main_error(capsys, "--layers", "2", "--weight-sets", "1", "--strategy", "stock_vectorized", "--check-rotation",
                       "--json", str(tmp_path / "n.json"))
    assert line.startswith("error: --check-rotation") and "stock_vectorized" in line and not (tmp_path / "n.json").exists()


def test_tpot_check_rotation_that_would_time_one_workload_twice_is_refused(tmp_path, capsys):
    """--check-rotation where the weight sets already give every layer its own (the default 4 over the ci scale's 2
    layers): rotated and distinct would be one workload, a check that cannot fail; one line naming --check-rotation and
    --weight-sets, exit 2, nothing timed or written (before: both timed, their ratio recorded as the check).
    Twin: --weight-sets 1 over 2 layers runs (the test above)."""
    out = tmp_path / "r.json"
    line = _main_error(capsys, "--layers", "2", "--no-breakdown", "--strategy", "stock", "--check-rotation", "--json", str(out))
    assert line.startswith("error: --check-rotation") and "--weight-sets 4 over 2 layer(s)" in line and not out.exists(), line


def test_tpot_json_to_stdout_is_json_alone(tmp_path):
    """`--json /dev/stdout` (or a link to it) into a pipe: stdout holds the results JSON alone, the table and progress go
    to stderr (before: both on stdout, which no JSON reader could parse); export-inputs' bundle likewise."""
    proc = harness("tpot", *SMALL, "--layers", "1", "--no-breakdown", "--strategy", "stock", "--json", "/dev/stdout")
    assert proc.returncode == 0, proc.stderr
    assert {r["metric"] for r in json.loads(proc.stdout)["rows"]} >= {"tpot_ms"}
    assert "timing 1 strategies" in proc.stderr and "results written to /dev/stdout" in proc.stderr
    link = tmp_path / "bundle.safetensors"
    link.symlink_to("/dev/stdout")
    proc = subprocess.run([sys.executable, "-m", "harness", "export-inputs", "--device", "cpu", "--out", str(link)], capture_output=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=HANG_GUARD_S)
    assert proc.returncode == 0 and f"wrote {link}".encode() in proc.stderr, proc.stderr
    from safetensors.torch import load

    assert "kv_indices" in load(proc.stdout)


def test_tpot_that_times_nothing_requested_fails(tmp_path):
    """Every strategy named unsupported here (stock_vectorized on CPU): exit 1 naming why, as `run`'s 'nothing requested
    was checked' (before: exit 0 with a results file of null rows). Twin: with stock beside it, exit 0."""
    out = tmp_path / "r.json"
    proc = harness("tpot", *SMALL, "--layers", "1", "--no-breakdown", "--strategy", "stock_vectorized", "--json", str(out))
    assert proc.returncode == 1 and proc.stderr.strip() == "FAIL: nothing requested was timed: stock_vectorized runs on cuda only", proc.stderr
    assert [r["value"] for r in json.loads(out.read_text())["rows"] if r["metric"] == "tpot_ms"] == [None]  # written, as run writes it
    proc = harness("tpot", *SMALL, "--layers", "1", "--no-breakdown", "--strategy", "stock_vectorized", "--strategy", "stock")
    assert proc.returncode == 0, proc.stderr


def test_tpot_says_when_the_cpu_pool_grows_to_fit_the_scenario(tmp_path):
    """A scenario larger than the CI pool: tpot times a grown pool and says so, as run and export-inputs do (before:
    silent, the header naming the ci case as if at its 16,384 slots)."""
    scenario = tmp_path / "long.toml"
    scenario.write_text('name = "long"\nseed = 1\nsteps = 1\nbatch_size = 1\nkv_len = 20000\n')
    proc = harness("tpot", "--device", "cpu", "--shrink", "--layers", "1", "--repeats", "1", "--no-breakdown", "--strategy", "gather_cast",
                   "--scenario-file", str(scenario))
    assert proc.returncode == 0, proc.stderr
    assert "long needs 20,032 slots: the ci pool grows to 20,032 (--slots 20032)" in proc.stdout, proc.stdout


def _row_of(md: str, name: str) -> list[str]:
    (line,) = [x for x in md.splitlines() if x.startswith(f"| {name} |")]
    return [c.strip() for c in line.strip("|").split("|")]


def test_report_and_console_give_no_total_of_a_null_or_missing_byte_row(results, tmp_path):
    """A null step_cast_bytes and a missing step_kv_bytes are not 0 B: '-' there and no total (before: '0.00' each,
    added into the total as if measured), in the report and the console table. Twin: the whole file sums."""
    from types import SimpleNamespace

    from harness.tpot.cli import _table
    from harness.tpot.report import render

    def edit(doc):
        doc["rows"] = [r for r in doc["rows"] if r["metric"] != "step_kv_bytes"]
        [r.update(value=None) for r in doc["rows"] if r["metric"] == "step_cast_bytes"]

    bad = _corrupt(results, tmp_path, "bad.json", edit)
    moved = _row_of(render([bad], None)[0], "gather_cast")[6]
    assert moved.startswith("- (") and moved.endswith(" + - + -)") and "0.00" not in moved, moved
    assert _row_of(render([results], None)[0], "gather_cast")[6][0].isdigit()
    doc = json.loads(bad.read_text())
    table = _table([SimpleNamespace(**r) for r in doc["rows"]])
    assert list(table.columns[-1].cells) == ["-"]


def test_report_never_merges_two_files_that_share_a_name(results, tmp_path):
    """d2/t.json and d3/t.json (another commit, another device): one section each, named by its path (before: keyed by
    the file name, one section mixing both, the first file's rows replaced by the second's). Twin: one file, one section."""
    from harness.tpot.report import render

    (tmp_path / "d2").mkdir(), (tmp_path / "d3").mkdir()
    a = _corrupt(results, tmp_path / "d2", "t.json", lambda doc: None)
    b = _corrupt(results, tmp_path / "d3", "t.json", lambda doc: doc["environment"].update(git_commit="0" * 40))
    md, bars = render([a, b], None)
    titles = [x for x in md.splitlines() if x.startswith("## ")]
    assert len(titles) == 2 and titles[0].endswith(f"({a})") and titles[1].endswith(f"({b})"), titles
    assert [list(case_bars) for _, case_bars in bars] == [["gather_cast"], ["gather_cast"]]
    assert len([x for x in render([a], None)[0].splitlines() if x.startswith("## ")]) == 1


def _cuda(doc):
    """The document as a CUDA run would write it: a device, and an attention share beside its timings."""
    doc["environment"]["device"] = "cuda:0"
    rows = {(r["strategy"], r["metric"]): r for r in doc["rows"]}
    for (name, metric), r in rows.items():
        if metric == "attn_share":
            r.update(value=rows[(name, "attn_path_ms")]["value"] / rows[(name, "tpot_ms")]["value"], unit="ratio", detail=None)


def test_attention_share_is_shown_only_where_the_doc_calls_it_one(results, tmp_path):
    """On CPU attn_path_ms and tpot_ms are host times of separate runs, as the breakdown's parts are (docs/tpot.md: no
    share of TPOT there): the row is null with the reason, the console, the report and the plot give no share or split
    (before: '134%', the plot clipping the attention bar to TPOT); a CPU file with a share (written before) is not shown
    one either, and compare takes the null rows. Twin: the same file as a CUDA run's shows the share and splits the bar."""
    from types import SimpleNamespace

    from harness.tpot.cli import _table
    from harness.tpot.report import render

    doc = json.loads(results.read_text())
    table = _table([SimpleNamespace(**r) for r in doc["rows"]])
    assert list(table.columns[3].cells) == ["-"]
    md, bars = render([results], None)
    assert _row_of(md, "gather_cast")[3] == "-" and bars[0][1]["gather_cast"][0] is None
    old = _corrupt(results, tmp_path, "old.json", lambda d: [r.update(value=1.34, unit="ratio", detail=None)
                                                               for r in d["rows"] if r["metric"] == "attn_share"])
    md, bars = render([old], None)
    assert _row_of(md, "gather_cast")[3] == "-" and bars[0][1]["gather_cast"][0] is None
    head = tmp_path / "head.json"
    head.write_text(json.dumps(another_run(doc)))
    proc = harness("compare", str(old), str(head))  # a base with the old share, a head without: not gated
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cuda = _corrupt(results, tmp_path, "cuda.json", _cuda)
    md, bars = render([cuda], None)
    rows = {(r["strategy"], r["metric"]): r["value"] for r in json.loads(cuda.read_text())["rows"]}
    attn, tpot = rows[("gather_cast", "attn_path_ms")], rows[("gather_cast", "tpot_ms")]
    assert _row_of(md, "gather_cast")[3] == f"{attn / tpot:.0%}"
    assert bars[0][1]["gather_cast"] == ((attn, tpot - attn) if attn <= tpot else (None, tpot))


def test_tpot_repro_pins_the_defaults_that_depend_on_the_machine(tmp_path):
    """--device, --scale, --slots, --backend, --repeats and the all-reduce default differ between CUDA and CPU: the
    recorded repro pins them as this run resolved them, as `run`'s does (before: argv as typed, a GPU rerun of a CPU
    file timed another case). Twin: the repro, rerun, records the same case and itself again."""
    out = tmp_path / "r.json"
    proc = harness("tpot", "--shrink", "--layers", "1", "--scenario", "b1-l500", "--no-breakdown", "--strategy", "stock",
                   "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    args = repro_words(doc["repro"])[1]
    pinned = dict(zip(args[-12::2], args[-11::2]))
    assert pinned == {"--device": "cpu", "--scale": "ci", "--slots": str(doc["case"]["slots"]), "--backend": "torch",
                      "--repeats": "3", "--allreduce-table": "none"}, args
    again = tmp_path / "again.json"
    proc = harness(*[str(again) if a == str(out) else a for a in args])
    assert proc.returncode == 0, proc.stderr
    rerun = json.loads(again.read_text())
    assert rerun["case"] == doc["case"] and repro_words(rerun["repro"])[1][-12:] == args[-12:]


def test_tpot_repro_pins_the_backend_family_the_command_line_takes(tmp_path, monkeypatch):
    """A backend named with the kernel its GPU chose ("flashinfer-fa3", here a torch backend renamed "torch-k") is
    recorded as it ran, and the repro pins its family, which `--backend` takes (before: the full name, which every
    GPU repro refused as an unknown backend)."""
    from harness.backends import BACKENDS
    from harness.backends.torch_backend import TorchBackend
    from harness.cli import main

    monkeypatch.setattr(TorchBackend, "name", "torch-k")
    out = tmp_path / "r.json"
    assert main(["tpot", "--shrink", "--layers", "1", "--scenario", "b1-l500", "--no-breakdown", "--strategy", "stock",
                 "--repeats", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    args = repro_words(doc["repro"])[1]
    assert doc["case"]["backend"] == "torch-k" and args[args.index("--backend") + 1] == "torch" in BACKENDS


def test_report_prints_small_sizes_and_the_control_honestly(results, tmp_path):
    """A 2.4 MB pool is not 'pool 0.0 GB' (two significant digits where the fixed decimals would print 0, as
    harness report does); the control row is its measured copy bandwidth, not a strategy 'not measured'. Twin: a
    size the decimals show keeps them."""
    from harness.tpot.report import _fmt, render

    md = render([results], None)[0]
    doc = json.loads(results.read_text())
    pool = _tpot_details(doc)[0]["pool_bytes"]
    (copy,) = [r["value"] for r in doc["rows"] if r["metric"] == "control_copy_gbps"]
    assert 0 < pool < 5e7 and f"pool {pool / 1e9:.2g} GB" in md and "pool 0.0 GB" not in md, md
    assert "| control |" not in md and f"Control copy {copy:.1f} GB/s" in md
    assert (_fmt(0.004, ".0%"), _fmt(0.5, ".0%"), _fmt(0.0, ".2f"), _fmt(1.234, ".2f"), _fmt(None, ".2f")) == ("0.4%", "50%", "0.00", "1.23", "-")
