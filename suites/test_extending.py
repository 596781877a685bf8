"""The registry is the one list: a toy strategy registered from this file alone is run, checked, timed
by `run` and `tpot` by default, listed by the asv benchmarks, shown by `report` and gated by `compare`;
a toy model declared in the two places docs/extending.md names is run, checked and stepped; and
docs/extending.md names exactly the files a new strategy, backend, metric and model touch."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.strategies import BASELINE, BENCHMARKED, ORDER, REGISTRY
from harness.strategies.base import Strategy, register, unregister
from suites.helpers import another_run, fresh_asv_module

ROOT = Path(__file__).resolve().parent.parent
TOY = "toy_cast"
SMALL = ("--device", "cpu", "--scenario", "b1-l500", "--repeats", "1")


def _toy_cast(pool_u8: torch.Tensor) -> torch.Tensor:
    return pool_u8.view(torch.float8_e4m3fn).float().to(torch.bfloat16)  # exact: every e4m3 value is a bf16


@pytest.fixture
def toy():
    """A strategy declared here and nowhere else: the whole-pool cast by way of fp32 (bitwise tier)."""

    @register(TOY, order=990, devices=("cpu", "cuda"), kv_dtype=torch.bfloat16, tier="bitwise")
    class ToyCast(Strategy):
        @classmethod
        def extra_bytes(cls, geometry, schedule) -> int:
            return geometry.layer_bytes * 2

        @classmethod
        def cast_bytes(cls, geometry, batch) -> int:
            return geometry.layer_bytes * 3

        def cast_call(self, layer):
            return _toy_cast, (self.pool.buffers[layer],)

    try:
        yield ToyCast
    finally:
        unregister(TOY)
    assert TOY not in ORDER


def _rows(path: Path) -> dict[tuple[str, str], dict]:
    return {(r["strategy"], r["metric"]): r for r in json.loads(path.read_text())["rows"]}


def test_toy_strategy_is_seen_by_run_tpot_asv_report_and_compare(toy, tmp_path, capsys, monkeypatch):
    assert ORDER[-1] == TOY and TOY in BENCHMARKED  # registered after every shipped one, timed by default

    # run: every registered strategy by default, the toy checked against the golden and bit for bit against stock
    run_json = tmp_path / "run.json"
    assert main(["run", *SMALL, "--json", str(run_json)]) == 0, capsys.readouterr().err
    rows = _rows(run_json)
    assert rows[(TOY, "verdict")]["value"] == "pass" and rows[(TOY, "step_ms")]["value"] > 0
    assert rows[(TOY, "cast_us")]["value"] > 0 and rows[(TOY, "extra_bytes")]["value"] > 0
    assert rows[(TOY, "bytes_moved")]["value"] > 0  # the roofline reads the registry too

    # tpot: the default strategy list is the registry's
    tpot_json = tmp_path / "tpot.json"
    assert main(["tpot", *SMALL, "--shrink", "--slots", "2048", "--layers", "2", "--no-breakdown", "--json", str(tpot_json)]) == 0
    tpot = _rows(tpot_json)
    assert tpot[(TOY, "tpot_ms")]["value"] > 0
    assert {s for s, m in tpot if m == "tpot_ms"} >= {"stock", "gather_cast", "shadow", "native_fp8", "fused_fp8", TOY}

    # asv: both benchmark files time it by default (fused_fp8 too)
    for name in ("benchmarks", "bench_tpot"):
        module = fresh_asv_module(name, monkeypatch, {})
        assert TOY in module.PARAMS[1] and "fused_fp8" in module.PARAMS[1], name
    assert TOY in fresh_asv_module("benchmarks", monkeypatch, {}).StepDeviceMs.params[1]

    # report: a row of the toy's own in the case table, its speedup over the registry's baseline
    capsys.readouterr()
    assert main(["report", str(run_json), "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| strategy |"))
    toy_row = next(line for line in md.splitlines() if line.startswith(f"| {TOY} |"))
    assert f"speedup vs {BASELINE}" in header and "| pass |" in toy_row

    # compare: the toy's verdict going red is a regression that fails the gate
    head = json.loads(run_json.read_text())
    for row in head["rows"]:
        if (row["strategy"], row["metric"]) == (TOY, "verdict"):
            row["value"] = row["detail"]["status"] = "fail"
    head_json = tmp_path / "head.json"
    head_json.write_text(json.dumps(another_run(head)))
    capsys.readouterr()
    assert main(["compare", str(run_json), str(head_json)]) == 1
    out = capsys.readouterr().out
    assert TOY in out and "REGRESSION" in out


def test_toy_strategy_gets_the_session_dtype_contract(toy, monkeypatch):
    """The session, not the strategy, asserts the contract: a toy attend that returns float16 is an
    error verdict naming the contract, however the strategy overrides attend."""
    from rich.console import Console

    from harness.api import RunConfig, run
    from harness.inputs.cases import load_case

    def attend(self, plan, q_nope, q_pe, kv):
        out, lse = Strategy.attend(self, plan, q_nope, q_pe, kv)
        return out.to(torch.float16), lse

    monkeypatch.setattr(toy, "attend", attend)
    cfg = RunConfig(case=load_case("glm5-tp8.ci.b1-l500"), device=torch.device("cpu"), backend="torch",
                    strategies=(TOY,), repeats=0)
    result = next(r for r in run(cfg, Console(quiet=True)).results if r.strategy == TOY)
    assert result.verdict.status.value == "error" and "toy_cast dtype contract" in result.verdict.reason
    assert "output is torch.float16" in result.verdict.reason


# --- a model: a preset and its models.toml table, nothing else -------------------------------------

TOY_MODEL = "toy-tp2"


@pytest.fixture
def toy_model(tmp_path, monkeypatch):
    """A model unlike the shipped ones (16 heads of a TP2 rank, 16-token pages, 5 layers, YaRN), declared
    as a preset and a models.toml table (DeepSeek-V3's public numbers under the toy's name)."""
    from harness.spec import presets
    from harness.tpot import config

    preset = presets.ModelPreset(TOY_MODEL, num_layers=5, num_heads_total=32, tp=2, qk_nope_head_dim=128,
                                 page_size=16, yarn_factor=32.0, yarn_mscale_all_dim=1.0)
    monkeypatch.setitem(presets.PRESETS, TOY_MODEL, preset)
    text = config.MODELS_FILE.read_text()
    table = re.search(r"(?ms)^\[deepseek-v3-tp8\]\n(.*?)^\n", text).group(1)
    models = tmp_path / "models.toml"
    models.write_text(f"{text}\n[{TOY_MODEL}]\n{table}")
    monkeypatch.setattr(config, "MODELS_FILE", models)
    return preset


def test_toy_model_is_run_checked_and_stepped_from_its_declaration(toy_model, tmp_path, capsys, monkeypatch):
    run_json = tmp_path / "run.json"
    argv = ["run", "--preset", TOY_MODEL, *SMALL, "--slots", "4096", "--strategy", "stock", "--strategy", "gather_cast"]
    assert main([*argv, "--json", str(run_json)]) == 0, capsys.readouterr().err
    doc = json.loads(run_json.read_text())
    assert doc["case"]["preset"] == TOY_MODEL and "--preset toy-tp2" in doc["repro"]
    rows = _rows(run_json)
    assert rows[("stock", "verdict")]["value"] == rows[("gather_cast", "verdict")]["value"] == "pass"

    tpot_json = tmp_path / "tpot.json"
    assert main(["tpot", "--preset", TOY_MODEL, *SMALL, "--shrink", "--slots", "2048", "--layers", "2",
                 "--strategy", "gather_cast", "--no-breakdown", "--json", str(tpot_json)]) == 0
    assert _rows(tpot_json)[("gather_cast", "tpot_ms")]["value"] > 0

    # negative control: without its models.toml table the toy is refused, the file and the preset named
    from harness.tpot import config

    monkeypatch.setattr(config, "MODELS_FILE", ROOT / "harness" / "tpot" / "models.toml")
    capsys.readouterr()
    assert main(["tpot", "--preset", TOY_MODEL, *SMALL, "--shrink", "--strategy", "gather_cast"]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert "models.toml" in line and f"no model shape for preset '{TOY_MODEL}'" in line, line


# --- docs/extending.md names exactly the files each extension touches --------------------------

# what each section's "Files it touches" line must list (<name>: the new thing's name)
TOUCHES = {
    "A strategy": {"harness/strategies/<name>.py", "harness/strategies/__init__.py"},
    "A backend": {"harness/backends/<name>.py", "harness/backends/__init__.py"},
    "A metric": {"harness/results/metrics.py", "harness/measure/collect.py", "suites/asv/benchmarks.py"},
    "A model": {"harness/spec/presets.py", "harness/tpot/models.toml"},
}


def _touches(section: str) -> set[str]:
    text = (ROOT / "docs" / "extending.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    line = next(line for line in body.splitlines() if line.startswith("Files it touches:"))
    return set(re.findall(r"`([^`]+)`", line))


@pytest.mark.parametrize("section", sorted(TOUCHES))
def test_extending_names_exactly_the_files_touched(section):
    files = _touches(section)
    assert files == TOUCHES[section], files
    for path in files:
        assert (ROOT / path.replace("<name>.py", "")).exists(), path  # the file, or the folder a new one goes in


def _listed(node, names: set[str]) -> set[str]:
    """The `names` a tuple / list / set literal or a comma-separated string lists."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names}
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and "," in node.value:
        return set(node.value.split(",")) & names
    return set()


def _name_lists(path: Path, names: set[str]):
    """(line, names) of every tuple / list / set literal or comma-separated string in `path` holding two or more of `names`."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if len(found := _listed(node, names)) >= 2:
            yield node.lineno, sorted(found)


def _bound_or_looped_name_lists(path: Path, names: set[str]):
    """(line, names) of each such literal in `path` that is assigned or looped over: the shape of a hand-written "every
    strategy" list. One compared with (an expected value) or handed to a call (the strategies a test picks) is not."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        value = (node.value if isinstance(node, (ast.Assign, ast.AnnAssign))
                 else node.iter if isinstance(node, (ast.For, ast.comprehension)) else None)
        if len(found := _listed(value, names)) >= 2:
            yield value.lineno, sorted(found)


def _strategy_proofs() -> list[Path]:
    """The suites docs/extending.md names as a new strategy's proof."""
    body = (ROOT / "docs" / "extending.md").read_text().split("## A strategy\n", 1)[1].split("\n## ", 1)[0]
    return sorted({ROOT / path for path in re.findall(r"`(suites/[^`:]+\.py)", body)})


def test_no_hand_written_strategy_list_outside_the_registry():
    """A second list of strategy names would be one more file a new strategy touches: none is left in the product,
    the asv benchmarks or ci/ (experiments, which pick the strategies they study, excepted), and none is assigned or
    looped over in the suites that prove a new strategy (it would be left out of its proof); other tests pick the
    strategies they study."""
    names = set(REGISTRY)
    files = [p for p in (ROOT / "harness").rglob("*.py") if "strategies" not in p.parts]
    files += list((ROOT / "suites" / "asv").glob("*.py"))
    files += [p for p in (ROOT / "ci").rglob("*.py") if "experiments" not in p.parts]
    found = {str(p.relative_to(ROOT)): list(_name_lists(p, names)) for p in files}
    proofs = {str(p.relative_to(ROOT)): list(_bound_or_looped_name_lists(p, names)) for p in _strategy_proofs()}
    assert {"suites/test_negative_controls.py", "suites/gpu/test_gpu_correctness.py"} <= set(proofs), sorted(proofs)
    found |= proofs
    assert not {k: v for k, v in found.items() if v}, found


def test_no_hand_written_list_is_caught(tmp_path):
    """Negative control: the old asv default is found; in a proof suite, the old NaN-propagation and torch-on-CUDA
    lists and a loop over names are, an expected value and the strategies handed to a call are not."""
    planted = tmp_path / "bench.py"
    planted.write_text('STRATEGIES = "stock,gather_cast,shadow,native_fp8".split(",")\nX = ("stock", "gather_cast")\n')
    assert sorted(line for line, _ in _name_lists(planted, set(REGISTRY))) == [1, 2]
    proof = tmp_path / "test_proof.py"
    proof.write_text('strategies = ("stock", "gather_cast", "shadow", "native_fp8")\n'
                     'wanted = [n for n in ("gather_cast", "shadow", "native_fp8") if REGISTRY[n].unsupported_reason(d, b) is None]\n'
                     'for name in ["stock", "shadow"]:\n    check(name)\n'
                     'assert FAULT_TARGETS[fault] == ("native_fp8", "fused_fp8")\n'
                     'cannot_fire(faults, ("stock", "shadow"), case)\n')
    assert sorted(line for line, _ in _bound_or_looped_name_lists(proof, set(REGISTRY))) == [1, 2, 3]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
