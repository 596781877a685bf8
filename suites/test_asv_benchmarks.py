"""The asv configuration and benchmarks on CPU at ci scale: `asv check`, and a quick per-commit run
through the runner-virtualenv plugin (a commit's own harness, the runner's torch)."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suites.hang_guard import HANG_GUARD_S

pytest.importorskip("asv")

REPO = Path(__file__).resolve().parent.parent
# the whole matrix named: a process that only reads setup_cache's JSON then never imports torch (benchmarks.cuda)
QUICK_ENV = {"MLA_ASV_PRESETS": "glm5-tp8", "MLA_ASV_SCENARIOS": "b1-l500", "MLA_ASV_STRATEGIES": "gather_cast,shadow", "MLA_ASV_REPEATS": "2"}


def asv(*args, cwd, home):
    env = {**os.environ, **QUICK_ENV, "HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "asv", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs the project as a git checkout (asv benchmarks commits)")
    root = tmp_path_factory.mktemp("asv")
    subprocess.run(["git", "clone", "-q", str(REPO), str(root / "repo")], check=True, timeout=HANG_GUARD_S)
    # benchmark this working tree's asv files even when they are not committed yet
    asv_files = [str(p.relative_to(REPO)) for p in (REPO / "suites" / "asv").glob("*.py")]
    for rel in ("asv.conf.json", "ci/asv_runner_env.py", "ci/__init__.py", *asv_files):
        (root / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, root / "repo" / rel)
    home = root / "home"
    home.mkdir()
    assert asv("machine", "--yes", "--machine", "ci-cpu", cwd=root / "repo", home=home).returncode == 0
    return root / "repo", home


def test_asv_check(clone):
    repo, home = clone
    proc = asv("check", "-E", f"existing:{sys.executable}", cwd=repo, home=home)
    assert proc.returncode == 0 and "No problems found" in proc.stdout, proc.stdout + proc.stderr


def test_quick_run_in_a_per_commit_environment(clone):
    repo, home = clone
    proc = asv("run", "--quick", "--machine", "ci-cpu", "--show-stderr", "HEAD^!", cwd=repo, home=home)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [p for p in (repo / ".asv" / "results" / "ci-cpu").glob("*.json") if p.name != "machine.json"]
    assert results, "asv wrote no results"
    data = json.loads(results[0].read_text())
    assert data["results"]["benchmarks.StepMs.time_step"][1] == [["'b1-l500'"], ["'gather_cast'", "'shadow'"], ["'glm5-tp8'"]]
    step = data["results"]["benchmarks.StepMs.time_step"][0]
    assert all(v is not None and v > 0 for v in step), step  # gather_cast and shadow both measured (seconds)
    cast = data["results"]["benchmarks.CastUs.time_cast"][0]
    assert cast[0] > 0 and math.isnan(cast[1])  # shadow has no cast kernel: skipped (NaN), not failed
    builds = data["results"]["benchmarks.PoolBuilds.track_pool_builds"][0]
    print(f"asv pool builds per scenario: {builds}")
    assert builds == [1], builds  # every metric of every strategy came from one pool build


def test_every_preset_is_timed_on_a_pool_of_its_own(monkeypatch):
    """The preset is an axis of every benchmark (MLA_ASV_PRESETS; on CUDA every declared preset by default):
    deepseek-v3-tp8 is built and timed beside glm5-tp8, one pool each, not glm5-tp8 alone."""
    from collections import Counter

    from harness.execute.prepared import PreparedCase
    from suites.helpers import fresh_asv_module

    presets = ["glm5-tp8", "deepseek-v3-tp8"]
    bench = fresh_asv_module("benchmarks", monkeypatch, {**QUICK_ENV, "MLA_ASV_STRATEGIES": "gather_cast", "MLA_ASV_PRESETS": ",".join(presets)})
    monkeypatch.setattr(PreparedCase, "builds", Counter())  # pools built by this process's other tests
    cache = bench._measure_all()
    assert PreparedCase.builds == {f"{p}.ci.b1-l500": 1 for p in presets}
    for preset in presets:
        builds = bench.PoolBuilds()
        builds.setup(cache, "b1-l500", preset)
        assert builds.track_pool_builds(cache, "b1-l500", preset) == 1
        bench.StepMs().setup(cache, "b1-l500", "gather_cast", preset)
        assert len(bench.CLOCK.samples) == 2 and all(v > 0 for v in bench.CLOCK.samples), preset


def test_tpot_steps_the_presets_model(monkeypatch):
    """The TPOT benchmark's preset decides the model it steps (its models.toml shape: deepseek-v3-tp8's for
    deepseek-v3-tp8), not glm5-tp8's always."""
    import torch

    from harness.tpot import tpot
    from suites.helpers import fresh_asv_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    bench = fresh_asv_module("bench_tpot", monkeypatch, {**QUICK_ENV, "MLA_ASV_TPOT": "1", "MLA_ASV_PRESETS": "glm5-tp8,deepseek-v3-tp8"})
    real, seen = tpot.build_context, []

    def build_context(case, shape, *args):
        seen.append((case.preset.name, shape.name))
        return real(case, shape, *args)

    monkeypatch.setattr(tpot, "build_context", build_context)
    timed = bench.TpotMs()
    timed.setup("b1-l500", "gather_cast", "deepseek-v3-tp8")
    assert seen == [("deepseek-v3-tp8", "deepseek-v3-tp8")] and timed.track_tpot_ms("b1-l500", "gather_cast", "deepseek-v3-tp8") > 0


def test_benchmarks_import_the_flat_layout_of_older_commits(monkeypatch):
    """asv times older commits with these files: a module of the pipeline layout falls back to its earlier flat
    name; the twin: a name with no earlier one still fails."""
    import importlib
    import types

    from suites.asv import benchmarks

    flat = types.ModuleType("harness.prepared")
    real = importlib.import_module

    def old_tree(name, *args):
        if name == "harness.execute.prepared":
            raise ModuleNotFoundError(name)
        return flat if name == "harness.prepared" else real(name, *args)

    monkeypatch.setattr(importlib, "import_module", old_tree)
    assert benchmarks.harness_module("harness.execute.prepared") is flat
    assert set(benchmarks.LAYOUT_MOVE) >= {"harness.measure.collect", "harness.tpot.tpot"}
    with pytest.raises(ModuleNotFoundError):
        benchmarks.harness_module("harness.no_such_module")


def test_a_clock_disturbed_timing_fails_its_benchmark(monkeypatch):
    """A timing the clock guard found disturbed is no measurement (docs/gating.md): its benchmark fails (the asv gate
    then cannot judge, exit 2) instead of handing asv the samples, which a throttled head turns into a false
    regression and a throttled base into a hidden one. Twin: the same timing undisturbed is handed over."""
    from harness.measure import collect
    from suites.asv import benchmarks

    real = collect.guarded

    def planted(block, device):
        samples, guard = real(block, device)
        return samples, {**(guard or {}), "disturbed": "SM clock 1410 -> 990 MHz (planted)"}

    monkeypatch.setattr(benchmarks, "STRATEGIES", ["gather_cast"])
    monkeypatch.setattr(benchmarks, "BAD_ENV", [])  # what an earlier test's bad MLA_ASV_* value left
    clean = benchmarks._measure_all()
    monkeypatch.setattr(collect, "guarded", planted)
    disturbed = benchmarks._measure_all()
    scenario, preset = benchmarks.SCENARIOS[0], benchmarks.PRESETS[0]
    benchmarks.CastUs().setup(clean, scenario, "gather_cast", preset)
    with pytest.raises(RuntimeError, match=r"cast_us of gather_cast in .*: clock guard: SM clock 1410 -> 990 MHz \(planted\)"):
        benchmarks.CastUs().setup(disturbed, scenario, "gather_cast", preset)


def test_tpot_attn_share_is_what_harness_tpots_row_says(monkeypatch):
    """bench_tpot repeated harness tpot's rule (a share on CUDA only) in an `if CUDA` of its own: it now tracks the
    value of tpot's attn_share_row, a share the row gives on CPU too. Twin: where the row is null (CPU) n/a, with its
    reason, raised by setup (asv records a NotImplementedError from the benchmark itself as failed). A base commit's
    harness from before the row: tpot_ms still measured, attn_share n/a."""

    import torch

    from harness.results.schema import Row
    from harness.tpot import tpot
    from suites.helpers import fresh_asv_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    bench = fresh_asv_module("bench_tpot", monkeypatch, {"MLA_ASV_TPOT": "1", "MLA_ASV_REPEATS": "2"})
    params, share = (bench.PARAMS[0][0], "gather_cast", bench.PARAMS[2][0]), bench.AttnShare()
    real = tpot.attn_share_row
    monkeypatch.setattr(tpot, "attn_share_row", lambda ctx, r, ident: Row(strategy=r.strategy, metric="attn_share", value=0.25, **ident))
    share.setup(*params)
    assert share.track_attn_share(*params) == 0.25
    monkeypatch.setattr(tpot, "attn_share_row", real)
    with pytest.raises(NotImplementedError, match=r"^gather_cast: on cpu attn_path_ms and tpot_ms .* \(CUDA only\)$"):
        share.setup(*params)
    monkeypatch.delattr(tpot, "attn_share_row")
    with pytest.raises(NotImplementedError, match="has no attn_share_row"):
        share.setup(*params)
    assert share.values["tpot_ms"] > 0


def test_bench_tpot_plans_the_strategys_buffer_where_the_harness_can(monkeypatch):
    """bench_tpot built its context planning no strategy buffer (shadow's BF16 copy of the pool went unplanned). It now
    names its strategy to a build_context that takes `strategies`; twin: a base commit's, from before it, gets none
    (an unexpected keyword there would fail every tpot benchmark of that commit)."""
    import torch

    from harness.tpot import tpot
    from suites.helpers import fresh_asv_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    bench = fresh_asv_module("bench_tpot", monkeypatch, {**QUICK_ENV, "MLA_ASV_TPOT": "1"})
    real, seen = tpot.build_context, []

    def current(case, shape, *args, strategies=()):
        seen.append(strategies)
        return real(case, shape, *args, strategies=strategies)

    def older(case, shape, *args):
        seen.append("older")
        return real(case, shape, *args)

    for stand_in in (current, older):
        monkeypatch.setattr(tpot, "build_context", stand_in)
        bench.TpotMs().setup("b1-l500", "gather_cast", "glm5-tp8")
    assert seen == [("gather_cast",), "older"]
