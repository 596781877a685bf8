"""ci/shard_plan.py: the measured sharding model, and the choice it makes for small and large suites;
suites/plugins/pool_groups.py: one xdist group per case pool, and one pool build per group."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from ci import shard_plan
from harness.execute.prepared import PreparedCase
from harness.inputs.cases import load_case
from suites.hang_guard import HANG_GUARD_S
from suites.plugins import binding_proof, pool_groups

REPO = Path(__file__).resolve().parents[1]
JUNIT = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
<testcase classname="suites.gpu.test_a" name="test_x[1]" time="14.0"/>
<testcase classname="suites.gpu.test_a" name="test_y@pool-c" time="1.0"/>
<testcase classname="suites.gpu.test_b" name="test_z" time="0.4"><skipped message="no"/></testcase>
</testsuite></testsuites>"""


def test_fit_from_timed_runs(tmp_path):
    (tmp_path / "j.xml").write_text(JUNIT)
    durations = shard_plan.junit_durations(tmp_path / "j.xml")
    assert durations == {"suites/gpu/test_a.py::test_x[1]": 14.0, "suites/gpu/test_a.py::test_y": 1.0}
    model = shard_plan.fit([(0, 20.0, durations), (1, 50.0, {}), (2, 40.0, {})])
    assert model["overhead_s"] == {"0": 5.0, "1": 35.0, "2": 32.5}
    assert model["wall_s"] == {"0": 20.0, "1": 50.0, "2": 40.0}
    with pytest.raises(ValueError, match="WORKERS 0"):
        shard_plan.fit([(2, 40.0, durations)])
    with pytest.raises(ValueError, match="all skipped"):
        shard_plan.fit([(0, 20.0, {})])


def test_fit_rejects_bad_runs(tmp_path, capsys):
    (tmp_path / "j.xml").write_text(JUNIT)
    good = f"0:20:{tmp_path / 'j.xml'}"
    assert shard_plan.main(["fit", "--out", str(tmp_path / "m.json"), good, f"2:12.5:{tmp_path / 'j.xml'}"]) == 0
    out = capsys.readouterr().out
    assert "| no xdist | 20.0 | 15.0 | 1.00x |" in out and "| -n 2 | 12.5 | 15.0 | 1.60x |" in out
    for bad in ("0:20", "x:20:j.xml", "0:-1:j.xml", f"0:20:{tmp_path / 'missing.xml'}"):
        assert shard_plan.main(["fit", "--out", str(tmp_path / "m.json"), "--force", bad]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    assert shard_plan.main(["fit", "--out", str(tmp_path / "m.json"), "--force", good, good]) == 2  # one run per WORKERS
    assert "same WORKERS" in capsys.readouterr().err


def test_committed_model_reproduces_its_runs_and_keeps_them_unsharded_when_measured_slower():
    """The committed model predicts its own measured walls, and chooses sharding only where they say it paid."""
    model = json.loads((REPO / "ci" / "shard_model.json").read_text())
    walls = {int(n): w for n, w in model["wall_s"].items()}
    for n, wall in walls.items():
        assert shard_plan.predict(model, model["work_s"], n) == pytest.approx(wall, abs=0.01)
    measured_best = max((n for n in walls if n), key=lambda n: walls[0] / walls[n])
    pays = walls[0] / walls[measured_best] >= model["min_speedup"]
    assert shard_plan.choose(model, model["work_s"], gpus=max(walls))[0] == (measured_best if pays else 0)


def test_negative_control_a_large_suite_is_sharded():
    model = json.loads((REPO / "ci" / "shard_model.json").read_text())
    assert shard_plan.choose(model, 2000.0, gpus=2)[0] == 2
    workers, why = shard_plan.choose(model, 2000.0, gpus=8)
    assert workers == 8 and "-n 8 predicted" in why  # beyond 2 workers: the largest measured xdist overhead
    assert shard_plan.choose(model, 1.0, gpus=2)[0] == 0  # a tiny suite never pays for start-up


def test_suite_work_counts_unseen_tests_as_typical():
    model = {"durations": {"a": 1.0, "b": 3.0, "c": 10.0}, "work_s": 14.0, "tests": 3}
    assert shard_plan.suite_work(model, ["a", "c", "new"]) == 14.0  # new counts as the median, 3.0
    assert shard_plan.suite_work({"durations": {}, "work_s": 15.0, "tests": 30}, ["x"] * 4) == 2.0


DUMP_GROUPS = """
import json, os
def pytest_collection_finish(session):
    with open(os.environ["GROUPS_OUT"], "w") as f:
        json.dump({i.nodeid: [m.args[0] for m in i.iter_markers("xdist_group")] for i in session.items}, f)
"""


def _collected_groups(tmp_path, *extra) -> dict[str, list[str]]:
    """nodeid -> xdist_group names of `pytest --collect-only suites/gpu -m gpu` (works on CPU)."""
    (tmp_path / "dump_groups.py").write_text(DUMP_GROUPS)
    out = tmp_path / f"groups{len(extra)}.json"
    env = {**os.environ, "GROUPS_OUT": str(out), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "dump_groups", *extra, "suites/gpu", "-m", "gpu"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


def _split_cases(groups: dict[str, list[str]]) -> dict[str, set[str]]:
    """Production case -> the groups its tests landed in (one each when every case is one group)."""
    by_case = defaultdict(set)
    for nodeid, names in groups.items():
        for case in (c for c in ("b1-l500", "b1-l4096", "b32-l4096", "b128-l2048", "multistep-reuse")
                     if f"glm5-tp8.prod.{c}-" in nodeid or f"glm5-tp8.prod.{c}]" in nodeid):
            by_case[case].add(",".join(names) or "(none)")
    return by_case


def test_every_production_case_is_one_xdist_group(tmp_path):
    groups = _collected_groups(tmp_path)
    assert len(groups) > 100
    assert all(len(names) == 1 for names in _split_cases(groups).values())
    assert _split_cases(groups)["b1-l4096"] == {"pool-glm5-tp8.prod.b1-l4096"}
    # test_perf's module fixture prepares b1-l4096 (its CASE): same group as the parametrized tests
    perf = [n for nodeid, n in groups.items() if nodeid.startswith("suites/gpu/test_perf.py::")]
    assert perf and all(n == ["pool-glm5-tp8.prod.b1-l4096"] for n in perf)
    assert not any(n for nodeid, n in groups.items() if "test_hidden_shapes_against_float64" in nodeid)
    sizes = defaultdict(int)
    for names in groups.values():
        sizes[names[0] if names else None] += 1
    assert max(n for g, n in sizes.items() if g) < len(groups) / 4  # no group holds a quarter of the suite
    # negative control: without the plugin no test is grouped, so a case's tests scatter over workers
    ungrouped = _collected_groups(tmp_path, "-p", "no:suites.plugins.pool_groups")
    assert set(ungrouped) == set(groups) and not any(ungrouped.values())
    assert _split_cases(ungrouped)["b1-l4096"] == {"(none)"}


def test_shared_prepared_case_builds_each_pool_once(tmp_path):
    cpu = torch.device("cpu")
    before = PreparedCase.builds.copy()
    pool_groups.SharedPreparedCase.held = None
    first = pool_groups.SharedPreparedCase(load_case("glm5-tp8.ci.b1-l500"), cpu, "torch").build()
    again = pool_groups.SharedPreparedCase(load_case("glm5-tp8.ci.b1-l500"), cpu, "torch").build()
    assert again.pool is first.pool and again.build_s == 0.0 and again.data is not first.data
    assert PreparedCase.builds["glm5-tp8.ci.b1-l500"] - before["glm5-tp8.ci.b1-l500"] == 1
    other = pool_groups.SharedPreparedCase(load_case("glm5-tp8.ci.b1-l4096"), cpu, "torch").build()  # another seed
    assert other.pool is not first.pool and pool_groups.SharedPreparedCase.held[1] is other.pool
    # negative control: the plain PreparedCase builds a pool per instance
    plain = PreparedCase(load_case("glm5-tp8.ci.b1-l500"), cpu, "torch").build()
    assert plain.pool is not first.pool and PreparedCase.builds["glm5-tp8.ci.b1-l500"] - before["glm5-tp8.ci.b1-l500"] == 2
    # each test process reports its builds in the binding-proof record
    record = binding_proof.Record("gw0", 1, "0")
    record.finish(binding_proof.NvmlProbe(smi=lambda *_: ""))
    assert record.pool_builds["glm5-tp8.ci.b1-l500"] >= 2
    pool_groups.SharedPreparedCase.held = None


def test_shared_prepared_case_plans_without_the_pool_it_holds():
    """The plan comes before `build`: a held pool the next case will not reuse is let go first (on an 80 GB H100 the
    last GLM-5 prod pool held beside a 67 GiB plan refused 16 prod cases), and one it reuses is not counted twice."""
    cpu = torch.device("cpu")
    shared = pool_groups.SharedPreparedCase
    shared.held = None
    first = shared(load_case("glm5-tp8.ci.b1-l500"), cpu, "torch").build()
    again = shared(load_case("glm5-tp8.ci.b1-l500"), cpu, "torch")
    pool = dict(again.memory_plan(["stock"]).items)["fp8 pool"]
    assert pool == 0 and shared.held[1] is first.pool  # reused: already in memory
    other = shared(load_case("glm5-tp8.ci.b1-l4096"), cpu, "torch")  # another seed: another pool
    assert dict(other.memory_plan(["stock"]).items)["fp8 pool"] == other.geometry.total_bytes and shared.held is None
    shared.held = None


def _shards_without_groups(text: str) -> list[str]:
    """Command lines that start xdist workers (-n N, -n "$VAR") without --dist loadgroup."""
    starts = re.compile(r'(?:^|[\s(])-n (?:\d+|"\$[A-Z_]+")(?=[\s)]|$)')
    return [line.strip() for line in text.splitlines()
            if not line.lstrip().startswith("#") and starts.search(line) and "--dist loadgroup" not in line]


def test_sharded_runs_use_loadgroup():
    for path in (".github/workflows/gpu-correctness.yml", "ci/experiments/shard_refit/run.sh"):
        text = (REPO / path).read_text()
        assert "--dist loadgroup" in text and not _shards_without_groups(text), path
    # negative control: a sharded line without the groups is found
    assert _shards_without_groups('python -m pytest suites/gpu -n 2 --binding-proof x')
    assert _shards_without_groups('if [ "$W" -gt 0 ]; then xdist=(-n "$WORKERS"); fi')
    assert not _shards_without_groups('if [ -n "${OUT:-}" ]; then tar x; fi')


def _workers_by_group(*extra) -> dict[str, set[str]]:
    """Group (the b1-l4096 pool's tests, or each other test alone) -> the xdist workers that ran it,
    from a CPU run (GPU tests skip) of two GPU modules under -n 2 --dist loadgroup."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *extra, "-n", "2",
                           "--dist", "loadgroup", "suites/gpu/test_perf.py", "suites/gpu/test_gpu_correctness.py",
                           "-m", "gpu"], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
    ran = re.findall(r"^\[(gw\d)\] .*? (suites/gpu/\S+)", proc.stdout, re.M)
    # every test the workers collected (xdist's "2 workers [N items]": their -m gpu selection) is seen run
    collected = re.findall(r"^2 workers \[(\d+) items?\]$", proc.stdout, re.M)
    assert collected and len(ran) == int(collected[0]) > 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    workers = defaultdict(set)
    for worker, nodeid in ran:
        b1_l4096 = nodeid.startswith("suites/gpu/test_perf.py") or "b1-l4096" in nodeid or "scale-error" in nodeid
        workers["b1-l4096" if b1_l4096 else nodeid].add(worker)
    return workers


def test_loadgroup_sends_a_case_pool_to_one_worker():
    """On this pytest too (9.2 drops xdist's '@group' node ids): the b1-l4096 pool's 21 tests, one worker."""
    assert _workers_by_group()["b1-l4096"] in ({"gw0"}, {"gw1"})
    # negative control: without the plugin the same tests are spread over both workers
    assert _workers_by_group("-p", "no:suites.plugins.pool_groups")["b1-l4096"] == {"gw0", "gw1"}


def _bad_input(capsys, argv, *needles):
    assert shard_plan.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and all(n in err for n in needles), err


def test_fit_keeps_an_existing_file_and_its_own_inputs(tmp_path, capsys):
    """fit --out never replaces a file already there (unless --force) nor one of its runs' junit XMLs, even with
    --force: exit 2, one line, the file as it was; the twin: --force replaces an earlier model."""
    (tmp_path / "j.xml").write_text(JUNIT)
    run = f"0:20:{tmp_path / 'j.xml'}"
    (tmp_path / "m.json").write_text("mine")
    _bad_input(capsys, ["fit", "--out", str(tmp_path / "m.json"), run], "m.json", "exists")
    assert (tmp_path / "m.json").read_text() == "mine"
    _bad_input(capsys, ["fit", "--out", str(tmp_path / "j.xml"), "--force", run], "j.xml", "outputs never overwrite inputs")
    assert (tmp_path / "j.xml").read_text() == JUNIT
    assert shard_plan.main(["fit", "--out", str(tmp_path / "m.json"), "--force", run]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["work_s"] > 0


def test_bad_arguments_and_models_are_one_line(tmp_path, capsys):
    """Issue 25 item 11: each used to be a traceback (or, for --gpus -3, a silent 0)."""
    model = str(REPO / "ci" / "shard_model.json")
    _bad_input(capsys, ["choose", "--model", model, "--gpus", "abc"], "--gpus", "'abc'")
    _bad_input(capsys, ["choose", "--model", model, "--gpus", "-3"], "--gpus", "-3")
    _bad_input(capsys, ["choose", "--model", model, "--gpus", "99999999999"], "--gpus", "0..1024")  # choose spun until killed
    _bad_input(capsys, ["choose", "--gpus", "2"], "--model")
    _bad_input(capsys, ["choose", "--model", str(tmp_path / "none.json"), "--gpus", "2"], "none.json", "no such file")
    _bad_input(capsys, ["choose", "--model", str(tmp_path), "--gpus", "2"], str(tmp_path), "cannot read")
    files = {"bad.json": b"{nope", "utf16.json": '{"durations": {}}'.encode("utf-16"), "empty.json": b'{"durations":{}}',
             "list.json": b"[]", "nan.json": json.dumps({"durations": {"a": -1}, "overhead_s": {"0": 1}, "work_s": 1, "tests": 1}).encode()}
    needles = {"bad.json": "not valid JSON", "utf16.json": "UTF-16", "empty.json": "overhead_s: missing",
               "list.json": "JSON object", "nan.json": "durations['a']"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        _bad_input(capsys, ["choose", "--model", str(tmp_path / name), "--gpus", "2"], name, needles[name])
    (tmp_path / "j.xml").write_text(JUNIT)
    run = f"0:20:{tmp_path / 'j.xml'}"
    _bad_input(capsys, ["fit", "--out", str(tmp_path), run], "--out", "is a folder")
    if Path("/dev/full").exists():
        _bad_input(capsys, ["fit", "--out", "/dev/full", run], "/dev/full", "cannot write")
    (tmp_path / "bad.xml").write_text("<testsuites>")
    _bad_input(capsys, ["fit", "--out", str(tmp_path / "m.json"), f"0:20:{tmp_path / 'bad.xml'}"], "bad.xml", "not junit XML")
    for time in ("nan", "abc", "-1", "inf"):  # nan fitted a model of NaN (exit 0); abc named neither the file nor the test
        (tmp_path / "t.xml").write_text(JUNIT.replace('time="14.0"', f'time="{time}"'))
        _bad_input(capsys, ["fit", "--out", str(tmp_path / "m.json"), f"0:20:{tmp_path / 't.xml'}"], "t.xml",
                   "suites/gpu/test_a.py::test_x[1]", f"time '{time}'")
        assert not (tmp_path / "m.json").exists()
    _bad_input(capsys, [], "command")


def test_an_endless_model_is_one_line_not_a_full_memory(tmp_path, capsys, monkeypatch):
    """--model is read at most datafiles.MAX_BYTES, as the harness's data files are (before: read whole, so
    --model /dev/zero filled memory until the kernel killed it). Here the cap is lowered, not the file raised."""
    from harness import datafiles

    monkeypatch.setattr(datafiles, "MAX_BYTES", 1024)
    big = tmp_path / "big.json"
    big.write_text('{"durations": {}}' + " " * 2048)
    _bad_input(capsys, ["choose", "--model", str(big), "--gpus", "2"], "big.json", "more than")


def test_help_exits_0_and_a_good_model_is_chosen_from(capsys, monkeypatch):
    for argv in (["--help"], ["choose", "--help"], ["fit", "--help"]):
        assert shard_plan.main(argv) == 0
        assert "usage:" in capsys.readouterr().out
    seen = []
    monkeypatch.setattr(shard_plan, "collected", lambda args: seen.append(args) or ["t"] * 10)
    assert shard_plan.main(["choose", "--model", str(REPO / "ci" / "shard_model.json"), "--gpus", "2", "suites/gpu", "-m", "gpu"]) == 0
    assert seen == [["suites/gpu", "-m", "gpu"]]  # the pytest arguments, in order
    assert capsys.readouterr().out.strip().isdigit()


def test_sigterm_during_fit_is_an_interruption_and_writes_nothing(tmp_path):
    """A cancelled job's SIGTERM while `fit` works: 'interrupted', exit 130, no --out (before: killed by the signal)."""
    (tmp_path / "j.xml").write_text(JUNIT)
    code = ("import os, signal, sys\nfrom ci import shard_plan\n"
            "shard_plan.fit = lambda runs: os.kill(os.getpid(), signal.SIGTERM) or {}\n"
            "sys.exit(shard_plan.main(sys.argv[1:]))\n")
    out = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, "-c", code, "fit", "--out", str(out), f"0:20:{tmp_path / 'j.xml'}"],
                          capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=Path(shard_plan.__file__).resolve().parents[1])
    assert proc.returncode == 130 and proc.stderr.strip() == "interrupted" and not out.exists(), (proc.returncode, proc.stderr)


def test_a_collection_that_fails_is_bad_input_not_a_smaller_plan(tmp_path, capsys):
    """A test file that does not import made `choose` size the plan on the tests that did collect, exit 0; now it is
    one line naming pytest's exit and its last line, exit 2 (twin: a folder that collects plans)."""
    (tmp_path / "test_broken.py").write_text("import not_a_module_anywhere\n\ndef test_x():\n    pass\n")
    model = str(REPO / "ci" / "shard_model.json")
    assert shard_plan.main(["choose", "--model", model, "--gpus", "2", str(tmp_path / "test_broken.py")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: pytest --collect-only") and "exited 2" in err and len(err.strip().splitlines()) == 1, err
    (tmp_path / "test_broken.py").write_text("def test_x():\n    pass\n")
    assert shard_plan.main(["choose", "--model", model, "--gpus", "2", str(tmp_path / "test_broken.py")]) == 0
