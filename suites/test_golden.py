"""Golden files: verify passes as committed; tampering, corruption and drift are caught; refresh never silently overwrites."""

import json
import math
import os
import shutil
from dataclasses import replace

import pytest
import torch

from harness.errors import HarnessError
from harness.inputs.cases import GOLDEN_DIR, golden_case_names, load_case
from harness.verify import golden

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


def _header(tensors: dict, pad: bytes = b"") -> bytes:
    """A safetensors file's first bytes: the header's length, then the JSON header (`pad` follows it)."""
    return _raw_header(json.dumps(tensors).encode(), pad)


def _raw_header(text: bytes, pad: bytes = b"") -> bytes:
    return len(text).to_bytes(8, "little") + text + pad


@pytest.mark.parametrize("make, message", [
    (lambda path: os.truncate(path, 3 << 30), "3221225472 bytes, but its header declares"),  # sparse: no disk used
    (lambda path: path.write_bytes(_header({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(8))
                                   + b"\0" * 8), "85 bytes, but its header declares 77 (8 + a 61-byte header + 8 of tensors)"),
    (lambda path: path.write_bytes(b"\xff" * 4096), "its 4096 bytes do not hold the header its first 8 announce"),
    (lambda path: path.write_bytes((9).to_bytes(8, "little") + b"{not json"), "its header is not JSON"),
    (lambda path: path.write_bytes(_header({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})),
     "does not match the safetensors header schema"),
    (lambda path: path.write_bytes(_header({"x": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8))),
     "x: dtype 'F64', expected one a golden stores"),
    (lambda path: path.write_bytes(_header({"x": {"dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 4]}}, bytes(4))),
     "x: data_offsets [0, 4] are not the F32 [1099511627776]'s bytes from offset 0"),
    (lambda path: path.write_bytes(_raw_header(b'{"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                                               b'"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', bytes(4))),
     "x: not a safetensors file: its header names this tensor twice"),  # json.loads kept the last one
], ids=["sparse-3GiB", "padded", "header-past-the-end", "header-not-json", "negative-shape", "foreign-dtype", "huge-shape",
        "tensor-named-twice"])
def test_a_huge_or_malformed_outputs_file_is_refused_before_hashing(golden_copy, monkeypatch, make, message):
    """The outputs file's header is read first: a sparse 3 GiB file, one padded past its tensors, and one whose header
    does not parse or declare a golden's tensors are refused with one line naming the file, never hashed (before:
    hashed first, ~23 s for a 20 GiB file, then refused as 'modified or corrupted')."""
    path = golden_copy / CASE / golden.OUTPUTS
    make(path)
    monkeypatch.setattr(golden, "_sha256_file", lambda p: pytest.fail(f"{p} was hashed"))
    with pytest.raises(HarnessError) as caught:
        golden.load(CASE, golden_copy)
    assert str(caught.value).startswith(f"{path}") and message in str(caught.value) and "\n" not in str(caught.value)


def test_a_scenario_description_is_no_part_of_a_goldens_case(golden_copy):
    """A golden matches its case whatever the scenario's description says (prose): a manifest that records one and a
    case whose description was reworded, built in or from the user's file, still match; a changed seed does not (before:
    the description was compared, so a reworded one made the golden another case)."""
    case, stored = load_case(CASE), golden.load(CASE, golden_copy)
    for source in (case.scenario.source, str(golden_copy / "mine.toml")):
        reworded = replace(case, scenario=replace(case.scenario, description="reworded", source=source))
        assert golden.case_mismatch(stored, reworded) == "" and golden.spec_mismatch(stored, reworded) == ""
        reseeded = replace(reworded, scenario=replace(reworded.scenario, seed=reworded.scenario.seed + 1))
        assert golden.case_mismatch(stored, reseeded).startswith("seed is")


def test_tampered_values_with_fixed_hash_are_caught_by_recompute(golden_copy):
    """An attacker who also rewrites the manifest hash is still caught by recomputation."""
    stored = golden.load(CASE, golden_copy)
    key = "s3.l1.out_fp32"
    stored.tensors[key][0, 0, 0] += 1e-3
    golden.write(stored, CASE, golden_copy)
    reloaded = golden.load(CASE, golden_copy)
    changes = golden.differences(reloaded, golden.compute(load_case(CASE)))
    assert any(c.startswith(key) for c in changes)


@pytest.mark.parametrize("ulps, changed", [(10, True), (1, False)])
def test_recompute_sees_ten_ulps_of_one_fp32_output_and_allows_one(golden_copy, ulps, changed):
    """The float64 reference stored as fp32 is recomputed within RECOMPUTE_RTOL (about 2 ulps): a golden re-signed from
    a reference 10 ulps off (an fp32 reference's error) is a change; 1 ulp (the documented allowance) is not. A 100x
    looser RECOMPUTE_RTOL passed every test, whose tampering was 4,000x the allowance."""
    stored = golden.load(CASE, golden_copy)
    key = "s3.l1.out_fp32"
    value = stored.tensors[key][0, 0, 0]
    bent = value
    for _ in range(ulps):
        bent = torch.nextafter(bent, torch.tensor(math.inf))
    stored.tensors[key][0, 0, 0] = bent
    golden.write(stored, CASE, golden_copy)
    changes = golden.differences(golden.load(CASE, golden_copy), golden.compute(load_case(CASE)))
    assert any(c.startswith(key) for c in changes) == changed, changes


@pytest.mark.parametrize("name", ["s0.l0.out_bf16", "s0.l0.out_fp32", "s0.l1.out_bf16", "s0.l1.out_fp32"])
def test_zeros_of_the_other_sign_are_a_change(tmp_path, name):
    """edge-kv1's outputs hold exact zeros (+0 in layer 0, some -0 in layer 1): a re-signed golden whose zeros flipped
    sign is other bytes, which verify passed (torch.equal and allclose take -0.0 == 0.0). Twin: the golden as committed."""
    case = "glm5-tp8.ci.edge-kv1"
    shutil.copytree(GOLDEN_DIR / case, tmp_path / case)
    stored, fresh = golden.load(case, tmp_path), golden.compute(load_case(case))
    assert golden.differences(stored, fresh) == []
    zeros = stored.tensors[name] == 0
    assert zeros.any()
    stored.tensors[name][zeros] = -stored.tensors[name][zeros]  # +0 -> -0, -0 -> +0
    golden.write(stored, case, tmp_path)
    assert [c.split(":")[0] for c in golden.differences(golden.load(case, tmp_path), fresh)] == [name]


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
    monkeypatch.setattr("harness.spec.synth.OUTLIER_MASK", 0x1FF)
    changes = golden.differences(stored, golden.compute(load_case(CASE)))
    assert any("generator drift" in c for c in changes)


def test_write_is_atomic_and_leaves_no_temp_files(golden_copy):
    stored = golden.load(CASE, golden_copy)
    golden.write(stored, CASE, golden_copy)
    assert sorted(p.name for p in (golden_copy / CASE).iterdir()) == [golden.MANIFEST, golden.OUTPUTS]
    assert sorted(p.name for p in golden_copy.iterdir() if p.name != golden.LOCK) == [CASE]


def _edit_manifest(root, case, edit, rehash=False):
    path = root / case / golden.MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    if rehash:
        manifest["manifest_sha256"] = golden.manifest_digest(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("checked", [[], "ab", [[0]], [[0, 1.5]]])
def test_manifest_fields_are_hashed_and_typed(golden_copy, checked):
    """Everything a verdict depends on is covered: an edited `checked` fails the hash, and a
    re-hashed one of the wrong shape fails the schema (one HarnessError, never a traceback)."""
    _edit_manifest(golden_copy, CASE, lambda m: m.update(checked=checked))
    with pytest.raises(HarnessError, match="manifest_sha256"):
        golden.load(CASE, golden_copy)
    _edit_manifest(golden_copy, CASE, lambda m: None, rehash=True)
    with pytest.raises(HarnessError, match="schema|empty"):
        golden.load(CASE, golden_copy)


def test_rehashed_partial_golden_does_not_cover_the_case(golden_copy):
    """A golden re-signed to check fewer (step, layer)s: with their tensors left in the file, load refuses them;
    with them dropped too, run's coverage check does."""
    _edit_manifest(golden_copy, CASE, lambda m: m.update(checked=m["checked"][:1]), rehash=True)
    with pytest.raises(HarnessError, match="not a tensor of this golden"):
        golden.load(CASE, golden_copy)
    stored = golden.load(CASE)
    stored.manifest["checked"] = stored.manifest["checked"][:1]
    step, layer = stored.manifest["checked"][0]
    stored.tensors = {k: v for k, v in stored.tensors.items() if k == f"s{step}.positions" or k.startswith(f"s{step}.l{layer}.")}
    golden.write(stored, CASE, golden_copy)
    gap = golden.coverage_gap(golden.load(CASE, golden_copy), load_case(CASE))
    assert gap.startswith("checked")
    assert golden.coverage_gap(golden.load(CASE), load_case(CASE)) == ""


def test_swapped_case_folders_are_an_error(tmp_path):
    other = "glm5-tp8.ci.b1-l500"
    shutil.copytree(GOLDEN_DIR / CASE, tmp_path / other)
    with pytest.raises(HarnessError, match="swapped"):
        golden.load(other, tmp_path)


def test_failed_swap_keeps_the_previous_golden(golden_copy, monkeypatch):
    """The second rename of the swap fails: the previous golden is put back, loadable, unchanged."""
    stored = golden.load(CASE, golden_copy)
    before = (golden_copy / CASE / golden.OUTPUTS).read_bytes()
    stored.tensors["s0.l0.out_fp32"][0, 0, 0] += 1
    real = golden.os.replace

    def failing(src, dst):
        if str(src).split("/")[-1].startswith(f".{CASE}.new-"):
            raise OSError(5, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(golden.os, "replace", failing)
    with pytest.raises(HarnessError, match="swap failed"):
        golden.write(stored, CASE, golden_copy)
    monkeypatch.undo()
    assert (golden_copy / CASE / golden.OUTPUTS).read_bytes() == before
    assert sorted(p.name for p in golden_copy.iterdir() if p.name != golden.LOCK) == [CASE]
    golden.load(CASE, golden_copy)


def test_killed_swap_is_recovered_by_the_next_load(golden_copy):
    """A refresh killed between the two renames leaves .<case>.old-*/<case> in its marked folder: load puts it back,
    deleting nothing (the folder, holding only the mark, is the next refresh's to remove)."""
    stranded = golden._marked_folder(golden_copy, f".{CASE}.old-")
    (golden_copy / CASE).rename(stranded / CASE)
    golden.load(CASE, golden_copy)
    assert (golden_copy / CASE / golden.MANIFEST).is_file() and [p.name for p in stranded.iterdir()] == [golden.MARK]


def test_concurrent_refreshes_are_serialized(golden_copy):
    import threading

    stored = golden.load(CASE, golden_copy)
    errors = []

    def refresh():
        try:
            golden.write(golden.GoldenData(dict(stored.tensors), dict(stored.manifest)), CASE, golden_copy)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=refresh) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    golden.load(CASE, golden_copy)


def test_refreshed_golden_gets_shareable_modes(golden_copy):
    import os

    old = os.umask(0o022)
    try:
        golden.write(golden.load(CASE, golden_copy), CASE, golden_copy)
    finally:
        os.umask(old)
    assert (golden_copy / CASE).stat().st_mode & 0o777 == 0o755
    assert {p.stat().st_mode & 0o777 for p in (golden_copy / CASE).iterdir()} == {0o644}


def test_bad_cases_toml_entry_names_the_file_and_field(tmp_path, monkeypatch):
    from harness.inputs import cases

    table = tmp_path / "cases.toml"
    table.write_text('[[case]]\npreset = "nope"\nscale = "ci"\nscenario = "b1-l500"\n')
    monkeypatch.setenv("MLA_HARNESS_GOLDEN_DIR", str(tmp_path))
    with pytest.raises(HarnessError, match=r"cases.toml: case 'nope.ci.b1-l500'.preset"):
        cases.load_case("nope.ci.b1-l500")
    table.write_text('[[case]]\npreset = 3\nscale = "ci"\nscenario = "b1-l500"\n')
    with pytest.raises(HarnessError, match=r"cases.toml: case\[0\].preset"):
        cases.golden_case_names()


@pytest.mark.parametrize("name", [golden.MANIFEST, golden.OUTPUTS])
@pytest.mark.parametrize("target", ["folder", "dangling", "/dev/zero"])
def test_a_golden_file_that_is_no_regular_file_is_named_so(golden_copy, name, target):
    """A golden file replaced by a folder, a dangling link or a link to a device was reported 'missing' (for the
    manifest: 'run golden refresh'), sending the user to look for a file that is there."""
    path = golden_copy / CASE / name
    path.unlink()
    if target == "folder":
        path.mkdir()
    else:
        path.symlink_to(golden_copy / "nothing-here" if target == "dangling" else target)
    with pytest.raises(HarnessError, match="not a regular file") as info:
        golden.load(CASE, golden_copy)
    assert str(path) in str(info.value)
