"""`harness.gate.compare`: regression gate over two results JSON files (written by the real writer)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.errors import HarnessError
from harness.gate.compare import compare_results, load_results, main_compare, parse_factor
from harness.results.document import Case, Row, document, write_results
from harness.results.schema import SCHEMA, SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, sample_iqr
from suites.helpers import nudged

ENV = {"gpu": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0", "git_commit": "abc", "hostname": "ci", "device": "cuda:0"}
CASE = dict(preset="glm5-tp8", scale="prod", scenario="b1-l4096", backend="flashinfer-fa3")
RECORD = Case(command="run", **CASE, slots=495_552, layers=78, kernel="auto", workload="0" * 64, workload_v4=None)
TPOT_RECORD = Case(command="tpot", **CASE, slots=495_552, layers=78, kernel="auto", workload="0" * 64, workload_v4=None)


def _samples(median: float, spread: float = 0.01, n: int = 40, seed: int = 0) -> list[float]:
    """n timing samples around `median` with IQR/median about 1.35 * spread."""
    rng = np.random.default_rng(seed)
    values = median * (1 + spread * rng.standard_normal(n))
    return list(values * median / np.median(values))


def _timed(strategy: str, metric: str, median: float, spread: float = 0.01, seed: int = 0, **extra) -> Row:
    samples = _samples(median, spread, seed=seed)
    return Row(**CASE, strategy=strategy, metric=metric, value=float(np.median(samples)),
               iqr=sample_iqr(samples), samples=samples, **extra)


def _rows(cast_us: float = 10.4, verdict: str = "pass", spread: float = 0.01, seed: int = 0,
          control: float = 3000.0) -> list[Row]:
    return [
        _timed("gather_cast", "cast_us", cast_us, spread, seed),
        Row(**CASE, strategy="gather_cast", metric="verdict", value=verdict),
        Row(**CASE, strategy="gather_cast", metric="extra_bytes", value=4718592),
        _timed("stock", "cast_us", 866.0, 0.01, seed + 1),
        _timed("stock", "cast_gbps", 990.0, 0.01, seed + 2),
        Row(**CASE, strategy="stock", metric="verdict", value="pass"),
        _timed("control", "control_copy_gbps", control, 0.005, seed + 3),
    ]


@pytest.fixture
def write(tmp_path):
    """Write rows as the results file of a run of their own: the k-th file's slowest sample of its first timing
    k ulps slower (medians unchanged), since `compare` refuses two files whose timings are all equal (one run)."""
    written = []

    def _write(name: str, rows: list[Row], env=ENV, case: Case = RECORD):
        path = tmp_path / name
        written.append(path)
        write_results(path, rows, env, f"python -m harness {case.command} --scenario b1-l4096", case)
        path.write_text(json.dumps(nudged(json.loads(path.read_text()), len(written))))
        return path

    return _write


@pytest.fixture
def write_tpot(write):
    """`write` of a `harness tpot` file (its case record says so: tpot's metrics are no `run` file's rows)."""
    return lambda name, rows, env=ENV: write(name, rows, env, TPOT_RECORD)


def _doc(rows: list[Row], env=ENV, case: Case = RECORD) -> dict:
    return document(rows, env, "python -m harness run --scenario b1-l4096", case)


def _change(comparison, strategy: str, metric: str):
    (change,) = [c for c in comparison.changes if c.key[3] == strategy and c.key[5] == metric]
    return change


def _status(comparison, strategy: str, metric: str) -> str:
    return _change(comparison, strategy, metric).status


@pytest.mark.parametrize("text, expected", [("10%", 0.10), ("0.10", 0.10), (0.1, 0.1), ("99.9%", 0.999), ("0.01%", 1e-4)])
def test_parse_factor(text, expected):
    assert parse_factor(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["abc", "-5%", "1.10", "nan%", "", "0%", "0", "100%", "150%", "inf%"])
def test_parse_factor_rejects(text):
    with pytest.raises(HarnessError, match="--max-regression"):
        parse_factor(text)


def test_planted_slowdown_exits_1(write, capsys):
    base = write("base.json", _rows(cast_us=10.4))
    head = write("head.json", _rows(cast_us=10.4 * 1.20, seed=7))
    assert main_compare(base, head, "5%") == 1
    out = capsys.readouterr().out
    assert "gather_cast" in out and "cast_us" in out and "regressed" in out and "1.200x" in out
    assert "REGRESSION" in out and "MDE" in out


def test_same_commit_exits_0(write, capsys):
    base = write("base.json", _rows(seed=0))
    head = write("head.json", _rows(seed=100))  # other samples of the same distribution
    assert main_compare(base, head, "5%") == 0
    out = capsys.readouterr().out
    assert "REGRESSION" not in out and "INCONCLUSIVE" not in out and "7 rows (5 gating): 7 unchanged" in out


def test_slowdown_within_tolerance_is_slower_not_a_regression(write, capsys):
    base = write("base.json", _rows(cast_us=100.0))
    head = write("head.json", _rows(cast_us=102.5, seed=3))  # 2.5%: clearly slower, clearly under 5%
    assert main_compare(base, head, "5%") == 0
    assert "slower" in capsys.readouterr().out
    assert main_compare(base, head, "1%") == 1


def test_straddling_change_is_inconclusive_with_its_mde(write, capsys):
    base = write("base.json", _rows(cast_us=100.0, spread=0.03))
    head = write("head.json", _rows(cast_us=105.0, spread=0.03, seed=5))  # 5% change, 5% tolerance
    comparison = compare_results(load_results(base), load_results(head), 0.05)
    change = _change(comparison, "gather_cast", "cast_us")
    assert change.status == "inconclusive" and change.gating
    assert 0 < change.decision.mde <= 0.05
    assert main_compare(base, head, "5%") == 0
    out = capsys.readouterr().out
    assert "INCONCLUSIVE: 1 gating metric(s)" in out and "does not fail the gate" in out and "noisy" not in out
    assert main_compare(base, head, "5%", inconclusive="fail") == 1
    assert "fails the gate (--inconclusive fail)" in capsys.readouterr().out


def test_bad_inconclusive_policy_exits_2(write, capsys):
    good = write("good.json", _rows())
    assert main_compare(good, good, "5%", inconclusive="maybe") == 2
    assert "--inconclusive" in capsys.readouterr().err


def test_doubling_inside_a_wide_spread_is_never_silently_passed():
    """The old rule called a 2x change 'noisy' when the IQRs were wide; now it is judged by its interval."""
    comparison = compare_results(_doc(_rows(cast_us=10.0, spread=0.30)), _doc(_rows(cast_us=20.0, spread=0.30, seed=9)), 0.05)
    assert _status(comparison, "gather_cast", "cast_us") in ("regressed", "inconclusive")


def test_too_few_samples_cannot_be_judged(write, capsys):
    """A 1.9x slowdown with 3 (or no) samples on a side is exit 2 naming the row and the counts, not a pass
    under --inconclusive pass (repro r05); the twin with 5 samples a side regresses."""
    for base_samples, head_samples, counts in (([10.4] * 3, [20.0] * 3, "3 vs 3"), ([10.4] * 40, [], "40 vs 1")):
        base, head = _rows(), _rows(cast_us=20.0)
        base[0].samples, head[0].samples = base_samples, head_samples
        base[0].iqr, head[0].iqr = sample_iqr(base_samples), sample_iqr(head_samples)
        change = _change(compare_results(_doc(base), _doc(head), 0.05), "gather_cast", "cast_us")
        assert change.status == "undersampled" and "too few samples" in change.note
        assert main_compare(write("base.json", base), write("head.json", head), "5%") == 2
        out = capsys.readouterr().out
        assert f"TOO FEW SAMPLES: gather_cast/cast_us ({counts}); the rule needs 5 samples on each side" in out
        said = " ".join(out.split())
        assert "re-run with --repeats >= 5, or tpot --engine sglang with --sglang-output-len >= 6;" in said
        assert "CANNOT JUDGE (exit 2)" in said
    base, head = _rows(), _rows(cast_us=20.0)
    base[0].samples, head[0].samples = [10.4] * 5, [20.0] * 5
    base[0].iqr = head[0].iqr = 0.0
    assert main_compare(write("base.json", base), write("head.json", head), "5%") == 1


def test_too_few_samples_at_the_bases_median_cannot_be_judged(write, capsys):
    """One head sample equal to the base's median was `unchanged` (exit 0) while one 1.0001x off was undersampled."""
    base = _rows()
    for value in (base[0].value, base[0].value * 1.0001):
        head = _rows()
        head[0] = Row(**CASE, strategy="gather_cast", metric="cast_us", value=value, samples=[value])
        assert main_compare(write("base.json", base), write("head.json", head), "5%") == 2
        assert "TOO FEW SAMPLES: gather_cast/cast_us (40 vs 1)" in capsys.readouterr().out


def test_informational_metric_never_gates():
    base, head = _rows(), _rows()
    head[4] = _timed("stock", "cast_gbps", 500.0, 0.01, 4)  # halved, but cast_gbps is informational
    comparison = compare_results(_doc(base), _doc(head), 0.05)
    change = _change(comparison, "stock", "cast_gbps")
    assert change.status == "worse" and not change.gating  # never the gating word
    assert comparison.exit_code == 0


def test_timed_metrics_do_not_gate_on_cpu():
    env = {**ENV, "gpu": None, "device": "cpu"}
    comparison = compare_results(_doc(_rows(), env), _doc(_rows(cast_us=30.0, seed=4), env), 0.05)
    assert _status(comparison, "gather_cast", "cast_us") == "worse"
    assert not _change(comparison, "gather_cast", "cast_us").gating
    assert comparison.exit_code == 0
    assert _change(comparison, "gather_cast", "verdict").gating  # verdicts gate everywhere


def test_pass_to_fail_exits_1(write, capsys):
    base = write("base.json", _rows(verdict="pass"))
    head = write("head.json", _rows(verdict="fail"))
    assert main_compare(base, head, "5%") == 1
    out = capsys.readouterr().out
    assert "failing" in out and "REGRESSION" in out and "gather_cast/verdict failing" in out


@pytest.mark.parametrize("b, h, status, code", [
    ("pass", "error", "failing", 1), ("pass", "fail", "failing", 1), ("pass", "unsupported", "failing", 1),
    ("fail", "fail", "failing", 1), ("error", "fail", "failing", 1), ("fail", "error", "failing", 1),  # still failing
    ("fail", "pass", "fixed", 0), ("error", "pass", "fixed", 0), ("unsupported", "pass", "changed", 0),
    ("fail", "unsupported", "failing", 1), ("error", "unsupported", "failing", 1), ("pass", "pass", "unchanged", 0), ("unsupported", "unsupported", "unchanged", 0),
])
def test_verdict_transitions(b, h, status, code):
    comparison = compare_results(_doc(_rows(verdict=b)), _doc(_rows(verdict=h)), 0.1)
    assert _status(comparison, "gather_cast", "verdict") == status and comparison.exit_code == code


def test_direction_of_better_comes_from_the_metric_table():
    base, head = _rows(), _rows()
    head[4] = _timed("stock", "cast_gbps", 800.0, 0.01, 5)
    head[3] = _timed("stock", "cast_us", 226.0, 0.01, 6)
    comparison = compare_results(_doc(base), _doc(head), 0.10)
    assert _status(comparison, "stock", "cast_gbps") == "worse"  # higher is better: 990 -> 800 is worse
    assert _status(comparison, "stock", "cast_us") == "improved"


def test_zero_base_growing_is_a_regression():
    base, head = _rows(), _rows()
    base[2] = Row(**CASE, strategy="gather_cast", metric="extra_bytes", value=0)
    comparison = compare_results(_doc(base), _doc(head), 0.10)
    change = _change(comparison, "gather_cast", "extra_bytes")
    assert change.status == "regressed" and change.ratio == float("inf") and change.gating
    assert comparison.exit_code == 1


def test_an_added_row_is_not_a_regression(write, capsys):
    base = write("base.json", _rows())
    extra = Row(**CASE, strategy="shadow", metric="verdict", value="pass")
    head = write("head.json", _rows() + [extra])
    assert main_compare(base, head, "5%") == 0
    out = capsys.readouterr().out
    assert "added" in out and "shadow" in out


def test_a_missing_informational_row_is_reported_not_failed(write, capsys):
    base = write("base.json", _rows())
    head = write("head.json", [r for r in _rows() if r.metric != "cast_gbps"])
    assert main_compare(base, head, "5%") == 0
    assert "missing" in capsys.readouterr().out


def test_undeclared_metric_in_a_file_is_reported_not_judged():
    base, head = _doc(_rows()), _doc(_rows())
    for doc, value in ((base, 1.0), (head, 9.0)):
        doc["rows"].append({**CASE, "strategy": "stock", "metric": "attn_tflops", "value": value, "unit": "TFLOP/s",
                            "better": "lower", "samples": []})
    comparison = compare_results(base, head, 0.05)
    change = _change(comparison, "stock", "attn_tflops")
    assert change.status == "undeclared" and not change.gating and comparison.exit_code == 0


# environment guard: the control measured in the same run


def test_differing_controls_cannot_judge_exit_2(write, capsys):
    base = write("base.json", _rows(cast_us=10.0, control=3000.0))
    head = write("head.json", _rows(cast_us=13.0, control=2000.0, seed=11))  # a throttled GPU: both slower
    assert main_compare(base, head, "5%") == 2
    out = capsys.readouterr().out
    assert "ENVIRONMENTS DIFFER" in out and "control control_copy_gbps" in out and "CANNOT JUDGE" in out
    assert "REGRESSION:" not in out


def test_matching_controls_let_the_regression_through(write):
    base = write("base.json", _rows(cast_us=10.0, control=3000.0))
    head = write("head.json", _rows(cast_us=13.0, control=3005.0, seed=11))
    assert main_compare(base, head, "5%") == 1


def test_verdict_regression_counts_even_when_environments_differ(write):
    base = write("base.json", _rows(control=3000.0))
    head = write("head.json", _rows(verdict="fail", control=1000.0, seed=2))
    assert main_compare(base, head, "5%") == 1


def test_other_gpu_is_another_environment():
    comparison = compare_results(_doc(_rows()), _doc(_rows(), {**ENV, "gpu": "NVIDIA H100"}), 0.05)
    assert "GPU NVIDIA H200 vs NVIDIA H100" in comparison.environment_differs and comparison.exit_code == 2


def test_a_control_in_one_file_only_cannot_judge(write, capsys):
    """Repro r11: a head (or base) without the control the other has cannot be judged on timings (was exit 0)."""
    with_control, without = write("with.json", _rows()), write("without.json", _rows(seed=3)[:-1])
    for base, head, side in ((without, with_control, "base"), (with_control, without, "head")):
        assert main_compare(base, head, "5%") == 2
        out = capsys.readouterr().out
        only = "head" if side == "base" else "base"
        assert f"ENVIRONMENTS DIFFER: control control_copy_gbps only in the {only}; CANNOT JUDGE (exit 2)" in out
        assert f"{side} carries no control_copy_gbps control" in out
    assert main_compare(without, write("neither.json", _rows(seed=5)[:-1]), "5%") == 0  # twin: in neither file
    out = capsys.readouterr().out
    assert "base carries no control_copy_gbps control" in out and "head carries no" in out


# clock guard: a disturbed timing block is reported, not compared, and cannot be judged


def test_disturbed_row_is_reported_not_compared_and_cannot_be_judged(write, capsys):
    """A head marked disturbed (here hiding a 2x slowdown) never passes: exit 2 whatever --inconclusive says."""
    head_rows = _rows(cast_us=20.0, seed=3)
    head_rows[0].detail = {"guard": {"disturbed": "SM clock 1980 -> 1410 MHz", "reruns": 1}}
    base = write("base.json", _rows())
    head = write("head.json", head_rows)
    comparison = compare_results(load_results(base), load_results(head), 0.05)
    change = _change(comparison, "gather_cast", "cast_us")
    assert change.status == "disturbed" and "SM clock" in change.note and comparison.exit_code == 2
    assert main_compare(base, head, "5%") == 2
    out = capsys.readouterr().out
    assert "DISTURBED: gather_cast/cast_us (clock guard: SM clock 1980 -> 1410 MHz)" in out and "CANNOT JUDGE (exit 2)" in out
    assert main_compare(base, head, "5%", inconclusive="fail") == 2


def test_undisturbed_guard_is_compared():
    head_rows = _rows(cast_us=20.0, seed=3)
    head_rows[0].detail = {"guard": {"disturbed": None, "reruns": 1}}
    assert _status(compare_results(_doc(_rows()), _doc(head_rows), 0.05), "gather_cast", "cast_us") == "regressed"


# bad input


@pytest.mark.parametrize(
    "content, field",
    [
        ("{not json", "not valid JSON"),
        ('{"schema": "other/9", "rows": []}', "schema"),
        ('{"schema": "mla-harness-results/1"}', "rows"),
        ('{"schema": "mla-harness-results/1", "rows": [{"preset": "p"}]}', "rows[0].scale"),
        ('[1, 2]', "top level"),
    ],
)
def test_malformed_exits_2_and_writes_nothing(write, tmp_path, capsys, content, field):
    good = write("good.json", _rows())
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main_compare(good, bad, "5%") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert str(bad) in line and field in line
    assert sorted(p.name for p in tmp_path.iterdir()) == before


NEWER = [(SCHEMA_V1, "case"), (SCHEMA_V2, "case.command"), (SCHEMA_V3, "case.workload"), (SCHEMA_V4, "case.workload_v4")]


@pytest.mark.parametrize("schema, field", NEWER)
def test_a_newer_file_relabelled_older_is_bad_input(write, capsys, schema, field):
    """Two version-5 files of other workloads relabelled /3 compared (exit 0: the upgrade dropped case.workload);
    relabelled /1, the error named case.layers. Twin: without the fields its version lacks, the file is upgraded."""
    paths = [write("base.json", _rows()), write("head.json", _rows())]
    for path, digest in zip(paths, ("a" * 64, "b" * 64)):
        doc = json.loads(path.read_text())
        path.write_text(json.dumps({**doc, "schema": schema, "case": {**doc["case"], "workload": digest}}))
    assert main_compare(*paths, "5%") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {paths[0]}: schema: {schema!r} has no {field} (")
    doc, lacks = json.loads(paths[0].read_text()), [f for _, f in NEWER[NEWER.index((schema, field)):]]
    older = {k: v for k, v in doc.items() if k != "case"} if field == "case" else {
        **doc, "case": {k: v for k, v in doc["case"].items() if f"case.{k}" not in lacks}}
    paths[0].write_text(json.dumps(older))
    assert load_results(paths[0]).schema == SCHEMA


@pytest.mark.parametrize("field, value", [("value", "fast"), ("samples", [1.0, "x"]), ("samples", 3), ("detail", [1])])
def test_bad_field_types_are_rejected(tmp_path, field, value):
    doc = _doc(_rows())
    doc["rows"][0][field] = value
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(HarnessError, match=rf"rows\[0\]\.{field}"):
        load_results(path)


def test_duplicate_rows_are_rejected(tmp_path):
    doc = _doc(_rows())
    doc["rows"].append(doc["rows"][0])
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(HarnessError, match="duplicate row"):
        load_results(path)


def test_missing_file_exits_2(write, tmp_path, capsys):
    good = write("good.json", _rows())
    assert main_compare(good, tmp_path / "absent.json", "5%") == 2
    assert "absent.json: no such file" in capsys.readouterr().err


def test_bad_factor_exits_2(write, capsys):
    good = write("good.json", _rows())
    assert main_compare(good, good, "ten") == 2
    assert "--max-regression" in capsys.readouterr().err


# pinned behaviours of the environment guard, the clock guard and the gating table
# (suites/test_mutations_gate.py plants a fault under each)


def test_a_rise_of_the_control_is_another_environment_as_a_drop_is(write, capsys):
    base = write("base.json", _rows(cast_us=10.0, control=3000.0))
    for control in (4000.0, 2000.0):  # a rise and its twin, a drop
        head = write("head.json", _rows(cast_us=13.0, control=control, seed=11))
        assert main_compare(base, head, "5%") == 2
        out = capsys.readouterr().out
        assert "ENVIRONMENTS DIFFER" in out and f"control control_copy_gbps 3000 -> {control:.0f} GB/s" in out


def test_the_control_counts_bytes_read_and_written(monkeypatch):
    """64 MiB copied in 1 ms is 64 MiB read + 64 MiB written: 134.2 GB/s; copy_bytes_per_ms halves it back."""
    import torch

    from harness.measure import control

    seen = []
    monkeypatch.setattr(control, "_copy_ms", lambda device, nbytes, repeats: seen.append(nbytes) or [1.0] * repeats)
    samples = control.measure_control(torch.device("cpu"))
    assert seen == [control.CPU_BYTES] == [64 << 20]
    assert samples.unit == "GB/s" and samples.median == pytest.approx(2 * (64 << 20) / 1e6)
    assert control.copy_bytes_per_ms(torch.device("cpu")) == pytest.approx((64 << 20) / 1.0)


def test_each_clock_is_compared_with_its_own_before_value():
    """The memory clock (2619 MHz) dropping 8% is a disturbance although it stays above the SM clock (1980)."""
    from harness.measure.clocks import GpuState, disturbance

    steady = GpuState(sm_mhz=1980, mem_mhz=2619, temperature_c=40, slowdown=(), processes=1)
    assert "memory clock 2619 -> 2400" in disturbance(steady, GpuState(1980, 2400, 40, (), 1))
    assert "SM clock 1980 -> 1800" in disturbance(steady, GpuState(1800, 2619, 40, (), 1))
    assert disturbance(steady, GpuState(1900, 2500, 40, (), 1)) is None  # twin: both within 5% of their own


def test_the_base_rows_guard_is_read_as_well_as_the_heads():
    base_rows = _rows()
    base_rows[0].detail = {"guard": {"disturbed": "memory clock 2619 -> 2400 MHz", "reruns": 1}}
    change = _change(compare_results(_doc(base_rows), _doc(_rows(cast_us=20.0, seed=3)), 0.05), "gather_cast", "cast_us")
    assert change.status == "disturbed" and "memory clock" in change.note


def test_peak_bytes_gates_on_cuda_only():
    def peak(value):
        return Row(**CASE, strategy="gather_cast", metric="peak_bytes", value=value)

    for env, gating, code in ((ENV, True, 1), ({**ENV, "gpu": None, "device": "cpu"}, False, 0)):
        comparison = compare_results(_doc(_rows() + [peak(1 << 30)], env), _doc(_rows() + [peak(2 << 30)], env), 0.05)
        change = _change(comparison, "gather_cast", "peak_bytes")
        assert change.gating is gating and comparison.exit_code == code
        assert change.status == ("regressed" if gating else "worse")


def test_only_a_throttle_that_started_during_the_block_disturbs_it():
    from harness.measure.clocks import GpuState, disturbance

    capped = GpuState(1980, 2619, 40, ("sw_power_cap",), 1)
    assert disturbance(capped, capped) is None  # capped before and after: the block ran under one state
    assert "throttling started: sw_thermal" in disturbance(capped, GpuState(1980, 2619, 40, ("sw_power_cap", "sw_thermal"), 1))


def test_an_exact_metric_within_the_tolerance_is_changed_not_regressed():
    def extra(value):
        return Row(**CASE, strategy="shadow", metric="extra_bytes", value=value)

    for head, status, code in ((1_030_000, "changed", 0), (1_100_000, "regressed", 1), (900_000, "improved", 0)):
        comparison = compare_results(_doc(_rows() + [extra(1_000_000)]), _doc(_rows() + [extra(head)]), 0.05)
        assert _status(comparison, "shadow", "extra_bytes") == status and comparison.exit_code == code


def test_a_failing_verdict_the_base_lacks_fails(write, capsys):
    """A head that fails or errors is failing also when the base never ran that strategy (repro r01)."""
    base = write("base.json", [r for r in _rows() if r.key[3] != "gather_cast"])
    for verdict, code in (("fail", 1), ("error", 1), ("pass", 0), ("unsupported", 0)):  # twins: added, not failing
        head = write("head.json", _rows(verdict=verdict, seed=3))
        assert main_compare(base, head, "5%") == code, verdict
        out = capsys.readouterr().out
        assert ("REGRESSION: 1 gating row(s) failed: gather_cast/verdict failing" in out) is (code == 1)


def test_a_failing_verdict_decides_on_another_device_too(write, capsys):
    """CPU base, CUDA head whose verdict fails: exit 1 naming the verdict only (the timings cannot be judged)."""
    base = write("base.json", _rows(), {**ENV, "gpu": None, "device": "cpu"})
    head = write("head.json", _rows(verdict="fail", cast_us=30.0, seed=3))
    assert main_compare(base, head, "5%") == 1
    out = capsys.readouterr().out
    assert "ENVIRONMENTS DIFFER: device cpu vs cuda; timings not judged" in out
    assert "REGRESSION: 1 gating row(s) failed: gather_cast/verdict failing (failing:" in out
    head = write("head.json", _rows(cast_us=30.0, seed=3))  # twin: the verdict passes
    assert main_compare(base, head, "5%") == 2
    assert "CANNOT JUDGE (exit 2)" in capsys.readouterr().out


def test_the_regression_line_says_what_failed(write, capsys):
    base = write("base.json", _rows())
    head = write("head.json", [r for r in _rows(seed=3) if r.key[3:] != ("gather_cast", "flashinfer-fa3", "extra_bytes")])
    assert main_compare(base, head, "5%") == 1
    out = capsys.readouterr().out
    assert "gather_cast/extra_bytes missing (missing: absent or null in the head)" in out and "CI" not in out.split("REGRESSION")[1]
    head = write("head.json", _rows(cast_us=10.4 * 1.2, verdict="error", seed=3))  # twin: two other kinds
    assert main_compare(base, head, "5%") == 1
    assert "(regressed: whole CI beyond 5%; failing: the head's verdict does not pass)" in capsys.readouterr().out


def test_machine_differences_are_said_not_judged(write, capsys):
    """Another driver, power limit or host is named in a note; the control copy and the GPU decide whether timings
    compare, so an A/A pair across two such machines still passes. Twin: one machine, no note."""
    other = {**ENV, "hostname": "ci-2", "driver": "575.51", "power_limit": "350.00 W"}
    base = write("base.json", _rows(), {**ENV, "driver": "580.82", "power_limit": "700.00 W"})
    head = write("head.json", _rows(seed=7), other)
    assert main_compare(base, head, "5%") == 0
    out = capsys.readouterr().out
    assert "note: the machines differ in hostname: ci -> ci-2; driver: 580.82 -> 575.51; power_limit: 700.00 W -> 350.00 W" in out
    assert main_compare(base, write("same.json", _rows(seed=7), {**ENV, "driver": "580.82", "power_limit": "700.00 W"}), "5%") == 0
    assert "machines differ" not in capsys.readouterr().out
    software = {"python": ("3.12.3", "3.12.9"), "numpy": ("2.2.0", "2.3.1"), "triton": ("3.5.0", "3.6.0"),
                "reference": ("golden/x (manifest_sha256 ab12)", "live float64 reference")}  # Triton writes gather_cast's kernel
    base = write("sw-base.json", _rows(), {**ENV, **{k: v[0] for k, v in software.items()}})
    assert main_compare(base, write("sw-head.json", _rows(seed=7), {**ENV, **{k: v[1] for k, v in software.items()}}), "5%") == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert all(f"{k}: {a} -> {b}" in out for k, (a, b) in software.items()), out


def test_other_code_is_said_not_judged(write, capsys):
    """Two commits, a clean and a dirty tree of one, or other harness code at one commit went unsaid (git_commit and
    harness_digest are no machine fields). A note names them; the exit code stays the rule's. Twin: the same code."""
    commit = "98e2f47" + "0" * 33
    base = write("base.json", _rows(), {**ENV, "git_commit": commit, "harness_digest": "a" * 64})
    for env, said in (({"git_commit": f"{commit}-dirty"}, "commit 98e2f47 -> 98e2f47-dirty"),
                      ({"harness_digest": "b" * 64}, "harness code at one commit 98e2f47: harness_digest aaaaaaa -> bbbbbbb"),
                      ({}, None)):
        head = write("head.json", _rows(seed=7), {**ENV, "git_commit": commit, "harness_digest": "a" * 64, **env})
        assert main_compare(base, head, "5%") == 0
        out = capsys.readouterr().out
        assert (f"note: the runs differ in {said} (said, not judged)" in out) if said else "runs differ" not in out, out


def test_an_exact_regression_fails_even_when_the_environments_differ():
    """Controls apart: timings cannot be judged, but a byte count that doubled still exits 1."""
    base = _rows(control=3000.0)
    head = _rows(control=2000.0)
    head[2].value = 2 * base[2].value  # gather_cast extra_bytes doubled
    c = compare_results(_doc(base), _doc(head), 0.05)
    assert c.environment_differs and _status(c, "gather_cast", "extra_bytes") == "regressed"
    assert c.exit_code == 1 and [x.key[5] for x in c.decisive] == ["extra_bytes"]


def test_cpu_files_with_differing_controls_pass_when_no_timing_gates():
    env = {**ENV, "device": "cpu", "gpu": None}
    c = compare_results(_doc(_rows(control=3000.0), env), _doc(_rows(cast_us=20.0, control=2000.0), env), 0.05)
    assert c.environment_differs and not c.cannot_judge and c.exit_code == 0


# audit (suites/test_mutations_gate.py, "audit-" pins)


def test_the_control_is_judged_at_the_gates_tolerance():
    """A control 7% lower (tight samples) is another environment at --max-regression 5%, not at 10%: the guard
    applies the tolerance the user gave, not a fixed one."""
    base, head = _doc(_rows(control=3000.0)), _doc(_rows(control=2800.0, seed=9))
    strict = compare_results(base, head, 0.05)
    assert "control control_copy_gbps" in strict.environment_differs and strict.exit_code == 2
    loose = compare_results(base, head, 0.10)  # twin: within the tolerance
    assert loose.environment_differs is None and loose.exit_code == 0


def test_a_control_moved_within_the_tolerance_is_said(write, capsys):
    """A control 3% higher (interval clear of 1, within 5%) beside a 20% slower cast_us was not shown: the
    `regressed` line did not say the machine moved. Said, never judged: the exit code stays the rule's.
    Twins: the control unmoved, or moved past the tolerance (ENVIRONMENTS DIFFER), says no such note."""
    base = write("base.json", _rows())
    for control, slow, code, said in ((3090.0, 1.2, 1, True), (3090.0, 1.0, 0, True), (3000.0, 1.2, 1, False),
                                      (3300.0, 1.2, 2, False)):
        head = write("head.json", _rows(cast_us=10.4 * slow, seed=4, control=control))
        assert main_compare(base, head, "5%") == code
        out = " ".join(capsys.readouterr().out.split())
        note = "note: control control_copy_gbps 3000 -> 3090 GB/s (1.030x, 99% CI 1."
        assert (note in out and "the machine itself moved, within ±5% (said, not judged)" in out) == said, out
        assert ("ENVIRONMENTS DIFFER" in out) == (control == 3300.0)


def test_the_same_gpu_spelled_otherwise_is_the_same_environment():
    comparison = compare_results(_doc(_rows()), _doc(_rows(seed=4), {**ENV, "gpu": " nvidia h200 "}), 0.05)
    assert comparison.environment_differs is None and comparison.exit_code == 0


def test_another_host_or_commit_does_not_explain_unsupported():
    """Only what can make a strategy unsupported (GPU, capability, CUDA, torch, FlashInfer) explains it; a head run
    on another host of the same kind, at another commit, that stops running a strategy fails."""
    head = _rows(seed=4)
    head[1] = Row(**CASE, strategy="gather_cast", metric="verdict", value="unsupported",
                  detail={"status": "unsupported", "reason": "not on this host"})
    moved = {**ENV, "hostname": "ci-2", "git_commit": "def"}
    comparison = compare_results(_doc(_rows()), _doc(head, moved), 0.05)
    assert _status(comparison, "gather_cast", "verdict") == "failing" and comparison.exit_code == 1
    twin = compare_results(_doc(_rows()), _doc(head, {**moved, "torch": "2.99.0"}), 0.05)
    assert _status(twin, "gather_cast", "verdict") == "unsupported"


def test_a_missing_timing_fails_even_when_the_environments_differ(write, capsys):
    """Controls apart, a gating timing the head lost is still missing (exit 1), not 'cannot judge'."""
    base = write("base.json", _rows(control=3000.0))
    head = write("head.json", [r for r in _rows(control=2000.0, seed=2) if (r.strategy, r.metric) != ("gather_cast", "cast_us")])
    assert main_compare(base, head, "5%") == 1
    out = capsys.readouterr().out
    assert "ENVIRONMENTS DIFFER" in out and "REGRESSION: 1 gating row(s) failed: gather_cast/cast_us missing" in out


def test_triton_interpret_on_one_side_is_another_environment():
    """TRITON_INTERPRET=1 runs the Triton kernels interpreted (fused_fp8 not its CUDA kernel): a head timed so cannot
    be judged against a base timed without it, and a strategy it makes unsupported is explained (before: the variable
    was in the repro only, so the interpreted kernel's 100x slower timings read as a regression of the commit, and
    fused_fp8 unsupported on a CPU without it read as 'unsupported in the same environment')."""
    slow = _rows(cast_us=1040.0)
    comparison = compare_results(_doc(_rows()), _doc(slow, {**ENV, "triton_interpret": "1"}), 0.05)
    assert comparison.environment_differs == "TRITON_INTERPRET unset vs 1 (Triton kernels interpreted on one side)"
    assert comparison.exit_code == 2 and comparison.regressions and not comparison.decisive  # said, not blamed on the commit
    cpu = {**ENV, "gpu": None, "capability": None, "device": "cpu"}
    unsupported = [*_rows()[:1], Row(**CASE, strategy="gather_cast", metric="verdict", value="unsupported"), *_rows()[2:]]
    comparison = compare_results(_doc(_rows(), {**cpu, "triton_interpret": "1"}), _doc(unsupported, cpu), 0.05)
    assert _status(comparison, "gather_cast", "verdict") == "unsupported" and comparison.exit_code == 2  # explained: no result, not a pass
    assert compare_results(_doc(_rows(), {**ENV, "triton_interpret": "1"}), _doc(_rows(seed=4), {**ENV, "triton_interpret": "1"}),
                           0.05).environment_differs is None  # twin: set on both sides

    import os

    import torch

    from harness.measure.environment import environment

    assert environment(torch.device("cpu"))["triton_interpret"] == os.environ.get("TRITON_INTERPRET")


def test_text_from_the_files_is_printed_as_written_never_as_markup(write, capsys):
    """A verdict's reason, a strategy name or a machine field holding square brackets (an exception's message, a
    folder) is file text, not rich markup: `[/]` crashed the report with a MarkupError traceback instead of its
    REGRESSION line, and `[link=x]` or `[bold]` vanished from the note. Twin: the same failure in plain words."""
    for name, why, path in (("gather[/]cast", "[/] [bold]x[/bold] [link=y]z", "/opt/[/]fi"), ("gather_cast", "x z", "/opt/fi2")):
        rows = [r if r.strategy != "gather_cast" else Row(**{**r.__dict__, "strategy": name}) for r in _rows()]
        head = [r for r in rows if r.strategy != name] + [Row(**CASE, strategy=name, metric="verdict", value="unsupported",
                                                              detail={"status": "unsupported", "reason": why})]
        base = write("base.json", rows, {**ENV, "flashinfer_path": "/opt/fi"})
        assert main_compare(base, write("head.json", head, {**ENV, "flashinfer_path": path}), "5%") == 1
        captured = capsys.readouterr()
        assert captured.err == "" and why in captured.out and f"{name}/verdict failing" in captured.out
        assert f"flashinfer_path: /opt/fi -> {path}" in captured.out


def test_a_strategy_gone_from_the_head_fails_where_none_of_its_rows_gate(write_tpot, capsys):
    """A CPU `tpot --json` file has no row that gates (timings inform only there, no verdict): a head without one of
    the base's strategies at all passed with exit 0, its rows listed as `missing` but `info`. A strategy the base
    has and the head lacks is a missing result on any device (exit 1). Twins: nothing missing, or one informational
    metric of a strategy the head still has, passes as before; a head without the control is the environment guard's."""
    cpu = {**ENV, "device": "cpu", "gpu": None}
    info = [_timed(s, m, 5.0, seed=i) for i, (s, m) in enumerate(
        [(s, m) for s in ("gather_cast", "stock") for m in ("tpot_ms", "attn_path_ms")])]
    control = _timed("control", "control_copy_gbps", 3000.0, 0.005, 9)
    base = write_tpot("base.json", [*info, control], cpu)
    other = {**cpu, "hostname": "ci-2"}
    assert main_compare(base, write_tpot("head.json", [*info[2:], control], other), "5%") == 1
    out = capsys.readouterr().out
    assert "REGRESSION: 2 gating row(s) failed: gather_cast/attn_path_ms missing, gather_cast/tpot_ms missing" in out
    for rows in ([*info, control], [*info[:1], *info[2:], control], info):
        assert main_compare(base, write_tpot("head.json", rows, other), "5%") == 0
        assert "REGRESSION" not in capsys.readouterr().out


def test_a_strategy_the_head_only_says_it_did_not_measure_is_missing(write_tpot, capsys):
    """A CPU `tpot --json` head records a strategy it could not run as a tpot_ms row with no value and
    detail.unsupported: that passed (exit 0), the strategy's rows `missing` but informational. It is a missing
    result (exit 1) in the same environment, and `unsupported` where an environment field explains it: no result to
    judge (exit 2; it passed before). Twin: the strategy measured in the head passes."""
    cpu = {**ENV, "device": "cpu", "gpu": None}
    info = [_timed(s, m, 5.0, seed=i) for i, (s, m) in enumerate(
        [(s, m) for s in ("gather_cast", "stock") for m in ("tpot_ms", "attn_path_ms")])]
    control = _timed("control", "control_copy_gbps", 3000.0, 0.005, 9)
    base = write_tpot("base.json", [*info, control], cpu)
    unmeasured = Row(**CASE, strategy="gather_cast", metric="tpot_ms", value=None, detail={"unsupported": "gather_cast: no"})
    head = [unmeasured, *info[2:], control]
    assert main_compare(base, write_tpot("head.json", head, {**cpu, "hostname": "ci-2"}), "5%") == 1
    out = capsys.readouterr().out
    assert "gather_cast/tpot_ms missing" in out and "gather_cast/attn_path_ms missing" in out
    assert main_compare(base, write_tpot("head.json", head, {**cpu, "torch": "2.12.0"}), "5%") == 2
    out = capsys.readouterr().out
    assert "REGRESSION" not in out and "its strategy is unsupported in the head" in out
    assert "UNSUPPORTED IN THE HEAD: gather_cast, run in the base, gave no result in the head's environment (torch" in out
    assert main_compare(base, write_tpot("head.json", [*info, control], {**cpu, "hostname": "ci-2"}), "5%") == 0


def test_one_run_relabelled_is_not_two_runs(write, capsys):
    """A copy of the base with another `created` stamp or environment passed as "unchanged" (exit 0): equal
    timings sample for sample are one run, bad input (exit 2). Twin: one sample of another run differs."""
    base = write("base.json", _rows())
    doc = json.loads(base.read_text())
    for edit in ({"created": "2027-01-01T00:00:00+00:00"}, {"environment": {**doc["environment"], "git_commit": "def"}}):
        head = base.parent / "relabelled.json"
        head.write_text(json.dumps({**doc, **edit}))
        assert main_compare(base, head, "5%") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: {head}: the same run as the base {base}: a gate needs two runs"]
    assert main_compare(base, write("head.json", _rows()), "5%") == 0


def _unsupported_gather_cast() -> list[Row]:
    """A head that stopped running gather_cast: its verdict `unsupported`, its timing gone."""
    head = [r for r in _rows(seed=4) if (r.strategy, r.metric) != ("gather_cast", "cast_us")]
    head[0] = Row(**CASE, strategy="gather_cast", metric="verdict", value="unsupported",
                  detail={"status": "unsupported", "reason": "gather_cast: broken"})
    return head


@pytest.mark.parametrize("gpu", [" nvidia h200 ", "NVIDIA  H200"])
def test_the_same_gpu_spelled_otherwise_explains_no_unsupported_strategy(gpu):
    """The gate judges a GPU name apart from case and spacing as the same GPU, and so must the rule that lets an
    environment change excuse a strategy turned unsupported (it compared the names as written: exit 0). Twin:
    another GPU explains it."""
    comparison = compare_results(_doc(_rows()), _doc(_unsupported_gather_cast(), {**ENV, "gpu": gpu}), 0.05)
    assert comparison.environment_differs is None
    assert _status(comparison, "gather_cast", "verdict") == "failing" and comparison.exit_code == 1
    twin = compare_results(_doc(_rows()), _doc(_unsupported_gather_cast(), {**ENV, "gpu": "NVIDIA H100"}), 0.05)
    assert _status(twin, "gather_cast", "verdict") == "unsupported"


@pytest.mark.parametrize("off", ["0", "", "false", "2"])
def test_triton_interpret_set_but_off_is_the_same_environment(off):
    """TRITON_INTERPRET=0 (or any value Triton reads as off) interprets nothing: it neither stops the gate judging
    timings (was exit 2) nor explains a strategy turned unsupported (was exit 0). Twin: a value Triton reads as on."""
    comparison = compare_results(_doc(_rows()), _doc(_unsupported_gather_cast(), {**ENV, "triton_interpret": off}), 0.05)
    assert comparison.environment_differs is None
    assert _status(comparison, "gather_cast", "verdict") == "failing" and comparison.exit_code == 1
    twin = compare_results(_doc(_rows()), _doc(_unsupported_gather_cast(), {**ENV, "triton_interpret": "True"}), 0.05)
    assert twin.environment_differs == "TRITON_INTERPRET unset vs True (Triton kernels interpreted on one side)"
    assert _status(twin, "gather_cast", "verdict") == "unsupported"


def test_one_run_relabelled_with_its_samples_reordered_is_not_two_runs(write, capsys):
    """A relabelled copy of the base whose samples were shuffled (or sorted) passed as two runs (exit 0): the same
    samples in another order are the same draw. Twin: one sample of another run differs."""
    base = write("base.json", _rows())
    doc = json.loads(base.read_text())
    for row in doc["rows"]:
        if row.get("samples"):
            row["samples"] = sorted(row["samples"], reverse=True)
    head = base.parent / "shuffled.json"
    head.write_text(json.dumps({**doc, "created": "2027-01-01T00:00:00+00:00"}))
    assert main_compare(base, head, "5%") == 2
    assert capsys.readouterr().err.strip() == f"error: {head}: the same run as the base {base}: a gate needs two runs"
    head.write_text(json.dumps(nudged({**doc, "created": "2027-01-01T00:00:00+00:00"}, 1)))
    assert main_compare(base, head, "5%") == 0


def test_a_row_without_a_value_in_the_base_is_not_missing_when_the_head_drops_it(write, capsys):
    """shadow has no cast: its cast_us row is null (detail.unsupported). A head that no longer writes that null row
    lost no result; it failed as `missing` (exit 1). Twin: a valued row the head drops is missing."""
    null = Row(**CASE, strategy="shadow", metric="cast_us", value=None, detail={"unsupported": "shadow has no cast"})
    shadow = [null, Row(**CASE, strategy="shadow", metric="verdict", value="pass")]
    base = write("base.json", [*_rows(), *shadow])
    assert main_compare(base, write("head.json", [*_rows(seed=4), shadow[1]]), "5%") == 0
    assert "REGRESSION" not in capsys.readouterr().out
    assert main_compare(base, write("head.json", [*_rows(seed=4)[1:], *shadow]), "5%") == 1
    assert "gather_cast/cast_us missing" in capsys.readouterr().out


def test_a_control_row_filed_under_a_vanished_strategy_does_not_stand_for_it(write_tpot, capsys):
    """index_rows lets the control row be filed under any strategy; filed under a strategy whose rows all vanished
    from a CPU tpot head (none of which gates), it counted as that strategy's valued row and the head passed (exit
    0). Twin: with gather_cast's rows kept, the head so filed passes."""
    cpu = {**ENV, "device": "cpu", "gpu": None}
    info = [_timed(s, m, 5.0, seed=i) for i, (s, m) in enumerate(
        [(s, m) for s in ("gather_cast", "stock") for m in ("tpot_ms", "attn_path_ms")])]
    control = _timed("control", "control_copy_gbps", 3000.0, 0.005, 9)
    base = write_tpot("base.json", [*info, control], cpu)
    filed = _timed("gather_cast", "control_copy_gbps", 3000.0, 0.005, 10)
    assert main_compare(base, write_tpot("head.json", [*info[2:], filed], cpu), "5%") == 1
    assert "gather_cast/tpot_ms missing" in capsys.readouterr().out
    assert main_compare(base, write_tpot("head.json", [*info, filed], cpu), "5%") == 0


def test_a_control_shifted_by_an_unknown_amount_up_to_past_the_tolerance_is_another_environment():
    """Every timing 8% slower with no code change, the control's copy bandwidth 4.5% lower but noisy (its interval
    clear of 1, reaching past the 5% tolerance, so not decided beyond it): the guard only looked for a control decided beyond the
    tolerance, so it called the environments alike and the machine's slowdown a regression of the commit (exit 1).
    Twins: the same noisy control unshifted judges the timings (exit 1), and a control shifted well within the
    tolerance (interval clear of 1, not reaching 5%) too."""
    slow = [_timed("gather_cast", "cast_us", 10.4 * 1.08, 0.01, 5), *_rows()[1:3], _timed("stock", "cast_us", 866.0 * 1.08, 0.01, 6),
            *_rows()[4:6]]
    base = _doc([*_rows()[:6], _timed("control", "control_copy_gbps", 3000.0, 0.04, 3)])
    for control, differs in ((3000.0 * 0.955, True), (3000.0, False)):
        head = _doc([*slow, _timed("control", "control_copy_gbps", control, 0.04, 7)])
        comparison = compare_results(base, head, 0.05)
        assert (comparison.environment_differs is not None) == differs, comparison.environment_differs
        assert comparison.exit_code == (2 if differs else 1)
        if differs:
            assert "shifted, up to beyond ±5%" in comparison.environment_differs and not comparison.decisive
    tight = _doc([*slow, _timed("control", "control_copy_gbps", 3000.0 * 0.99, 0.005, 7)])
    base_tight = _doc(_rows())
    comparison = compare_results(base_tight, tight, 0.05)
    assert comparison.environment_differs is None and comparison.exit_code == 1
