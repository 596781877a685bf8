"""The CLI end to end: exit codes 0/1/2, one-line errors, JSON results, repro bundles, golden refresh."""

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from harness.cli import main
from harness.inputs import cases
from harness.inputs.cases import GOLDEN_DIR
from harness.inputs.reference import StepInputs, mla_decode_f64
from harness.verify import golden
from suites.hang_guard import HANG_GUARD_S
from suites.helpers import repro_words

ROOT = Path(__file__).resolve().parent.parent


def harness(*args, env=None, golden_dir=None, cwd=ROOT):
    """`python -m harness ARGS`: in a fresh process when `env` is given, else in this one (with
    `golden_dir` standing in for MLA_HARNESS_GOLDEN_DIR)."""
    if env is not None:
        full_env = {**os.environ, **env}
        return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=HANG_GUARD_S)
    out, err = io.StringIO(), io.StringIO()
    saved = cases._golden_dir_flag
    if golden_dir is not None:
        cases.use_golden_dir(Path(golden_dir))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse errors
        code = exc.code
    finally:
        cases.use_golden_dir(saved)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def _one_error_line(proc, *fragments):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def test_run_default_passes_and_writes_results(tmp_path):
    out = tmp_path / "r.json"
    proc = harness("run", "--device", "cpu", "--repeats", "2", "--json", str(out), "--dump-outputs", str(tmp_path / "dump"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "mla-harness-results/5" and repro_words(doc["repro"])[1][0] == "run"
    assert doc["environment"]["torch"] and "git_commit" in doc["environment"]
    verdicts = {r["strategy"]: r["value"] for r in doc["rows"] if r["metric"] == "verdict"}
    assert verdicts == {"stock": "pass", "stock_vectorized": "unsupported", "gather_cast": "pass", "shadow": "pass", "native_fp8": "pass",
                        "fused_fp8": "unsupported"}
    metrics = {(r["strategy"], r["metric"]) for r in doc["rows"]}
    assert {("stock", "cast_us"), ("gather_cast", "attn_us"), ("shadow", "step_ms"), ("shadow", "extra_bytes"),
            ("shadow", "bytes_moved")} <= metrics
    dumped = safetensors.torch.load_file(tmp_path / "dump" / "glm5-tp8.ci.b1-l4096.gather_cast.safetensors")
    assert dumped["s0.l0.out"].shape == (1, 8, 512)


def test_planted_fault_exits_1(tmp_path):
    proc = harness("run", "--device", "cpu", "--repeats", "0", "--scenario", "b1-l500", "--plant-fault", "remap-off-by-one")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gather_cast" in proc.stderr


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["run", "--preset", "llama"], ["--preset", "unknown preset 'llama'"]),
        (["run", "--scenario", "nope"], ["--scenario", "unknown scenario"]),
        (["run", "--scale", "huge"], ["--scale"]),
        (["run", "--scale", ""], ["--scale", "unknown scale ''"]),  # ran at the default scale, exit 0
        (["tpot", "--scale", "", "--strategy", "gather_cast"], ["--scale", "unknown scale ''"]),
        (["run", "--slots", "128"], ["kv_lens", "needs up to 4096 tokens in 64 64-token pages (4096 slots) but the pool has 128 slots (2 whole pages)"]),
        (["run", "--slots", "100"], ["kv_lens", "64 64-token pages (4096 slots) but the pool has 100 slots (1 whole pages)"]),
        (["run", "--strategy", "magic"], ["--strategy"]),
        (["run", "--plant-fault", "gremlin"], ["--plant-fault"]),
        (["run", "--device", "cuda"], ["--device"] if not torch.cuda.is_available() else ["--device"]),
        (["golden", "verify", "--case", "nope.ci.x"], ["--case"]),
        (["export-inputs", "--step", "5", "--out", "x.safetensors"], ["--step"]),
    ],
)
def test_bad_input_is_one_line_exit_2(args, fragments):
    if args == ["run", "--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("a CUDA device is visible; the no-GPU error cannot be provoked")
    _one_error_line(harness(*args, "--device", "cpu") if args[0] == "run" and "--device" not in args else harness(*args), *fragments)


def test_bad_scenario_files_exit_2(tmp_path):
    bad = {
        "zero.toml": ('name = "z"\nkv_lens = [3, 0]\n', "kv_lens[1]"),
        "dup.toml": ('name = "d"\nkv_lens = [3, 2]\nlayout = "explicit"\nslots = [[5, 6], [6]]\n', "duplicate slot 6"),
        "slot0.toml": ('name = "s"\nkv_lens = [2]\nlayout = "explicit"\nslots = [[0]]\n', "reserved dummy"),
        "broken.toml": ('name = "b"\nkv_lens = [1,\n', "malformed TOML"),
        "huge.toml": ('name = "h"\nkv_lens = [20000]\n', "needs up to 20000 tokens in 313 64-token pages"),
        "digits.toml": ('name = "g"\nkv_lens = [1]\nseed = ' + "9" * 5000 + "\n", "malformed TOML"),  # past int()'s digit limit
    }
    for fname, (text, fragment) in bad.items():
        path = tmp_path / fname
        path.write_text(text)
        _one_error_line(harness("run", "--device", "cpu", "--scale", "ci", "--scenario-file", str(path)), str(path), fragment)
    _one_error_line(harness("run", "--device", "cpu", "--scenario-file", str(tmp_path / "missing.toml")), "missing.toml")


def test_missing_and_corrupt_golden_exit_2_and_leave_disk_alone(tmp_path):
    root = tmp_path / "golden"
    shutil.copytree(GOLDEN_DIR, root)
    case_dir = root / "glm5-tp8.ci.b1-l4096"
    (case_dir / "outputs.safetensors").write_bytes(b"garbage")
    before = {p: p.read_bytes() for p in case_dir.iterdir()}
    env = {"golden_dir": root}
    _one_error_line(harness("run", "--device", "cpu", "--repeats", "0", **env), "outputs.safetensors: not a safetensors file")
    _one_error_line(harness("golden", "verify", "--case", "glm5-tp8.ci.b1-l4096", **env), "outputs.safetensors: not a safetensors file")
    assert {p: p.read_bytes() for p in case_dir.iterdir()} == before
    shutil.rmtree(case_dir)
    _one_error_line(harness("run", "--device", "cpu", "--repeats", "0", **env), "manifest.json", "missing")


def test_refresh_refuses_changed_golden_without_force(tmp_path):
    root = tmp_path / "golden"
    shutil.copytree(GOLDEN_DIR, root)
    name = "glm5-tp8.ci.b1-l500"
    stored = golden.load(name, root)
    stored.tensors["s0.l1.out_fp32"][0, 0, :4] += 0.25
    golden.write(stored, name, root)
    before = (root / name / "outputs.safetensors").read_bytes()
    env = {"golden_dir": root}
    proc = harness("golden", "refresh", "--case", name, **env)
    assert proc.returncode == 1 and "CHANGED, not written" in proc.stdout and "s0.l1.out_fp32" in proc.stdout
    assert (root / name / "outputs.safetensors").read_bytes() == before
    proc = harness("golden", "refresh", "--case", name, "--force", **env)
    assert proc.returncode == 0 and "overwritten" in proc.stdout and "s0.l1.out_fp32" in proc.stdout
    assert harness("golden", "verify", "--case", name, **env).returncode == 0
    proc = harness("golden", "refresh", "--case", name, **env)
    assert proc.returncode == 0 and "unchanged" in proc.stdout


def test_export_inputs_reproduce_the_golden(tmp_path):
    out = tmp_path / "bundle.safetensors"
    proc = harness("export-inputs", "--scenario", "ragged-mix", "--scale", "ci", "--step", "1", "--layer", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    t = safetensors.torch.load_file(out)
    indptr = t["kv_indptr"].tolist()
    rows = [t["l1.rows_u8"][a:b] for a, b in zip(indptr[:-1], indptr[1:])]
    n = len(rows)
    out64, _ = mla_decode_f64(StepInputs(range(n), t["l1.q_nope"], t["l1.q_pe"], rows), 512, 1 / 16)
    gold = golden.load("glm5-tp8.ci.ragged-mix")
    assert torch.equal(out64.float()[torch.as_tensor(gold.positions(1))], gold.out(1, 1))


def test_export_inputs_records_a_layer_named_twice_once(tmp_path):
    out = tmp_path / "bundle.safetensors"
    proc = harness("export-inputs", "--scenario", "b1-l500", "--scale", "ci", "--layer", "1", "--layer", "0", "--layer", "1",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    with safetensors.safe_open(out, "pt") as f:
        assert json.loads(f.metadata()["layers"]) == [1, 0]


def test_export_inputs_record_the_pool_the_repro_and_the_environment(tmp_path):
    """A bundle's metadata names the pool its kv_indices address, the environment and a repro (before: b1-l500 on the
    ci pool and at --slots 32768 wrote the same metadata over other indices, a pool grown to fit went unrecorded, no
    repro, no environment). The repro, run from another folder, writes the same bundle."""
    scenario = tmp_path / "long.toml"
    scenario.write_text('name = "long"\nseed = 1\nsteps = 1\nbatch_size = 1\nkv_len = 20000\n')
    bundles = []
    for name, args in (("ci", ["--scenario", "b1-l500"]), ("wide", ["--scenario", "b1-l500", "--slots", "32768"]), ("grown", ["--scenario-file", scenario])):
        out = tmp_path / f"{name}.safetensors"
        assert harness("export-inputs", "--device", "cpu", *args, "--out", out).returncode == 0
        with safetensors.safe_open(out, "pt") as f:
            bundles.append((f.metadata(), f.get_tensor("kv_indices")))
    assert not torch.equal(bundles[0][1], bundles[1][1])
    assert [(m["slots"], m["num_layers"], m["page_size"]) for m, _ in bundles] == [("16384", "2", "64"), ("32768", "2", "64"), ("20032", "2", "64")]
    grown = bundles[2][0]
    assert json.loads(grown["environment"])["device"] == "cpu"
    words = repro_words(grown["repro"])[1]
    assert words[-6:] == ["--device", "cpu", "--scale", "ci", "--slots", "20032"], words
    assert words[words.index("--out") + 1] == str(tmp_path / "grown.safetensors"), words  # absolute: reruns from any folder
    made = safetensors.torch.load_file(tmp_path / "grown.safetensors")
    (tmp_path / "grown.safetensors").unlink()
    (tmp_path / "elsewhere").mkdir()
    proc = subprocess.run(grown["repro"], shell=True, capture_output=True, text=True, cwd=tmp_path / "elsewhere", timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr
    with safetensors.safe_open(tmp_path / "grown.safetensors", "pt") as f:  # not its bytes: each process orders the header anew
        assert f.metadata() == grown and made.keys() == set(f.keys()) and all(torch.equal(f.get_tensor(k), t) for k, t in made.items())


def test_export_inputs_plans_memory_for_what_it_builds_not_a_pool(tmp_path, monkeypatch):
    """export-inputs builds no pool, yet it was refused on a 24 GB CPU for a production-scale case (`needs 20.76 GiB
    (pool and free list in host memory)`; its bundle takes about 240 MB), with advice to use another --slots (another
    case). With 2 GiB free it now writes the bundle; twin: `run` of the same case, which builds the pool, is refused."""
    from harness.inputs import memory

    monkeypatch.setattr(memory, "free_bytes", lambda device: 2 * 2**30)
    case = ("--device", "cpu", "--scale", "prod", "--scenario", "b1-l500")
    out = tmp_path / "prod.safetensors"
    proc = harness("export-inputs", *case, "--layer", "77", "--out", out)
    assert proc.returncode == 0 and out.is_file(), proc.stdout + proc.stderr
    _one_error_line(harness("run", *case, "--repeats", "0", "--strategy", "gather_cast"), "memory plan", "pool and free list in host memory")


def test_export_inputs_refuses_a_bundle_larger_than_host_memory_before_making_it(tmp_path, monkeypatch):
    """The bundle and its safetensors copies are planned against free host memory (before: a 2000 x 4096 scenario's
    two layers, 27 GiB of peak, were made until the kernel killed the process minutes later: exit 137, no message);
    the plan is one line naming --layer, nothing written. Twin: the same export with the memory it needs."""
    from harness.inputs import export

    out = tmp_path / "bundle.safetensors"
    need = 3 * (4096 * 576 + 8 * 576 * 2) * 2  # b1-l4096's rows and queries, 2 layers, the bundle and its two copies
    monkeypatch.setattr(export, "free_bytes", lambda device: need // 2, raising=False)
    _one_error_line(harness("export-inputs", "--device", "cpu", "--layer", "0", "--layer", "1", "--out", out), "--layer", "4,096 rows x 2 layer(s)")
    assert not out.exists()
    monkeypatch.setattr(export, "free_bytes", lambda device: need * 2, raising=False)
    assert harness("export-inputs", "--device", "cpu", "--layer", "0", "--layer", "1", "--out", out).returncode == 0


def test_overridden_scale_is_checked_against_a_live_reference(tmp_path):
    proc = harness("run", "--device", "cpu", "--repeats", "0", "--scenario", "b1-l500", "--layers", "1", "--slots", "20032")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "is for another scale" in proc.stdout and "live float64 reference" in proc.stdout
    _one_error_line(harness("run", "--device", "cpu", "--repeats", "0", "--layers", "1", "--reference", "golden"), "--reference")


def test_refresh_never_replaces_a_corrupt_golden_without_force(tmp_path):
    root = tmp_path / "golden"
    shutil.copytree(GOLDEN_DIR, root)
    target = root / "glm5-tp8.ci.edge-kv1" / "outputs.safetensors"
    target.write_bytes(b"corrupt")
    env = {"golden_dir": root}
    _one_error_line(harness("golden", "refresh", "--case", "glm5-tp8.ci.edge-kv1", **env), "outputs.safetensors: not a safetensors file", "--force")
    assert target.read_bytes() == b"corrupt"
    proc = harness("golden", "refresh", "--case", "glm5-tp8.ci.edge-kv1", "--force", **env)
    assert proc.returncode == 0 and "overwritten" in proc.stdout
    assert harness("golden", "verify", "--case", "glm5-tp8.ci.edge-kv1", **env).returncode == 0


@pytest.mark.parametrize("argv, words", [
    (("run", "--device", "cpu", "--repeats", "0", "--force"), "--json / --dump-outputs"),
    (("tpot", "--device", "cpu", "--shrink", "--force"), "--json"),
    (("report", "REPORT_INPUT", "--force"), "--out"),
    (("golden", "verify", "--case", "glm5-tp8.ci.edge-kv1", "--force"), "only golden refresh reads it"),
])
def test_force_that_would_replace_nothing_is_one_error_line(tmp_path, argv, words):
    """--force without an output it could replace was accepted (exit 0), so a user who thought it repaired or replaced
    something was not told. Now one line naming --force, before any work; twin: run's --force with a --json it
    replaces passes."""
    argv = [str(tmp_path / "r.json") if a == "REPORT_INPUT" else a for a in argv]
    _one_error_line(harness(*argv), "--force", words)
    out = tmp_path / "old.json"
    out.write_text("an earlier run's\n")
    proc = harness("run", "--device", "cpu", "--repeats", "0", "--scenario", "b1-l500", "--strategy", "gather_cast",
                   "--json", str(out), "--force")
    assert proc.returncode == 0 and out.read_text() != "an earlier run's\n", proc.stdout + proc.stderr


def test_unwritable_output_fails_before_the_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _one_error_line(harness("run", "--device", "cpu", "--json", str(blocker / "r.json")), "--json")
    _one_error_line(harness("run", "--device", "cpu", "--dump-outputs", str(blocker / "d")), "--dump-outputs")


# --- hostile inputs (issue 10) -----------------------------------------------------------

def _golden_root(tmp_path) -> tuple[Path, dict]:
    root = tmp_path / "golden"
    shutil.copytree(GOLDEN_DIR, root)
    return root, {"MLA_HARNESS_GOLDEN_DIR": str(root)}


def test_disarmed_golden_never_passes(tmp_path):
    """Emptying the manifest's `checked` list breaks its hash: the nan-in-pool run exits 2, not 0."""
    root, env = _golden_root(tmp_path)
    path = root / "glm5-tp8.ci.b1-l500" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["checked"] = []
    path.write_text(json.dumps(manifest))
    before = path.read_bytes()
    proc = harness("run", "--device", "cpu", "--repeats", "0", "--scenario", "b1-l500", "--plant-fault", "nan-in-pool", env=env)
    _one_error_line(proc, "manifest_sha256")
    assert path.read_bytes() == before


def test_unfirable_faults_exit_2():
    _one_error_line(harness("run", "--device", "cpu", "--scenario", "b1-l500", "--plant-fault", "stale-after-reuse"),
                    "stale-after-reuse", "reuse")
    _one_error_line(harness("run", "--device", "cpu", "--plant-fault", "remap-off-by-one", "--strategy", "shadow"),
                    "remap-off-by-one", "gather_cast")


def test_fault_that_did_not_turn_anything_red_is_an_error():
    from types import SimpleNamespace

    from harness.errors import HarnessError
    from harness.spec.faults import Fault
    from harness.verify.negative_controls import did_not_fire

    green = SimpleNamespace(strategy="gather_cast", verdict=SimpleNamespace(status=SimpleNamespace(value="pass")))
    with pytest.raises(HarnessError, match="did not fire"):
        did_not_fire({Fault.REMAP_OFF_BY_ONE}, [green])


@pytest.mark.parametrize("toml, fragment", [
    ('name = "../../../x"\nkv_lens = [3]\n', "name"),
    (f'name = "{"n" * 300}"\nkv_lens = [3]\n', "name"),
    ('name = "big"\nbatch_size = 2000000000\nkv_len = 1\n', "batch_size"),
])
def test_hostile_scenarios_exit_2(tmp_path, toml, fragment):
    path = tmp_path / "s.toml"
    path.write_text(toml)
    _one_error_line(harness("run", "--device", "cpu", "--scenario-file", path, "--dump-outputs", tmp_path / "d"), fragment)
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())


def test_huge_slot_count_is_refused_before_any_allocation():
    _one_error_line(harness("run", "--device", "cpu", "--slots", "99999999999"), "memory plan", "--slots")


def test_output_paths_are_checked_before_the_work(tmp_path):
    folder = tmp_path / "existing"
    folder.mkdir()
    proc = harness("run", "--device", "cpu", "--json", folder)
    _one_error_line(proc, "--json", "folder")
    assert "pool built" not in proc.stdout
    _one_error_line(harness("run", "--device", "cpu", "--json", tmp_path / ("x" * 300 + ".json")), "--json", "too long")
    out = tmp_path / "new" / "bundle.txt"
    _one_error_line(harness("export-inputs", "--device", "cpu", "--out", out), "--out", ".safetensors")
    assert not out.parent.exists()


def test_json_is_written_through_a_symlink(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    proc = harness("run", "--device", "cpu", "--repeats", "0", "--scenario", "b1-l500", "--strategy", "gather_cast", "--json", link, "--force")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert link.is_symlink() and json.loads(target.read_text())["schema"] == "mla-harness-results/5"
    assert "gather_cast: decode: 1/1" in proc.stdout  # one progress line per phase off a terminal


def test_fsio_streams_refuses_full_devices_and_keeps_modes(tmp_path):
    import threading

    from harness.errors import HarnessError
    from harness.fsio import check_writable, write_text

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_text(fifo, "streamed")
    reader.join(10)
    assert got == ["streamed"] and fifo.exists() and not fifo.is_file()
    if Path("/dev/full").exists():
        with pytest.raises(HarnessError, match="No space left"):
            write_text("/dev/full", "x")
        assert not Path("/dev/full").is_file()
    old = os.umask(0o022)
    try:
        assert (write_text(tmp_path / "f.json", "{}").stat().st_mode & 0o777) == 0o644
    finally:
        os.umask(old)
    with pytest.raises(HarnessError, match="folder"):
        check_writable(tmp_path, "--json")


def test_nothing_requested_ran_is_not_a_pass():
    proc = harness("run", "--device", "cpu", "--repeats", "0", "--scenario", "b1-l500", "--strategy", "stock_vectorized")
    assert proc.returncode == 1 and "nothing requested was checked" in proc.stderr, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("on cpu: stock_vectorized runs on cuda only")  # its own reason


def test_reference_live_says_so():
    proc = harness("run", "--device", "cpu", "--repeats", "0", "--scenario", "b1-l500", "--strategy", "gather_cast", "--reference", "live")
    assert proc.returncode == 0, proc.stderr
    assert "--reference live: checking against a live float64 reference" in proc.stdout and "no golden" not in proc.stdout


def test_ctrl_c_is_one_line_exit_130(monkeypatch):
    import harness.cli as cli

    def interrupted(args, console):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.compare, "command", interrupted)
    proc = harness("compare", "a.json", "b.json")
    assert proc.returncode == 130 and proc.stderr.strip() == "interrupted"


def test_sigterm_is_an_interruption_that_leaves_no_temporary_file(tmp_path):
    """A cancelled CI job's SIGTERM unwinds like Ctrl-C: 'interrupted', exit 130, no half-written output; the
    caller's own SIGTERM handler is back once main returns (twin: without the signal the same run passes)."""
    code = ("import os, signal, sys, threading\nfrom harness.cli import main\nimport harness.api as api\nrun = api.run\n"
            "def slow(*a, **k):\n    os.kill(os.getpid(), signal.SIGTERM) if os.environ.get('KILL') else None\n    return run(*a, **k)\n"
            "api.run = slow\nrc = main(sys.argv[1:])\nprint(rc, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)\n")
    argv = ["run", "--device", "cpu", "--repeats", "0", "--scenario", "b1-l500", "--strategy", "gather_cast", "--json", "r.json"]
    for kill, expected in (("1", "130 True"), ("", "0 True")):
        proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "KILL": kill})
        assert proc.stdout.strip().splitlines()[-1] == expected, proc.stdout[-500:] + proc.stderr[-2000:]
        if kill:
            assert proc.stderr.strip() == "interrupted" and os.listdir(tmp_path) == []
    assert json.loads((tmp_path / "r.json").read_text())["case"]["scenario"] == "b1-l500"


SIGTERM_AT_IMPORT = """import importlib.abc, os, signal, sys
class SigtermAt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in os.environ.get("KILL_AT", "").split(","):
            os.environ["KILL_AT"] = ""
            os.kill(os.getpid(), signal.SIGTERM)
sys.meta_path.insert(0, SigtermAt())
from harness.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("out", ["existing", "new", "twin"])
def test_sigterm_that_torch_swallows_while_importing_numpy_still_interrupts(tmp_path, out):
    """SIGTERM while torch's C extension imports numpy (the handler's KeyboardInterrupt caught there, so the run went on):
    'interrupted', exit 130, and the run writes nothing (before: exit 0, its --json written over the existing file, or a
    traceback). Twin: the same run without the signal writes its results, exit 0."""
    (tmp_path / "r.json").write_text("base")
    argv = ["run", "--device", "cpu", "--repeats", "0", "--scenario", "b1-l500", "--strategy", "gather_cast",
            *({"existing": ["--json", "r.json", "--force"]}.get(out, ["--json", "new.json", "--dump-outputs", "dumps"]))]
    proc = subprocess.run([sys.executable, "-c", SIGTERM_AT_IMPORT, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                     "KILL_AT": "" if out == "twin" else "numpy._core.umath,numpy.core.umath"})
    if out == "twin":
        assert proc.returncode == 0 and (tmp_path / "new.json").is_file(), proc.stderr[-2000:]
        return
    assert proc.returncode == 130 and proc.stderr.strip() == "interrupted", (proc.returncode, proc.stderr[-2000:])
    assert os.listdir(tmp_path) == ["r.json"] and (tmp_path / "r.json").read_text() == "base"


SWALLOWED = """import os, signal, sys
from harness.errors import interruptible
@interruptible
def main():
    try:
        os.kill(os.getpid(), signal.SIGTERM)
    except KeyboardInterrupt:  # as torch's C extension catches it while it imports numpy
        pass
    if sys.argv[1] == "error":
        import numpy
        numpy.no_such_function  # the half-imported module of that interleaving
    return 0
sys.exit(main())
"""


@pytest.mark.parametrize("then", ["return", "error"])
def test_an_interruption_caught_on_the_way_is_still_one_line_and_130(then):
    """A SIGTERM whose KeyboardInterrupt something caught: the main that then returns 0, or fails with another error
    (an AttributeError of the half-imported numpy), still says only 'interrupted' and exits 130 (before: 0, or a traceback
    and 1)."""
    proc = subprocess.run([sys.executable, "-c", SWALLOWED, then], capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 130 and proc.stderr.strip() == "interrupted", (proc.returncode, proc.stderr[-2000:])


def test_host_memory_a_limit_refuses_is_one_line_not_a_traceback():
    """Under an address-space limit (ulimit -v, as CI jobs set) below the free memory the plan sees, the pool's
    host allocation fails: one 'out of host memory' line, exit 2 (before: a RuntimeError traceback, exit 1, which
    reads as a failed check)."""
    import resource

    limit = 1536 << 20  # 1.5 GiB of address space: torch loads, a 1,000,000-slot pool (1.3 GB) does not fit

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    argv = ["run", "--device", "cpu", "--slots", "1000000", "--scenario", "b1-l500", "--strategy", "gather_cast", "--repeats", "0"]
    proc = subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=HANG_GUARD_S, preexec_fn=cap)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: out of host memory: ") and "--slots" in proc.stderr, proc.stderr


@pytest.mark.parametrize("error", [RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4 GB"),
                                   MemoryError(), RuntimeError("a kernel bug")])
def test_memory_running_out_inside_a_strategy_is_bad_input_not_its_red_verdict(error, tmp_path, monkeypatch, capsys):
    """The pool fit but a strategy's own allocation did not (ulimit -v, a large --slots): the run printed its table,
    `FAIL: check failed` (exit 1) and recorded the strategy's verdict `error`, which a later compare fails as the
    commit's. Now one 'out of host memory' line, exit 2, no results file. Twin: any other error is the red verdict."""
    from harness.strategies import REGISTRY

    def crash(*args, **kwargs):
        raise error

    monkeypatch.setattr(REGISTRY["gather_cast"], "setup", crash)
    out = tmp_path / "r.json"
    code = main(["run", "--device", "cpu", "--scenario", "b1-l500", "--strategy", "gather_cast", "--repeats", "0", "--json", str(out)])
    err = capsys.readouterr().err
    if isinstance(error, MemoryError) or "allocate" in str(error):
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: out of host memory: ") and not out.exists(), err
    else:
        assert code == 1 and "FAIL: " in err and json.loads(out.read_text())["rows"]


def test_an_argument_that_is_not_utf8_is_refused_before_any_work(tmp_path, capsys):
    """A --scenario-file or --json named in other bytes (Python surrogate-escapes them) went into the results file's
    repro, and every reader then refused the file run had just written (exit 0) as not text."""
    bad = tmp_path / "sc\udcfe.json"
    assert main(["run", "--device", "cpu", "--scenario", "b1-l500", "--repeats", "0", "--json", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "not UTF-8 text" in err and not any(tmp_path.iterdir())


def test_help_lists_names_and_does_not_import_torch():
    """`--help` and `run --help` stay fast (no torch); `run --help` lists the names."""
    code = ("import sys, contextlib, io\nfrom harness.cli import main\nbuf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf):\n"
            "    for argv in (['--help'], ['run', '--help']):\n"
            "        try: main(argv)\n        except SystemExit: pass\n"
            "        print('torch' in sys.modules, file=sys.stderr)\n"
            "print(buf.getvalue())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=HANG_GUARD_S)
    assert proc.returncode == 0 and proc.stderr.split() == ["False", "False"], proc.stderr
    text = " ".join(proc.stdout.split())
    assert "multistep-reuse" in text and "native_fp8" in text and "stale-after-reuse" in text


def test_headline_scenarios_fit_the_cpu_pool():
    import argparse

    from harness.cli.common import case_from

    args = argparse.Namespace(preset="glm5-tp8", scale=None, slots=None, layers=None, scenario="b32-l4096", scenario_file=None)
    assert case_from(args, torch.device("cpu")).scale.slots >= 32 * 4096
    args.scale = "ci"  # an explicit scale is kept: the scenario does not fit it
    with pytest.raises(Exception, match="--slots"):
        case_from(args, torch.device("cpu")).schedule()


def test_narrow_terminal_gets_two_tables():
    from rich.console import Console

    from harness.api import StrategyResult
    from harness.measure.timing import Samples
    from harness.render.table import results_table
    from harness.verify.check import ErrorStats, Status, Verdict

    stats = ErrorStats(0.1, 0.004, 0.002, 0, 100, 1.0, (0,), 0)
    metrics = {k: Samples("us", (1000.0, 1200.0)) for k in ("cast_us", "attn_us", "step_ms", "cast_gbps")}
    results = [StrategyResult(n, Verdict(Status.PASS, "", stats), metrics, 1 << 20) for n in ("stock", "gather_cast")]
    console = Console(width=100, file=io.StringIO(), color_system=None)
    console.print(results_table("case", results, host_timed=True, width=100))
    text = console.file.getvalue()
    assert max(map(len, text.splitlines())) <= 100 and "correctness" in text and "timings" in text
    assert "GB/s" not in text and "(host)" in text


def test_a_pass_shows_what_it_left_unchecked():
    from rich.console import Console

    from harness.api import StrategyResult
    from harness.render.table import results_table
    from harness.verify.check import ErrorStats, Status, Verdict

    stats = ErrorStats(0.1, 0.004, 0.002, 0, 100, 1.0, (0,), 0)
    note = "requests outside the golden unchecked"
    results = [StrategyResult(n, Verdict(Status.PASS, reason, stats), {}, 0) for n, reason in (("stock", ""), ("native_fp8", note))]
    console = Console(width=160, file=io.StringIO(), color_system=None)
    console.print(results_table("case", results, host_timed=True, width=160))
    assert note in console.file.getvalue()


def test_a_planted_fault_run_is_another_case_to_compare(tmp_path):
    """A run with a planted fault (one token dropped: another workload) and a clean run are refused by compare as two
    cases (exit 2, naming the workload), whichever is the base (before: one case, judged "2 fixed" by its timings).
    Twin: two clean runs are one case."""
    run = ("run", "--device", "cpu", "--scenario", "b1-l500", "--strategy", "gather_cast", "--repeats", "3")
    for name, extra in (("clean", ()), ("again", ()), ("fault", ("--plant-fault", "dropped-last-token"))):
        harness(*run, *extra, "--json", tmp_path / f"{name}.json")
    assert harness("compare", tmp_path / "clean.json", tmp_path / "again.json").returncode in (0, 1)
    for pair in (("fault", "clean"), ("clean", "fault")):
        proc = harness("compare", *(tmp_path / f"{n}.json" for n in pair))
        assert proc.returncode == 2 and "workload" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_a_golden_miss_leaves_the_obtained_outputs_beside_the_golden(tmp_path):
    """pytest-regressions' obtained file: a run that fails its golden, and a verify that finds a changed golden,
    write what they got beside it (keyed as the golden's outputs) and say where; a pass, or a planted fault's
    expected failure, writes nothing."""
    name = "glm5-tp8.ci.b1-l500"
    root = tmp_path / "golden"
    shutil.copytree(GOLDEN_DIR / name, root / name, ignore=shutil.ignore_patterns("*.obtained.*"))
    shutil.copy(GOLDEN_DIR / "cases.toml", root / "cases.toml")
    case_dir = root / name
    run = ("run", "--device", "cpu", "--scenario", "b1-l500", "--strategy", "stock", "--repeats", "0")
    ok = harness(*run, golden_dir=root)
    planted = harness(*run, "--plant-fault", "dropped-last-token", golden_dir=root)
    assert ok.returncode == 0 and planted.returncode == 1 and not list(case_dir.glob("*.obtained.*"))  # the twins
    stored = golden.load(name, root)
    stored.tensors["s0.l1.out_fp32"][0, 0, :4] += 0.25
    golden.write(stored, name, root)  # a re-signed, changed golden: the run misses it, verify's recomputation differs
    bad = harness(*run, golden_dir=root)
    obtained = case_dir / "stock.obtained.safetensors"
    assert bad.returncode == 1 and obtained.is_file() and f"stock: obtained outputs: {obtained}" in bad.stdout
    got = safetensors.torch.load_file(obtained)
    assert {k for k in got if k.endswith("out_bf16")} == {f"s{s}.l{l}.out_bf16" for s, l in stored.keys()}
    assert torch.equal(got["s0.l1.out_bf16"], stored.tensors["s0.l1.out_bf16"])  # the golden's bf16 was not edited
    obtained.unlink()
    obtained.symlink_to(case_dir / golden.OUTPUTS)  # never written through a link (it could point at the golden)
    before = (case_dir / golden.OUTPUTS).read_bytes()
    bad = harness(*run, golden_dir=root)
    assert bad.returncode == 1 and f"stock: obtained outputs not written: {obtained} is not a regular file" in bad.stdout
    assert (case_dir / golden.OUTPUTS).read_bytes() == before
    proc = harness("golden", "verify", "--case", name, golden_dir=root)
    fresh = case_dir / "outputs.obtained.safetensors"
    assert proc.returncode == 1 and fresh.is_file() and f"obtained outputs: {fresh}" in proc.stdout
    assert torch.equal(safetensors.torch.load_file(fresh)["s0.l1.out_fp32"], golden.compute(cases.load_case(name)).tensors["s0.l1.out_fp32"])


def test_a_writable_stream_passes_the_early_check(tmp_path):
    import os

    from harness.fsio import check_writable

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    check_writable(fifo, "--json")  # a pipe (or /dev/stdout) is a fine output, also without --force


def test_repro_reruns_the_same_case_from_any_folder(tmp_path, monkeypatch):
    """The recorded repro names its paths absolutely and the variables that change a run (MLA_HARNESS_GOLDEN_DIR):
    run word for word from another folder it makes a results file of the same case."""
    from harness.gate.compare import load_results

    work = tmp_path / "dir with 'space"
    work.mkdir()
    (work / "s.toml").write_text('name = "mine"\ndescription = "repro"\nseed = 5\nsteps = 1\nkv_lens = [40, 7]\n')
    shutil.copytree(GOLDEN_DIR, work / "gold")
    monkeypatch.chdir(work)
    monkeypatch.setenv("MLA_HARNESS_GOLDEN_DIR", "gold")
    args = ("run", "--scenario-file", "s.toml", "--strategy", "stock", "--repeats", "0", "--slots", "4096", "--layers", "1")
    proc = harness(*args, "--json=first.json", golden_dir=work / "gold")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env, words = repro_words(json.loads((work / "first.json").read_text())["repro"])
    assert env[0] == f"MLA_HARNESS_GOLDEN_DIR={work / 'gold'}"
    (work / "first.json").rename(tmp_path / "first.json")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLA_HARNESS_GOLDEN_DIR")
    again = harness(*words, golden_dir=env[0].split("=", 1)[1])
    assert again.returncode == 0, again.stdout + again.stderr
    first, second = load_results(tmp_path / "first.json"), load_results(work / "first.json")
    assert first.case == second.case and {r.key for r in first.rows} == {r.key for r in second.rows}


def test_repro_pins_the_defaults_this_machine_resolved(tmp_path):
    """`--device auto` (and the scale, pool size, backend and repeats that follow the device) is written as what it
    resolved to here, so the repro reruns the same case on a machine where auto means something else; the user's own
    spelling of a pinned option is replaced, every other word kept."""
    from harness.results.document import pin_options

    assert pin_options(["run", "--device=auto", "--scenario", "b1-l500", "--repeats", "3"], {"--device": "cpu", "--repeats": "3"}) \
        == ["run", "--scenario", "b1-l500", "--device", "cpu", "--repeats", "3"]
    proc = harness("run", "--scenario", "b1-l4096", "--strategy", "stock", "--repeats", "0", "--layers", "1",
                   f"--json={tmp_path / 'r.json'}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    words = repro_words(doc["repro"])[1]
    pinned = {w: words[i + 1] for i, w in enumerate(words) if w.startswith("--")}  # every option here takes a value
    assert pinned["--device"] == "cpu" and pinned["--scale"] == doc["case"]["scale"] == "ci"
    assert pinned["--slots"] == str(doc["case"]["slots"]) and pinned["--backend"] == doc["case"]["backend"] == "torch"
    assert pinned["--repeats"] == "0" and words.count("--repeats") == 1


def test_repro_pins_a_backend_the_command_line_takes(tmp_path, monkeypatch):
    """On a GPU a run's backend is a family and the kernel the GPU chose ("flashinfer-fa3"); the repro pins the family,
    which `--backend` takes, and the rerun chooses the kernel again (before: it pinned "flashinfer-fa3", and every GPU
    repro failed with "unknown backend")."""
    from harness import api
    from harness.backends import BACKENDS
    from harness.cli.run import add_arguments

    real = api.run
    monkeypatch.setattr(api, "run", lambda cfg, console: dataclasses.replace(real(cfg, console), backend="flashinfer-fa3"))
    proc = harness("run", "--scenario", "b1-l500", "--strategy", "stock", "--repeats", "0", "--layers", "1",
                   f"--json={tmp_path / 'r.json'}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    words = repro_words(json.loads((tmp_path / "r.json").read_text())["repro"])[1]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(words[1:]).backend == "flashinfer" and "flashinfer" in BACKENDS


def test_repro_names_the_sglang_python_absolutely_and_never_replaces_its_results(tmp_path, monkeypatch):
    """A --sglang-python given as a path is recorded absolutely (a bare command stays one, for PATH to find), and
    --force is left out: rerun word for word, the repro refuses to replace the results file it came from (before:
    ./py stayed relative, so the repro failed from another folder, and --force replaced the original results)."""
    from harness.results.document import repro_command

    monkeypatch.chdir(tmp_path)
    words = repro_words(repro_command(["tpot", "--engine", "sglang", "--sglang-python", "./py", "--json", "o.json", "--force"]))[1]
    assert words == ["tpot", "--engine", "sglang", "--sglang-python", str(tmp_path / "py"), "--json", str(tmp_path / "o.json")]
    assert repro_words(repro_command(["tpot", "--sglang-python=bin/py"]))[1][-1] == f"--sglang-python={tmp_path / 'bin/py'}"
    assert repro_words(repro_command(["tpot", "--sglang-python", "python3"]))[1][-2:] == ["--sglang-python", "python3"]


def test_repro_runs_this_interpreter_on_this_checkout_from_any_folder(tmp_path, monkeypatch):
    """The repro names the interpreter that ran (absolutely) and this checkout's harness: run by a shell from a folder
    holding another harness/, with another `python` first on PATH and no PYTHONPATH, it runs this one (before: a bare
    `python -m harness`, which ran the PATH's interpreter on the current folder's harness)."""
    from harness.results.document import repro_command

    decoy = tmp_path / "elsewhere"
    (decoy / "harness").mkdir(parents=True)
    (decoy / "harness" / "__main__.py").write_text("raise SystemExit('the decoy harness ran')\n")
    (decoy / "python").write_text("#!/bin/sh\necho the decoy python ran; exit 3\n")
    (decoy / "python").chmod(0o755)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PYTHONPATH", "suites")  # the run's own PYTHONPATH: kept after the checkout, absolutely
    repro = repro_command(["run", "--help"])
    assert repro_words(repro)[0][-1] == f"PYTHONPATH={ROOT}{os.pathsep}{ROOT / 'suites'}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PATH": f"{decoy}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["sh", "-c", repro], cwd=decoy, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m harness run"), proc.stdout + proc.stderr


@pytest.mark.parametrize("given, recorded", [("x:", ["x", "."]), (":x", [".", "x"]), ("x", ["x"]), ("", [])])
def test_repro_keeps_an_empty_pythonpath_entry_as_the_folder_it_named(tmp_path, monkeypatch, given, recorded):
    """An empty entry of a non-empty PYTHONPATH (`PYTHONPATH=/x:$PYTHONPATH` with none set) puts the current folder on
    sys.path: the repro dropped it, so a rerun imported what the run had not. Twins: no empty entry, and an empty
    PYTHONPATH, which names nothing."""
    from harness.results.document import repro_command

    folder = Path(os.path.realpath(tmp_path))
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PYTHONPATH", given.replace(":", os.pathsep))
    expected = os.pathsep.join([str(ROOT), *(str(folder) if p == "." else str(folder / p) for p in recorded)])
    assert repro_words(repro_command(["run", "--help"]))[0][-1] == f"PYTHONPATH={expected}"


def test_an_abbreviated_option_is_refused(tmp_path):
    """Options are spelled out: an abbreviation (--js for --json, --scenario-f for --scenario-file) would put a relative
    path in the recorded repro that it does not make absolute (before: accepted, and the repro failed from another folder)."""
    for args in (("tpot", "--js", "x.json"), ("run", "--scenario-f", "s.toml")):
        proc = harness(*args, "--strategy", "nope", cwd=tmp_path, env={})
        assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr, proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_tpot_records_its_own_command_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["pytest", "--unrelated"])  # an in-process caller's argv is not the command
    out = tmp_path / "t.json"
    proc = harness("tpot", "--device", "cpu", "--shrink", "--slots", "2048", "--layers", "1", "--scenario", "b1-l500",
                   "--strategy", "stock", "--repeats", "1", "--no-breakdown", "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    words = repro_words(json.loads(out.read_text())["repro"])[1]  # the options as given, the pinned ones after them
    assert words[:6] == ["tpot", "--shrink", "--layers", "1", "--scenario", "b1-l500"] and "--unrelated" not in words
    assert words[words.index("--device"):][:2] == ["--device", "cpu"] and words[words.index("--slots") + 1] == "2048"


def test_timing_is_a_progress_phase_of_its_own(tmp_path):
    proc = harness("run", "--device", "cpu", "--scenario", "b1-l500", "--strategy", "stock", "--repeats", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stock: timing, 2 samples per metric: 3/3 in" in proc.stdout


def test_progress_lines_come_while_one_long_unit_runs(monkeypatch):
    """Off a terminal (CI logs) a phase says how far it is every LINE_EVERY_S, also before its first unit ends."""
    import time

    from rich.console import Console

    from harness import progress

    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.05)
    console = Console(file=io.StringIO(), width=200)

    def said() -> int:
        return len([line for line in console.file.getvalue().splitlines() if line.startswith("slow phase: 0/1 after")])

    t0 = time.perf_counter()
    with progress.progress_bar(console, "slow phase", 1) as advance:
        deadline = t0 + 60  # the unit lasts until 3 lines came: 60 s is a hang guard (3 lines take 0.15 s idle)
        while said() < 3 and time.perf_counter() < deadline:
            time.sleep(0.05)
        advance()
    elapsed = time.perf_counter() - t0
    lines = console.file.getvalue().splitlines()
    assert 3 <= said() <= elapsed / progress.LINE_EVERY_S + 1, (said(), elapsed)  # at most one line per LINE_EVERY_S
    assert lines[-1].startswith("slow phase: 1/1 in")


def test_repro_keeps_a_path_through_a_link_and_dot_dot(tmp_path, monkeypatch):
    """`lnk/../s.toml` is s.toml beside the link's target; the repro names that file (before: abspath folded the ".."
    lexically, so the repro read cwd/s.toml, another scenario, and measured another case)."""
    import shlex

    from harness.results.document import repro_command

    (tmp_path / "deep" / "inner").mkdir(parents=True)
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "lnk").symlink_to(tmp_path / "deep" / "inner")
    monkeypatch.chdir(tmp_path / "here")
    for args in (["--scenario-file", "lnk/../s.toml"], ["--scenario-file=lnk/../s.toml"]):
        named = shlex.split(repro_command(["run", *args]))[-1].rpartition("=")[2]
        assert os.path.realpath(named) == os.path.realpath(tmp_path / "deep" / "s.toml"), named
    monkeypatch.setenv("MLA_HARNESS_GOLDEN_DIR", "lnk/../gold")
    named = next(w for w in shlex.split(repro_command(["run"])) if w.startswith("MLA_HARNESS_GOLDEN_DIR=")).split("=", 1)[1]
    assert os.path.realpath(named) == os.path.realpath(tmp_path / "deep" / "gold"), named


def test_user_text_is_printed_as_written_never_as_markup(tmp_path):
    """A path, a scenario name or an error text with [...] in it is printed as it is: rich read `out[a].json` as
    `out.json` plus a style tag, dropped `[batch, heads]` from a verdict's reason, and raised on a `[/]`."""
    from rich.console import Console

    from harness.api import StrategyResult
    from harness.render.table import results_table
    from harness.verify.check import Status, Verdict

    out = tmp_path / "r[a].json"
    proc = harness("run", "--device", "cpu", "--scenario", "b1-l500", "--strategy", "stock", "--repeats", "0", "--json", out)
    assert proc.returncode == 0 and out.exists(), proc.stdout + proc.stderr
    assert f"results written to {out}" in proc.stdout.replace("\n", ""), proc.stdout
    reason = "index [batch, heads] out of range [/]"
    console = Console(file=io.StringIO(), width=400)
    console.print(results_table("t", [StrategyResult("stock", Verdict(Status.ERROR, reason))]))
    assert reason in console.file.getvalue(), console.file.getvalue()


def test_a_terminal_progress_bar_shows_its_description_as_written():
    """The bar's description (a case or scenario name) is text: `verify x[a]` is not `verify x` plus a style tag."""
    from rich.console import Console

    from harness.progress import progress_bar

    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    with progress_bar(console, "verify x[a]", 1) as advance:
        advance()
    assert "verify x[a]" in console.file.getvalue(), console.file.getvalue()


def test_results_record_what_the_verdicts_were_checked_against(tmp_path):
    """A run checked against the golden and one that went live (`--reference auto` and a golden folder without the
    case) wrote the same results but their numbers: nothing said what either pass was checked against. Now
    environment.reference names the golden's folder and manifest_sha256, or the live float64 reference."""
    other = tmp_path / "other-golden"
    other.mkdir()
    (other / "cases.toml").write_text('[[case]]\npreset = "glm5-tp8"\nscale = "ci"\nscenario = "edge-kv1"\n')
    args = ("run", "--device", "cpu", "--scenario", "b1-l500", "--strategy", "stock", "--repeats", "0")
    for name, golden_dir in (("golden.json", GOLDEN_DIR), ("live.json", other)):
        proc = harness(*args, "--json", tmp_path / name, golden_dir=golden_dir)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((GOLDEN_DIR / "glm5-tp8.ci.b1-l500" / golden.MANIFEST).read_text())
    recorded = {name: json.loads((tmp_path / name).read_text())["environment"]["reference"] for name in ("golden.json", "live.json")}
    assert recorded == {"golden.json": f"{GOLDEN_DIR / 'glm5-tp8.ci.b1-l500'} (manifest_sha256 {manifest['manifest_sha256']})",
                        "live.json": "live float64 reference"}, recorded


def test_repro_keeps_unset_variables_unset(tmp_path):
    """A run recorded without MLA_HARNESS_GOLDEN_DIR reruns against the same golden from a shell that exports one
    (before: the exported folder was used, and a folder without the case went live, silently)."""
    out = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k not in ("MLA_HARNESS_GOLDEN_DIR", "TRITON_INTERPRET")}
    args = ["run", "--device", "cpu", "--scenario", "b1-l500", "--strategy", "stock", "--repeats", "0", "--json", str(out)]
    first = subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert first.returncode == 0, first.stdout + first.stderr
    recorded = json.loads(out.read_text())
    assert recorded["repro"].split()[:3] == ["/usr/bin/env", "-u", "MLA_HARNESS_GOLDEN_DIR"] or not os.path.exists("/usr/bin/env")
    out.rename(tmp_path / "first.json")
    (tmp_path / "other-golden").mkdir()
    again = subprocess.run(["sh", "-c", recorded["repro"]], cwd=tmp_path, env={**env, "MLA_HARNESS_GOLDEN_DIR": str(tmp_path / "other-golden")},
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(out.read_text())["environment"]["reference"] == recorded["environment"]["reference"]
    assert recorded["environment"]["reference"].startswith(str(GOLDEN_DIR))


def test_a_golden_dir_that_is_not_there_fails_before_any_work(tmp_path):
    """--golden-dir naming no folder was reported after the case was built and its memory planned (and not at all
    with --reference live); now it is the one error line before anything runs."""
    for extra in ((), ("--reference", "live")):
        proc = harness("run", "--device", "cpu", "--scenario", "b1-l500", "--strategy", "stock", "--repeats", "0",
                       "--golden-dir", tmp_path / "missing", *extra)
        _one_error_line(proc, "--golden-dir", "is not a directory")
        assert "memory plan" not in proc.stdout, proc.stdout


def test_device_spellings_resolve_alike_and_a_cpu_index_is_refused(monkeypatch):
    """`--device auto` on a GPU is cuda:0, as `cuda` is (it was a bare `cuda` without set_device, so the results'
    environment.device differed between the two); `cpu:1` names no device and is refused (it was taken as cpu)."""
    import torch

    from harness.cli.common import device_from
    from harness.errors import HarnessError

    with pytest.raises(HarnessError, match="the CPU takes no index"):
        device_from("cpu:1")
    assert device_from("auto") == device_from("cpu") == torch.device("cpu")
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert device_from("auto") == device_from("cuda") == torch.device("cuda", 0)
    assert chosen == [torch.device("cuda", 0)] * 2


def test_only_commands_that_record_a_repro_refuse_a_name_that_is_not_utf8(tmp_path, capsys, monkeypatch):
    """compare, report and golden record no repro: they read a file of any name. run refuses a PYTHONPATH that is not
    UTF-8 too (it goes into the repro as the arguments do)."""
    proc = harness("compare", str(tmp_path / "b\udcff.json"), str(tmp_path / "h.json"))
    assert proc.returncode == 2 and "no such file" in proc.stderr and "not UTF-8" not in proc.stderr, proc.stderr
    monkeypatch.setitem(os.environb, b"PYTHONPATH", os.fsencode(tmp_path) + b"/ck\xff")  # os.environ reads it surrogate-escaped
    assert main(["run", "--device", "cpu", "--scenario", "b1-l500", "--repeats", "0", "--json", str(tmp_path / "r.json")]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err and not (tmp_path / "r.json").exists()
