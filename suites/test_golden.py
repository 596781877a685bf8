"""Golden files: verify passes as committed; tampering, corruption and drift are caught; refresh never silently overwrites."""

import json
import shutil

import pytest

from harness import golden
from harness.cases import GOLDEN_DIR, golden_case_names, load_case
from harness.errors import HarnessError

CASE = "glm5-tp8.ci.multistep-reuse"


@pytest.fixture
def golden_copy(tmp_path):
    shutil.copytree(GOLDEN_DIR / CASE, tmp_path / CASE)
    return tmp_path


def test_committed_goldens_include_prod_scale_and_multistep():
    names = golden_case_names()
    prod = [n for n in names if ".prod." in n]
    assert prod and all((GOLDEN_DIR / n / "manifest.json").is_file() for n in names)
    manifest = json.loads((GOLDEN_DIR / "glm5-tp8.prod.b128-l2048" / "manifest.json").read_text())
    assert manifest["scale"] == {"name": "prod", "slots": 495_552, "num_layers": 78}
    assert len(manifest["checked_request_ids"]) == 8 and 77 in {l for _, l in manifest["checked"]}
    assert json.loads((GOLDEN_DIR / "glm5-tp8.prod.multistep-reuse" / "manifest.json").read_text())["scenario"]["steps"] == 4


@pytest.mark.parametrize("name", ["glm5-tp8.ci.multistep-reuse", "glm5-tp8.prod.b1-l4096"])
def test_verify_recomputes_identically(name):
    stored = golden.load(name)
    assert golden.differences(stored, golden.compute(load_case(name))) == []


def test_tampered_outputs_are_detected(golden_copy):
    path = golden_copy / CASE / golden.OUTPUTS
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(HarnessError, match="outputs_sha256.*modified or corrupted"):
        golden.load(CASE, golden_copy)


def test_tampered_values_with_fixed_hash_are_caught_by_recompute(golden_copy):
    """An attacker who also rewrites the manifest hash is still caught by recomputation."""
    stored = golden.load(CASE, golden_copy)
    key = "s3.l1.out_fp32"
    stored.tensors[key][0, 0, 0] += 1e-3
    golden.write(stored, CASE, golden_copy)
    reloaded = golden.load(CASE, golden_copy)
    changes = golden.differences(reloaded, golden.compute(load_case(CASE)))
    assert any(c.startswith(key) for c in changes)


def test_corrupt_manifest_and_missing_files(golden_copy):
    manifest = golden_copy / CASE / golden.MANIFEST
    manifest.write_text("{not json")
    with pytest.raises(HarnessError, match="not valid JSON"):
        golden.load(CASE, golden_copy)
    manifest.unlink()
    with pytest.raises(HarnessError, match="manifest missing"):
        golden.load(CASE, golden_copy)
    with pytest.raises(HarnessError, match="manifest missing"):
        golden.load("no.such.case", golden_copy)


def test_generator_drift_is_reported(monkeypatch):
    stored = golden.load(CASE)
    monkeypatch.setattr("harness.synth.OUTLIER_MASK", 0x1FF)
    changes = golden.differences(stored, golden.compute(load_case(CASE)))
    assert any("generator drift" in c for c in changes)


def test_write_is_atomic_and_leaves_no_temp_files(golden_copy):
    stored = golden.load(CASE, golden_copy)
    golden.write(stored, CASE, golden_copy)
    assert sorted(p.name for p in (golden_copy / CASE).iterdir()) == [golden.MANIFEST, golden.OUTPUTS]
