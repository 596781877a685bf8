"""The CLI end to end: exit codes 0/1/2, one-line errors, JSON results, repro bundles, golden refresh."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from harness import golden
from harness.cases import GOLDEN_DIR
from harness.reference import StepInputs, mla_decode_f64

ROOT = Path(__file__).resolve().parent.parent


def harness(*args, env=None, cwd=ROOT):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=300)


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
    assert doc["schema"] == "mla-harness-results/1" and doc["repro"].startswith("python -m harness run")
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
        (["run", "--slots", "100"], ["kv_lens", "needs up to 4096 slots but the pool has 100"]),
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
        "huge.toml": ('name = "h"\nkv_lens = [20000]\n', "needs up to 20000 slots"),
    }
    for fname, (text, fragment) in bad.items():
        path = tmp_path / fname
        path.write_text(text)
        _one_error_line(harness("run", "--device", "cpu", "--scenario-file", str(path)), str(path), fragment)
    _one_error_line(harness("run", "--device", "cpu", "--scenario-file", str(tmp_path / "missing.toml")), "missing.toml")


def test_missing_and_corrupt_golden_exit_2_and_leave_disk_alone(tmp_path):
    root = tmp_path / "golden"
    shutil.copytree(GOLDEN_DIR, root)
    case_dir = root / "glm5-tp8.ci.b1-l4096"
    (case_dir / "outputs.safetensors").write_bytes(b"garbage")
    before = {p: p.read_bytes() for p in case_dir.iterdir()}
    env = {"MLA_HARNESS_GOLDEN_DIR": str(root)}
    _one_error_line(harness("run", "--device", "cpu", "--repeats", "0", env=env), "outputs_sha256")
    _one_error_line(harness("golden", "verify", "--case", "glm5-tp8.ci.b1-l4096", env=env), "outputs_sha256")
    assert {p: p.read_bytes() for p in case_dir.iterdir()} == before
    shutil.rmtree(case_dir)
    _one_error_line(harness("run", "--device", "cpu", "--repeats", "0", env=env), "manifest.json", "missing")


def test_refresh_refuses_changed_golden_without_force(tmp_path):
    root = tmp_path / "golden"
    shutil.copytree(GOLDEN_DIR, root)
    name = "glm5-tp8.ci.b1-l500"
    stored = golden.load(name, root)
    stored.tensors["s0.l1.out_fp32"][0, 0, :4] += 0.25
    golden.write(stored, name, root)
    before = (root / name / "outputs.safetensors").read_bytes()
    env = {"MLA_HARNESS_GOLDEN_DIR": str(root)}
    proc = harness("golden", "refresh", "--case", name, env=env)
    assert proc.returncode == 1 and "CHANGED, not written" in proc.stdout and "s0.l1.out_fp32" in proc.stdout
    assert (root / name / "outputs.safetensors").read_bytes() == before
    proc = harness("golden", "refresh", "--case", name, "--force", env=env)
    assert proc.returncode == 0 and "overwritten" in proc.stdout
    assert harness("golden", "verify", "--case", name, env=env).returncode == 0
    proc = harness("golden", "refresh", "--case", name, env=env)
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


def test_overridden_scale_is_checked_against_a_live_reference(tmp_path):
    proc = harness("run", "--device", "cpu", "--repeats", "0", "--scenario", "b1-l500", "--layers", "1", "--slots", "20000")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "is for another scale" in proc.stdout and "live float64 reference" in proc.stdout
    _one_error_line(harness("run", "--device", "cpu", "--repeats", "0", "--layers", "1", "--reference", "golden"), "--reference")


def test_refresh_never_replaces_a_corrupt_golden_without_force(tmp_path):
    root = tmp_path / "golden"
    shutil.copytree(GOLDEN_DIR, root)
    target = root / "glm5-tp8.ci.edge-kv1" / "outputs.safetensors"
    target.write_bytes(b"corrupt")
    env = {"MLA_HARNESS_GOLDEN_DIR": str(root)}
    _one_error_line(harness("golden", "refresh", "--case", "glm5-tp8.ci.edge-kv1", env=env), "outputs_sha256", "--force")
    assert target.read_bytes() == b"corrupt"
    proc = harness("golden", "refresh", "--case", "glm5-tp8.ci.edge-kv1", "--force", env=env)
    assert proc.returncode == 0 and "overwritten" in proc.stdout
    assert harness("golden", "verify", "--case", "glm5-tp8.ci.edge-kv1", env=env).returncode == 0


def test_unwritable_output_fails_before_the_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _one_error_line(harness("run", "--device", "cpu", "--json", str(blocker / "r.json")), "--json")
    _one_error_line(harness("run", "--device", "cpu", "--dump-outputs", str(blocker / "d")), "--dump-outputs")
