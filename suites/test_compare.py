"""`harness.compare`: regression gate over two results JSON files (written by the real writer)."""

from __future__ import annotations

import json

import pytest

from harness.compare import compare_results, load_results, main_compare, parse_factor
from harness.errors import HarnessError
from harness.results import Row, write_results

ENV = {"gpu": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0", "git_commit": "abc", "hostname": "ci"}
CASE = dict(preset="glm5-tp8", scale="prod", scenario="b1-l4096", backend="flashinfer-fa3")


def _rows(cast_us: float = 10.4, verdict: str = "pass", iqr: float = 0.2) -> list[Row]:
    return [
        Row(**CASE, strategy="gather_cast", metric="cast_us", value=cast_us, unit="us", better="lower",
            iqr=iqr, samples=[cast_us - 0.1, cast_us, cast_us + 0.1]),
        Row(**CASE, strategy="gather_cast", metric="verdict", value=verdict),
        Row(**CASE, strategy="gather_cast", metric="extra_bytes", value=4718592, unit="B", better="lower"),
        Row(**CASE, strategy="stock", metric="cast_us", value=866.0, unit="us", better="lower", iqr=3.0),
        Row(**CASE, strategy="stock", metric="bandwidth_gbs", value=990.0, unit="GB/s", better="higher"),
        Row(**CASE, strategy="stock", metric="verdict", value="pass"),
    ]


@pytest.fixture
def write(tmp_path):
    def _write(name: str, rows: list[Row]):
        path = tmp_path / name
        write_results(path, rows, ENV, "python -m harness run --scenario b1-l4096")
        return path

    return _write


def _doc(rows: list[Row]) -> dict:
    return {"schema": "mla-harness-results/1", "rows": [vars(r) for r in rows]}


def _status(comparison, strategy: str, metric: str) -> str:
    (change,) = [c for c in comparison.changes if c.key[3] == strategy and c.key[5] == metric]
    return change.status


@pytest.mark.parametrize("text, expected", [("10%", 0.10), ("0.10", 0.10), (0.1, 0.1), ("0%", 0.0), ("150%", 1.5)])
def test_parse_factor(text, expected):
    assert parse_factor(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["abc", "-5%", "1.10", "nan%", ""])
def test_parse_factor_rejects(text):
    with pytest.raises(HarnessError, match="--max-regression"):
        parse_factor(text)


def test_planted_slowdown_exits_1(write, capsys):
    base = write("base.json", _rows(cast_us=10.4))
    head = write("head.json", _rows(cast_us=10.4 * 1.20))
    assert main_compare(base, head, "10%") == 1
    out = capsys.readouterr().out
    assert "gather_cast" in out and "cast_us" in out and "regressed" in out and "1.200x" in out
    assert "REGRESSION" in out


def test_unchanged_exits_0(write, capsys):
    base = write("base.json", _rows())
    head = write("head.json", _rows())
    assert main_compare(base, head, "10%") == 0
    out = capsys.readouterr().out
    assert "6 unchanged" in out and "REGRESSION" not in out


def test_slowdown_within_factor_passes(write):
    base = write("base.json", _rows(cast_us=10.0))
    head = write("head.json", _rows(cast_us=10.9))
    assert main_compare(base, head, "10%") == 0
    assert main_compare(base, head, "5%") == 1


def test_pass_to_fail_exits_1(write, capsys):
    base = write("base.json", _rows(verdict="pass"))
    head = write("head.json", _rows(verdict="fail"))
    assert main_compare(base, head, "10%") == 1
    assert "regressed" in capsys.readouterr().out


def test_verdict_transitions():
    def status(b, h):
        return _status(compare_results(_doc(_rows(verdict=b)), _doc(_rows(verdict=h)), 0.1), "gather_cast", "verdict")

    assert status("pass", "error") == "regressed"
    assert status("fail", "pass") == "fixed"
    assert status("pass", "unsupported") == "changed"
    assert status("fail", "fail") == "unchanged"


def test_direction_of_better():
    base = _rows()
    head = _rows()
    head[4] = Row(**CASE, strategy="stock", metric="bandwidth_gbs", value=800.0, unit="GB/s", better="higher")
    head[3] = Row(**CASE, strategy="stock", metric="cast_us", value=226.0, unit="us", better="lower", iqr=1.0)
    comparison = compare_results(_doc(base), _doc(head), 0.10)
    assert _status(comparison, "stock", "bandwidth_gbs") == "regressed"
    assert _status(comparison, "stock", "cast_us") == "improved"
    assert comparison.exit_code == 1


def test_zero_base_growing_is_a_regression():
    base, head = _rows(), _rows()
    base[2] = Row(**CASE, strategy="gather_cast", metric="extra_bytes", value=0, unit="B", better="lower")
    comparison = compare_results(_doc(base), _doc(head), 0.10)
    (change,) = [c for c in comparison.changes if c.key[5] == "extra_bytes"]
    assert change.status == "regressed" and change.ratio == float("inf")


def test_added_and_removed_rows_are_not_regressions(write, capsys):
    base = write("base.json", _rows())
    extra = Row(**CASE, strategy="shadow", metric="verdict", value="fail")
    head = write("head.json", _rows()[1:] + [extra])
    assert main_compare(base, head, "10%") == 0
    out = capsys.readouterr().out
    assert "added" in out and "removed" in out and "shadow" in out


def test_change_inside_the_combined_iqr_is_noisy_not_a_regression():
    noisy = compare_results(_doc(_rows(cast_us=10.0, iqr=3.0)), _doc(_rows(cast_us=12.0, iqr=3.0)), 0.10)
    quiet = compare_results(_doc(_rows(cast_us=10.0, iqr=0.1)), _doc(_rows(cast_us=12.0, iqr=0.1)), 0.10)
    (n,) = [c for c in noisy.changes if c.key[3] == "gather_cast" and c.key[5] == "cast_us"]
    (q,) = [c for c in quiet.changes if c.key[3] == "gather_cast" and c.key[5] == "cast_us"]
    assert (n.status, n.beyond_noise) == ("noisy", False)
    assert noisy.exit_code == 0
    assert (q.status, q.beyond_noise) == ("regressed", True)
    assert quiet.exit_code == 1
    (no_iqr,) = [c for c in quiet.changes if c.key[5] == "extra_bytes"]
    assert no_iqr.beyond_noise is None


def test_unit_change_is_incomparable_not_a_regression():
    base, head = _rows(), _rows()
    head[0] = Row(**CASE, strategy="gather_cast", metric="cast_us", value=20000.0, unit="ns", better="lower")
    comparison = compare_results(_doc(base), _doc(head), 0.10)
    assert _status(comparison, "gather_cast", "cast_us") == "incomparable"
    assert comparison.exit_code == 0


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
    assert main_compare(good, bad, "10%") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert str(bad) in line and field in line
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_bad_value_types_are_rejected(tmp_path):
    doc = _doc(_rows())
    doc["rows"][0]["value"] = "fast"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(HarnessError, match=r"rows\[0\]\.value"):
        load_results(path)
    doc["rows"][0]["value"] = 1.0
    doc["rows"].append(doc["rows"][0])
    path.write_text(json.dumps(doc))
    with pytest.raises(HarnessError, match="duplicate row"):
        load_results(path)


def test_missing_file_exits_2(write, tmp_path, capsys):
    good = write("good.json", _rows())
    assert main_compare(good, tmp_path / "absent.json", "10%") == 2
    assert "absent.json: no such file" in capsys.readouterr().err


def test_bad_factor_exits_2(write, capsys):
    good = write("good.json", _rows())
    assert main_compare(good, good, "ten") == 2
    assert "--max-regression" in capsys.readouterr().err


def test_noisy_change_renders_and_passes(tmp_path, capsys):
    from harness.compare import main_compare

    base, head = tmp_path / "base.json", tmp_path / "head.json"
    base.write_text(json.dumps(_doc(_rows(cast_us=10.0, iqr=3.0))))
    head.write_text(json.dumps(_doc(_rows(cast_us=12.0, iqr=3.0))))
    assert main_compare(base, head, "10%") == 0
    assert "noisy" in capsys.readouterr().out
