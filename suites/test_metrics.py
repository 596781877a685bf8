"""The metric table: every metric `harness run` emits is declared, and undeclared ones are refused."""

from __future__ import annotations

import json

import pytest

from harness import cli
from harness.errors import HarnessError
from harness.results.document import Row, write_results
from harness.results.metrics import METRICS, spec, validate_rows

CASE = dict(preset="glm5-tp8", scale="ci", scenario="b1-l500", backend="torch")


@pytest.mark.slow
def test_every_metric_a_run_emits_is_declared(tmp_path):
    """All strategies at ci scale, in process: each row's metric, unit and direction match the table."""
    out = tmp_path / "r.json"
    assert cli.main(["run", "--device", "cpu", "--scenario", "b1-l500", "--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    emitted = {r["metric"] for r in rows}
    assert {"verdict", "cast_us", "cast_gbps", "attn_us", "step_ms", "extra_bytes", "build_s", "control_copy_gbps"} <= emitted
    for r in rows:
        m = spec(r["metric"])
        assert (r["better"], r["gating"]) == (m.better, m.gates("cpu")), r
        assert r["value"] is None or r["unit"] == m.unit, r


def test_undeclared_metric_is_rejected(tmp_path):
    row = Row(**CASE, strategy="stock", metric="attn_tflops", value=1.0, unit="TFLOP/s", better="higher")
    with pytest.raises(HarnessError, match="attn_tflops.*not declared"):
        validate_rows([row])
    with pytest.raises(HarnessError, match="not declared"):
        write_results(tmp_path / "r.json", [row], {"device": "cpu"}, "")
    assert not (tmp_path / "r.json").exists()


def test_direction_disagreeing_with_the_table_is_rejected():
    row = Row(**CASE, strategy="stock", metric="cast_gbps", value=900.0, unit="GB/s", better="lower")
    with pytest.raises(HarnessError, match="disagree"):
        validate_rows([row])


def test_rows_take_unit_and_direction_from_the_table():
    row = Row(**CASE, strategy="stock", metric="cast_gbps", value=900.0)
    assert (row.unit, row.better) == ("GB/s", "higher")
    validate_rows([row])


def test_declarations_are_consistent():
    for name, m in METRICS.items():
        assert m.name == name and m.better in ("lower", "higher", None) and m.gates_on <= {"cpu", "cuda"}
        if m.timed:  # host wall time on a CPU runner is never trusted to gate
            assert not m.gates("cpu"), name
    gating_on_gpu = {n for n, m in METRICS.items() if m.timed and m.gates("cuda")}
    assert gating_on_gpu == {"cast_us", "attn_us", "step_device_ms", "tpot_ms"}


def test_timed_samples_take_the_declared_unit_not_one_read_from_the_name():
    """A timing block's ms samples are reported in the metric's declared unit: tpot_ms is ms though its name does
    not start with "step" (read from the name, it was "us" and 1000x too big), cast_us is us, step_ms ms."""
    import torch

    from harness.measure.collect import Measured, _time_blocks

    out = Measured()
    blocks = {name: (lambda: [1.5, 2.0]) for name in ("tpot_ms", "cast_us", "step_ms")}
    _time_blocks(blocks, torch.device("cpu"), out, lambda: None)
    got = {name: (s.unit, s.values) for name, s in out.metrics.items()}
    assert got == {"tpot_ms": ("ms", (1.5, 2.0)), "cast_us": ("us", (1500.0, 2000.0)), "step_ms": ("ms", (1.5, 2.0))}
    assert all(unit == METRICS[name].unit for name, (unit, _) in got.items())


def test_bytes_format():
    assert METRICS["extra_bytes"].format(4718592) == "4.5 MiB" and METRICS["peak_bytes"].format(3 << 30) == "3.00 GiB"
