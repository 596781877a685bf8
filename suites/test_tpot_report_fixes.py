"""The TPOT report's header and --out, and models.toml's fields declared once (on ModelShape)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import HarnessError
from harness.results.document import Case, Row, document
from harness.tpot import config
from harness.tpot.report import main as tpot_report
from harness.tpot.report import render

CASE = dict(preset="glm5-tp8", scale="ci", scenario="b1-l500", backend="torch")
RAN = {"layers": 2, "weight_sets": 1, "allreduce": "none", "kernels": {"moe": "grouped"}}


def _tpot_file(path: Path, *details: dict, extra: tuple[Row, ...] = ()) -> Path:
    """A `harness tpot` results file with one tpot_ms row per detail, in order (a detail with `unsupported` a null row)."""
    record = Case(command="tpot", **CASE, slots=2048, layers=2, kernel="auto", workload="0" * 64, workload_v4=None)
    rows = [Row(**CASE, strategy=f"s{i}", metric="tpot_ms", value=None, detail=d) if "unsupported" in d else
            Row(**CASE, strategy=f"s{i}", metric="tpot_ms", value=400.0, samples=[400.0], detail=d) for i, d in enumerate(details)]
    rows += extra
    path.write_text(json.dumps(document(rows, {"device": "cpu", "hostname": "ci", "git_commit": "abc"}, "python -m harness tpot", record)))
    return path


def _header(md: str) -> str:
    """The line under the case's title: its layers, weight sets, pool and all-reduce."""
    lines = md.splitlines()
    return lines[next(i for i, x in enumerate(lines) if x.startswith("## ")) + 2]


def test_header_takes_the_layer_count_from_a_strategy_that_ran(tmp_path):
    """A case whose first strategy did not run (its row carries only why) headed 'None layers, None rotated weight
    sets'. Now the header is the first strategy that ran; where none ran it says the count is unknown, never None.
    Twin: a first strategy that ran heads it as before."""
    skipped = {"unsupported": "s0: not on this device"}
    md = render([_tpot_file(tmp_path / "a.json", skipped, RAN)], None)[0]
    assert _header(md).startswith("2 layers, 1 rotated weight sets") and "None" not in md, _header(md)
    assert "Kernels: moe = grouped" in md
    # no step ran (a file of nothing but null rows is refused before the report: one value elsewhere lets it through)
    other = Row(**CASE, strategy="s2", metric="attn_path_ms", value=1.0, samples=[1.0])
    md = render([_tpot_file(tmp_path / "b.json", skipped, skipped, extra=(other,))], None)[0]
    assert _header(md).startswith("Layer count unknown") and "None" not in md, md
    assert _header(render([_tpot_file(tmp_path / "c.json", RAN, skipped)], None)[0]).startswith("2 layers")


def test_out_that_holds_files_is_refused_as_harness_report_refuses_it(tmp_path, capsys):
    """--out DIR already holding files was written into (its tpot.md / tpot.png replaceable) where `harness report`
    refuses it. Now the same rule: one error line naming the folder, exit 2, nothing on disk changed. Twin: --force
    writes into it, the other files kept; a new or empty folder needs no --force."""
    results = _tpot_file(tmp_path / "t.json", RAN)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["report", str(results), "--out", str(out)]) == 2  # harness report's rule
    capsys.readouterr()
    assert tpot_report([str(results), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"error: --out: {out} already holds files; --force writes tpot.md and tpot.png into it"]
    assert captured.out == "" and [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    assert tpot_report([str(results), "--out", str(out), "--force"]) == 0
    assert (out / "tpot.md").is_file() and (out / "notes.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    for fresh in (tmp_path / "empty", tmp_path / "new"):
        assert tpot_report([str(results), "--out", str(fresh)]) == 0 and (fresh / "tpot.md").is_file()
    capsys.readouterr()


def _config_with(monkeypatch, field: str) -> types.ModuleType:
    """harness/tpot/config.py with one more ModelShape field declared (after model_type), and nothing else changed."""
    source, anchor = Path(config.__file__).read_text(), "    model_type: str\n"
    assert source.count(anchor) == 1
    module = types.ModuleType("config_one_more_field")
    module.__file__ = config.__file__
    monkeypatch.setitem(sys.modules, module.__name__, module)  # dataclass and get_type_hints read its globals there
    exec(compile(source.replace(anchor, anchor + field), config.__file__, "exec"), module.__dict__)
    return module


def _models_toml(tmp_path: Path, line: str) -> Path:
    """models.toml with `line` added to [glm5-tp8]."""
    path = tmp_path / "m.toml"
    path.write_text(config.MODELS_FILE.read_text().replace("[glm5-tp8]\n", f"[glm5-tp8]\n{line}\n"))
    return path


def test_a_model_shape_field_is_declared_once(tmp_path, monkeypatch):
    """_Table listed ModelShape's fields a second time, with their types and bounds: a field declared on ModelShape
    alone was refused in models.toml as 'unknown field'. Now the table is ModelShape's declaration: the new field is
    read, required and bound-checked, its error naming its table and field. Twin: the file as shipped loads as before."""
    twin = _config_with(monkeypatch, "    extra_experts: Annotated[int, msgspec.Meta(ge=2)]\n")
    assert twin.load_shape("glm5-tp8", path=_models_toml(tmp_path, "extra_experts = 3")).extra_experts == 3
    for line, where, message in (("extra_experts = 1", "[glm5-tp8].extra_experts", "Expected `int` >= 2"),
                                 ('extra_experts = "3"', "[glm5-tp8].extra_experts", "Expected `int`, got `str`"),
                                 ("", "[glm5-tp8]", "missing field(s) ['extra_experts']")):
        path = _models_toml(tmp_path, line)
        with pytest.raises(HarnessError) as err:
            twin.load_shape("glm5-tp8", path=path)
        assert str(err.value) == f"{path}: {where}: {message}"
    shipped = twin.load_shape("glm5-tp8", path=_models_toml(tmp_path, "extra_experts = 3"), shrink=True)
    assert (shipped.hidden_size, shipped.extra_experts) == (config.load_shape("glm5-tp8", shrink=True).hidden_size, 3)
    assert config.load_shape("glm5-tp8", path=config.MODELS_FILE) == config.load_shape("glm5-tp8")
