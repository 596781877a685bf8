"""harness/envvars.py: every MLA_HARNESS_* / MLA_ASV_* / MLA_SGLANG_* variable is declared once, docs/environment.md
carries the generated table, a bad value is one line naming the variable (exit 2), and the asv
benchmarks raise it from setup (not at discovery), falling back on a base commit without envvars."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import envvars
from harness.spec.scenario import MAX_REPEATS
from suites.hang_guard import HANG_GUARD_S
from suites.helpers import fresh_asv_module

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"\bMLA_(?:HARNESS|ASV|SGLANG)_[A-Z0-9_]*[A-Z0-9]\b")
SEARCHED = ("harness", "suites", "ci", ".ci", ".github", "docs", "conftest.py", "README.md", "pyproject.toml")


def _mentions(root: Path = ROOT) -> dict[str, set[str]]:
    """Variable name -> files (outside envvars.py and docs/) that name it."""
    found: dict[str, set[str]] = {}
    for top in SEARCHED:
        paths = [root / top] if (root / top).is_file() else (root / top).rglob("*")
        for path in paths:
            rel = path.relative_to(root).as_posix()
            if not path.is_file() or "__pycache__" in rel or rel.startswith("docs/evidence/") or path.suffix not in (
                    ".py", ".sh", ".yml", ".md", ".toml", ""):
                continue
            for name in NAME.findall(path.read_text(errors="replace")):
                found.setdefault(name, set()).add(rel)
    return found


def test_every_variable_named_anywhere_is_declared_and_every_declared_one_is_read():
    mentions = _mentions()
    undeclared = {n: sorted(f) for n, f in mentions.items() if n not in envvars.BY_NAME}
    assert not undeclared, f"declare these in harness/envvars.py: {undeclared}"
    unread = [v.name for v in envvars.VARIABLES
              if not mentions.get(v.name, set()) - {"harness/envvars.py", "docs/environment.md"}]
    assert not unread, f"declared but read nowhere: {unread}"


def test_the_scan_sees_an_undeclared_variable(tmp_path):
    """Negative control of the scan: a variable only a planted reader names is found."""
    (tmp_path / "harness").mkdir()
    planted = "MLA_HARNESS_" + "PLANTED"  # spelled apart, so this file does not name it
    (tmp_path / "harness" / "x.py").write_text(f'os.environ.get("{planted}")\n')
    assert _mentions(tmp_path) == {planted: {"harness/x.py"}}


def test_docs_carry_the_generated_table():
    doc = (ROOT / "docs" / "environment.md").read_text()
    assert envvars.markdown() in doc, "regenerate the table: python -m harness.envvars --markdown"
    assert len(envvars.VARIABLES) == len(envvars.BY_NAME) and all(v.kind in envvars.KINDS for v in envvars.VARIABLES)


def test_repeats_bound_is_the_one_cap():
    assert envvars.BY_NAME["MLA_ASV_REPEATS"].maximum == MAX_REPEATS


@pytest.mark.parametrize(("name", "value", "needle"), [
    ("MLA_ASV_REPEATS", "abc", "must be an integer"),
    ("MLA_ASV_REPEATS", "-1", "must be 1..10000, got -1"),
    ("MLA_ASV_REPEATS", "0", "must be 1..10000, got 0"),
    ("MLA_ASV_REPEATS", "1000000000", "must be 1..10000"),
    ("MLA_ASV_REPEATS", "9" * 5000, "must be 1..10000, got a 5000-digit number"),  # past int()'s digit limit: a traceback
    ("MLA_HARNESS_NUM_GPUS", "-" + "9" * 5000, "must be 1..1024, got a 5000-digit number"),
    ("MLA_ASV_SCENARIOS", "nope", "unknown name 'nope'"),
    ("MLA_ASV_SCENARIOS", "b1-l500,", "none empty"),
    ("MLA_ASV_SCENARIOS", "b1-l500,b1-l500", "twice"),
    ("MLA_ASV_STRATEGIES", "nope", "unknown name 'nope'"),
    ("MLA_ASV_PRESETS", "glm5-tp8,nope", "unknown name 'nope'"),
    ("MLA_ASV_TPOT", "yes", "must be 0 or 1"),
    ("MLA_HARNESS_STRICT_SKIPS", "true", "must be 0 or 1"),
    ("MLA_HARNESS_NUM_GPUS", "-3", "must be 1..1024"),
    ("MLA_HARNESS_GOLDEN_DIR", " ", "set but empty"),
    ("MLA_HARNESS_NUM_GPUS", "+3", "must be an integer"),
    ("MLA_HARNESS_NUM_GPUS", "1_0", "must be an integer"),
    ("MLA_HARNESS_NUM_GPUS", "\u0663", "must be an integer"),
    ("MLA_HARNESS_GIT_COMMIT", "   ", "set but empty"),
    ("MLA_HARNESS_GIT_COMMIT", "abc\ndef", "printable UTF-8"),
    ("MLA_HARNESS_GIT_COMMIT", "\udcff\udcfe", "printable UTF-8"),  # undecodable bytes, as os.environ hands them over
])
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch, capsys, name, value, needle):
    for var in envvars.VARIABLES:
        monkeypatch.delenv(var.name, raising=False)
    monkeypatch.setenv(name, value)
    assert envvars.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {name}: ") and needle in err, err


@pytest.mark.parametrize(("name", "value"), [("MLA_HARNESS_GIT_COMMIT", "  "), ("MLA_HARNESS_GOLDEN_DIR", ""),
                                           ("MLA_HARNESS_NUM_GPUS", "+3")])
def test_harness_commands_check_the_variables_before_any_work(monkeypatch, capsys, name, value):
    """`python -m harness` refuses a bad variable up front (one line, exit 2), not when it first reads it (for the
    commit: when the results are written, after the whole run)."""
    from harness.cli import main

    monkeypatch.setenv(name, value)
    assert main(["run", "--device", "cpu", "--scenario", "b1-l500", "--strategy", "gather_cast", "--repeats", "0"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"error: {name}: ") and captured.err.count("\n") == 1
    monkeypatch.delenv(name)  # twin: unset, the same run passes
    assert main(["run", "--device", "cpu", "--scenario", "b1-l500", "--strategy", "gather_cast", "--repeats", "0"]) == 0


def test_good_values_parse(monkeypatch, capsys):
    env = {"MLA_ASV_REPEATS": " 12", "MLA_ASV_SCENARIOS": "b1-l500, b32-l4096", "MLA_ASV_STRATEGIES": "shadow", "MLA_ASV_TPOT": "1",
           "MLA_ASV_PRESETS": "deepseek-v3-tp8,glm5-tp8"}
    assert envvars.read("MLA_ASV_REPEATS", env) == 12
    assert envvars.read("MLA_ASV_PRESETS", env) == ("deepseek-v3-tp8", "glm5-tp8")
    assert envvars.read("MLA_ASV_SCENARIOS", env) == ("b1-l500", "b32-l4096")
    assert envvars.read("MLA_ASV_STRATEGIES", env) == ("shadow",)
    assert envvars.read("MLA_ASV_TPOT", env) is True and envvars.read("MLA_ASV_TPOT", {}) is None
    for var in envvars.VARIABLES:
        monkeypatch.delenv(var.name, raising=False)
    assert envvars.main([]) == 0 and "no MLA_HARNESS_* / MLA_ASV_* / MLA_SGLANG_* variable set" in capsys.readouterr().out


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "harness.envvars"], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "MLA_ASV_REPEATS": "abc"}, timeout=HANG_GUARD_S)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: MLA_ASV_REPEATS: must be an integer 1..10000, got 'abc'"


@pytest.mark.parametrize(("name", "value"), [("MLA_ASV_REPEATS", "abc"), ("MLA_ASV_REPEATS", "-1"), ("MLA_ASV_SCENARIOS", "nope"),
                                             ("MLA_ASV_STRATEGIES", "nope"), ("MLA_ASV_PRESETS", "nope"), ("MLA_ASV_PRESETS", "glm5-tp8,")])
def test_asv_benchmarks_import_and_setup_names_the_variable(monkeypatch, name, value):
    """A name no harness knows (the checkout's own refuses it too: a typo) fails setup, as a bad number does."""
    bench = fresh_asv_module("benchmarks", monkeypatch, {name: value})  # discovery: no traceback
    assert bench.SCENARIOS and bench.STRATEGIES and bench.PRESETS and bench.REPEATS >= 1
    with pytest.raises(ValueError, match=f"^bad asv environment: {name}: "):
        bench._Measured().setup_cache()
    tpot = fresh_asv_module("bench_tpot", monkeypatch, {name: value, "MLA_ASV_TPOT": "1"})
    with pytest.raises(ValueError, match=f"^bad asv environment: {name}: "):
        tpot._Tpot().setup(*(axis[0] for axis in tpot.PARAMS))


def test_a_bad_number_enables_the_tpot_benchmarks_on_cpu(monkeypatch):
    """So their setup says so (they are not timed on CPU otherwise); a good one leaves them off."""
    assert fresh_asv_module("bench_tpot", monkeypatch, {"MLA_ASV_REPEATS": "abc"}).ENABLED
    assert not fresh_asv_module("bench_tpot", monkeypatch, {"MLA_ASV_REPEATS": "2"}).ENABLED


def test_asv_benchmarks_read_good_values_and_fall_back_without_envvars(monkeypatch):
    env = {"MLA_ASV_REPEATS": "7", "MLA_ASV_SCENARIOS": "b1-l500,edge-kv1", "MLA_ASV_STRATEGIES": "shadow,gather_cast",
           "MLA_ASV_PRESETS": "deepseek-v3-tp8"}
    for without in (False, True):
        for name in ("benchmarks", "bench_tpot"):
            module = fresh_asv_module(name, monkeypatch, env, without_envvars=without)
            assert (module.env_value.__globals__["envvars"] is None) == without
            assert (module.PARAMS, module.REPEATS) == ((["b1-l500", "edge-kv1"], ["shadow", "gather_cast"], ["deepseek-v3-tp8"]), 7)
        assert fresh_asv_module("benchmarks", monkeypatch, env, without_envvars=without).check_env() is None


def test_asv_benchmarks_read_a_variable_the_commits_envvars_does_not_declare(monkeypatch):
    """A base commit's harness/envvars.py from before MLA_ASV_PRESETS: the list is read as such (its names checked in
    setup), not a KeyError at discovery."""
    monkeypatch.setattr(envvars, "BY_NAME", {n: v for n, v in envvars.BY_NAME.items() if n != "MLA_ASV_PRESETS"})
    for name in ("benchmarks", "bench_tpot"):
        module = fresh_asv_module(name, monkeypatch, {"MLA_ASV_PRESETS": "glm5-tp8,deepseek-v3-tp8"})
        assert module.PARAMS[2] == ["glm5-tp8", "deepseek-v3-tp8"] and not module.BAD_ENV


def test_asv_presets_default_to_every_declared_preset_on_cuda_and_glm5_on_cpu(monkeypatch):
    """deepseek-v3-tp8 (its own fused_fp8 tuning rows) is timed on CUDA without naming it, as every preset the
    checkout declares: HEAD's list, also where the commit asv benchmarks lacks one (asv pairs parameters by index,
    so a list of the commit's own would shift them); the CPU asv run stays one pool per scenario."""
    import torch

    from harness.spec import presets

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    bench = fresh_asv_module("benchmarks", monkeypatch, {})
    assert bench.PRESETS == ["glm5-tp8"] and bench.StepDeviceMs.params[2] == bench.PoolBuilds.params[1] == ["glm5-tp8"]
    monkeypatch.setattr(bench, "cuda", lambda: True)
    declared = list(presets.PRESETS)
    monkeypatch.delitem(presets.PRESETS, "deepseek-v3-tp8")  # this process's harness plays an older commit's
    assert bench.default_presets() == declared and "deepseek-v3-tp8" in declared


ASV_RUN = """import json, sys
from asv_runner.run import _run
values = []
for benchmark in sys.argv[2:]:
    _run((sys.argv[1], benchmark, "{}", "None", "result.json"))
    values.append(json.load(open("result.json")))
print(json.dumps(values))"""


def _asv_records(tmp_path, cache: str, env: dict[str, str], *benchmarks: tuple[type, tuple]) -> list:
    """What asv records for each (class, params) of suites/asv/benchmarks.py, run as asv runs one (asv_runner's run, in
    a process of its own, setup_cache's value handed over): NaN for a skip (n/a)."""
    import itertools
    import pickle

    (tmp_path / "cache.pickle").write_bytes(pickle.dumps(cache))
    ids = [f"benchmarks.{cls.__name__}.{next(n for n in vars(cls) if n.startswith(('time_', 'track_')))}-"
           f"{list(itertools.product(*cls.params)).index(params)}" for cls, params in benchmarks]
    proc = subprocess.run([sys.executable, "-c", ASV_RUN, str(ROOT / "suites" / "asv"), *ids], cwd=tmp_path, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env}, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_name_this_commit_lacks_makes_only_its_benchmarks_na(monkeypatch, tmp_path):
    """asv runs HEAD's lists (the perf gate's, asv publish's pinned MLA_ASV_STRATEGIES) against older commits: a
    strategy, scenario or preset the commit's harness lacks is n/a there (asv records a skip; the gate: added at the
    head), the rest is timed. Before, setup_cache refused the list: every benchmark of that commit failed. A name the
    checkout's harness refuses too is a typo and still fails setup."""
    pytest.importorskip("asv_runner")
    from collections import Counter

    from harness import strategies
    from harness.execute.prepared import PreparedCase
    from harness.spec import presets, scenario

    monkeypatch.setattr(PreparedCase, "builds", Counter())  # pools this process's other tests built
    monkeypatch.delitem(strategies.REGISTRY, "shadow")  # this process's harness plays an older commit's
    monkeypatch.delitem(presets.PRESETS, "deepseek-v3-tp8")
    monkeypatch.setattr(scenario, "builtin_names", lambda real=scenario.builtin_names: [n for n in real() if n != "b32-l4096"])
    env = {"MLA_ASV_SCENARIOS": "b1-l500,b32-l4096", "MLA_ASV_STRATEGIES": "gather_cast,shadow",
           "MLA_ASV_PRESETS": "glm5-tp8,deepseek-v3-tp8", "MLA_ASV_REPEATS": "2"}
    bench = fresh_asv_module("benchmarks", monkeypatch, env)
    cache = bench._measure_all()
    lacking = [(bench.StepMs, ("b1-l500", "shadow", "glm5-tp8")), (bench.StepMs, ("b32-l4096", "gather_cast", "glm5-tp8")),
               (bench.StepMs, ("b1-l500", "gather_cast", "deepseek-v3-tp8")), (bench.PoolBuilds, ("b1-l500", "deepseek-v3-tp8"))]
    for cls, params in lacking:
        with pytest.raises(NotImplementedError, match="is not in this commit's harness"):
            cls().setup(cache, *params)
    timed = [(bench.StepMs, ("b1-l500", "gather_cast", "glm5-tp8")), (bench.PoolBuilds, ("b1-l500", "glm5-tp8"))]
    *skips, step, builds = _asv_records(tmp_path, cache, env, *lacking, *timed)
    assert all(math.isnan(v) for v in skips) and all(v > 0 for v in step["samples"]) and builds == 1, (skips, step, builds)
    tpot = fresh_asv_module("bench_tpot", monkeypatch, {**env, "MLA_ASV_TPOT": "1"})
    with pytest.raises(NotImplementedError, match="^shadow is not in this commit's harness"):
        tpot._Tpot().setup("b1-l500", "shadow", "glm5-tp8")
    typo = fresh_asv_module("benchmarks", monkeypatch, {**env, "MLA_ASV_STRATEGIES": "gather_cast,shadw"})
    with pytest.raises(ValueError, match="^bad asv environment: MLA_ASV_STRATEGIES: unknown name 'shadw'"):
        typo._measure_all()


@pytest.mark.parametrize("value", ["-3", "0", "abc", ""])
def test_gpu_binding_refuses_a_bad_gpu_count(monkeypatch, value):
    """MLA_HARNESS_NUM_GPUS=-3 used to bind no GPU without a word; now a usage error naming it."""
    from suites.plugins.gpu_binding import detect_devices

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("MLA_HARNESS_NUM_GPUS", value)
    with pytest.raises(pytest.UsageError, match="^MLA_HARNESS_NUM_GPUS: "):
        detect_devices()


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "On", "yes", "Y", "0", "", "false", "enable", " 1", "2"])
def test_triton_interpreted_reads_the_variable_as_triton_does(monkeypatch, value):
    """The gate, the Triton kernels' dtype rule and the SGLang strategy's CPU check read TRITON_INTERPRET through
    envvars.triton_interpreted; it must agree with Triton itself (they tested `== "1"`: Triton interprets under
    `true` too, and `0` interprets nothing)."""
    knobs = pytest.importorskip("triton.knobs", reason="Triton is not installed (the test extra adds it)")
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert envvars.triton_interpreted(value) is knobs.runtime.interpret
