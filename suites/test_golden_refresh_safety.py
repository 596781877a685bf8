"""Golden refresh destroys nothing of the user's and golden verify passes only what `run` accepts: a case
folder without a manifest, a file of the user's in one, a linked one, a re-signed seed, tensors of
other dtypes, leftovers of a killed refresh and an empty case list."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.inputs.cases import load_case
from harness.verify import golden
from suites.test_cli import _one_error_line, harness
from suites.test_outputs_and_goldens import CASE, _golden_copy, _resign


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_refresh_keeps_a_case_folder_without_a_manifest(tmp_path):
    """Without --force a folder that exists without a manifest is not a new case; with --force a
    file that is not the golden's own is not deleted: both exit 2, nothing changed."""
    root = _golden_copy(tmp_path, [CASE])
    (root / CASE / "manifest.json").unlink()
    (root / CASE / "NOTES.txt").write_text("mine\n")
    before = _contents(root / CASE)
    _one_error_line(harness("golden", "refresh", "--case", CASE, golden_dir=root),
                    "manifest.json", "existing case folder", "not overwritten (refresh --force replaces it)")
    assert _contents(root / CASE) == before
    _one_error_line(harness("golden", "refresh", "--case", CASE, "--force", golden_dir=root), "NOTES.txt", "not the golden's")
    assert _contents(root / CASE) == before
    (root / CASE / "NOTES.txt").unlink()
    (root / CASE / "gather_cast.obtained.safetensors").write_bytes(b"an earlier run's")
    proc = harness("golden", "refresh", "--case", CASE, "--force", golden_dir=root)
    assert proc.returncode == 0 and "overwritten (--force)" in proc.stdout, proc.stdout + proc.stderr
    assert sorted(_contents(root / CASE)) == ["manifest.json", "outputs.safetensors"]
    assert harness("golden", "verify", "--case", CASE, golden_dir=root).returncode == 0


def test_refresh_force_over_an_unreadable_golden_says_why_not_a_diff_of_every_field(tmp_path):
    """A golden whose outputs fail their hash cannot be diffed: --force rewrote it listing every field as
    `None -> ...` and "generator drift". It now names the reason it could not be read; twin: a readable changed golden
    still lists what changed."""
    root = _golden_copy(tmp_path, [CASE])
    outputs = root / CASE / "outputs.safetensors"
    data = bytearray(outputs.read_bytes())
    data[-1] ^= 0xFF
    outputs.write_bytes(bytes(data))
    proc = harness("golden", "refresh", "--case", CASE, "--force", golden_dir=root)
    assert proc.returncode == 0 and "overwritten (--force) an unreadable golden" in proc.stdout, proc.stdout + proc.stderr
    assert "outputs.safetensors" in proc.stdout and "generator drift" not in proc.stdout and "None ->" not in proc.stdout
    assert harness("golden", "verify", "--case", CASE, golden_dir=root).returncode == 0
    _resign(root, lambda m: m.update(seed=2))
    proc = harness("golden", "refresh", "--case", CASE, "--force", golden_dir=root)
    assert proc.returncode == 0 and "what changed" in proc.stdout and "  seed: 2 -> " in proc.stdout, proc.stdout


def test_a_file_where_the_case_folder_should_be_is_named_as_a_file(tmp_path):
    """verify (and run) called a file at the case folder's path a folder missing its manifest; refresh already named it
    a file. Twin: a folder without its manifest keeps its words."""
    root = _golden_copy(tmp_path, [CASE])
    shutil.rmtree(root / CASE)
    (root / CASE).write_text("mine\n")
    _one_error_line(harness("golden", "verify", "--case", CASE, golden_dir=root), "manifest.json", "is a file, not a folder")
    assert (root / CASE).read_text() == "mine\n"
    (root / CASE).unlink()
    (root / CASE).mkdir()
    _one_error_line(harness("golden", "verify", "--case", CASE, golden_dir=root), "missing from an existing case folder")


@pytest.mark.parametrize("field", ["seed", "reference_precision"])
def test_verify_sees_a_resigned_case_spec_and_refresh_force_repairs_it(tmp_path, field):
    """What `run` refuses as stale (case_mismatch) golden verify must not call ok, nor refresh unchanged."""
    root = _golden_copy(tmp_path, [CASE])
    _resign(root, lambda m: m.update({field: {"seed": 2, "reference_precision": "float32"}[field]}))
    proc = harness("golden", "verify", "--case", CASE, golden_dir=root)
    assert proc.returncode == 1 and f"  {field}: " in proc.stdout, proc.stdout + proc.stderr
    assert harness("golden", "refresh", "--case", CASE, golden_dir=root).returncode == 1
    proc = harness("golden", "refresh", "--case", CASE, "--force", golden_dir=root)
    assert proc.returncode == 0 and "overwritten (--force)" in proc.stdout, proc.stdout + proc.stderr
    assert golden.case_mismatch(golden.load(CASE, root), load_case(CASE)) == ""


RUN = ("run", "--device", "cpu", "--repeats", "0", "--strategy", "gather_cast", "--scenario", "b1-l500")


@pytest.mark.parametrize("edit, where", [
    (lambda m: m.update(seed=True), "$.seed"), (lambda m: m["scenario"].update(kv_lens=[500.0]), "$.scenario.kv_lens[0]"),
    (lambda m: m["scenario"].update(steps=True), "$.scenario.steps"), (lambda m: m["preset"].update(tp=8.0), "$.preset.tp"),
    (lambda m: m.update(tolerance={"atol": 1e9}), "unknown field `tolerance`"), (lambda m: m.update(created=5), "$.created"),
    (lambda m: m["preset"].update(atol=1e9), "unknown field `atol` - at `$.preset`"),
], ids=["seed-true", "kv_lens-float", "steps-true", "tp-float", "unknown-key", "created-int", "unknown-preset-key"])
def test_a_resigned_manifest_of_other_types_or_unknown_keys_is_refused(tmp_path, edit, where):
    """A re-signed manifest whose values are of another type (true == 1 == 1.0 in Python) or that holds a key no writer
    writes passed run, verify and refresh. Its schema declares every field the writer writes: exit 2 naming it."""
    root = _golden_copy(tmp_path, [CASE])
    _resign(root, edit)
    for args in (("golden", "verify", "--case", CASE), ("golden", "refresh", "--case", CASE), RUN):
        _one_error_line(harness(*args, golden_dir=root), "manifest.json", "GoldenManifest schema", where)


@pytest.mark.parametrize("value", [1, 1.0], ids=["int", "twin-float"])
def test_a_resigned_float_written_as_an_int_is_another_case(tmp_path, value):
    """yarn_factor 1 (an int, which the schema's float takes) for the writer's 1.0: == called it equal, so run,
    verify and refresh passed a manifest the writer never wrote. Compared type-strictly, run refuses it and verify
    reports it. Twin: 1.0 re-signed."""
    root = _golden_copy(tmp_path, [CASE])
    _resign(root, lambda m: m["preset"].update(yarn_factor=value))
    verify, run = harness("golden", "verify", "--case", CASE, golden_dir=root), harness(*RUN, golden_dir=root)
    if isinstance(value, float):  # not `value == 1.0`: 1 == 1.0 is the bug
        assert verify.returncode == 0 and run.returncode == 0, verify.stdout + run.stdout + run.stderr
        return
    assert verify.returncode == 1 and "  preset: " in verify.stdout, verify.stdout + verify.stderr
    _one_error_line(run, "manifest.json: preset.yarn_factor is 1, the case's is 1.0")
    assert harness("golden", "refresh", "--case", CASE, golden_dir=root).returncode == 1


@pytest.mark.parametrize("action", ["refresh", "verify"])
def test_an_empty_case_name_is_bad_input_not_every_case(tmp_path, action):
    """`golden refresh --case ''` (a CI variable left unset) refreshed every case. It is one error line, exit 2, and
    the folder is untouched."""
    root = _golden_copy(tmp_path, [CASE])
    before = _contents(root / CASE)
    _one_error_line(harness("golden", action, "--case", "", "--force", golden_dir=root) if action == "refresh"
                    else harness("golden", action, "--case", " ", golden_dir=root), "--case", "is empty")
    assert _contents(root / CASE) == before


def test_run_names_the_golden_it_read(tmp_path):
    """With --golden-dir, `run` refused a re-signed golden naming golden/<case>/manifest.json, the checkout's file, not
    the one at fault. It names the folder it read; so does its "checked against" line. Twin: the checkout's golden."""
    root = _golden_copy(tmp_path, [CASE])  # tmp_path/G: no "golden/" in its path
    args = ("run", "--device", "cpu", "--repeats", "0", "--strategy", "gather_cast", "--scenario", "b1-l500")
    proc = harness(*args, golden_dir=root)
    assert proc.returncode == 0 and f"checked against {root / CASE}" in proc.stdout, proc.stdout + proc.stderr
    _resign(root, lambda m: m.update({"seed": 2}))
    _one_error_line(harness(*args, golden_dir=root), f"error: {root / CASE / 'manifest.json'}: seed is", "a stale or edited golden")


@pytest.mark.parametrize("name,retype", [
    ("s0.l0.out_fp32", lambda t: t.double()), ("s0.l1.lse", lambda t: t.half()), ("s0.positions", lambda t: t.float()),
    ("s0.l0.out_bf16", lambda t: t.float()), ("s0.l1.lse", lambda t: t[..., None]),
], ids=["out_fp32-float64", "lse-float16", "positions-float32", "out_bf16-float32", "lse-rank3"])
def test_a_resigned_golden_of_other_dtypes_is_one_line(tmp_path, name, retype):
    """Each stored tensor's dtype and rank is checked on load: exit 2 naming the file and tensor, never a
    traceback nor a pass that `run` then trips over."""
    root = _golden_copy(tmp_path, [CASE])
    stored = golden.load(CASE, root)
    stored.tensors[name] = retype(stored.tensors[name])
    golden.write(stored, CASE, root)  # re-signed
    _one_error_line(harness("golden", "verify", "--case", CASE, golden_dir=root), f"outputs.safetensors: {name}", "expected")
    _one_error_line(harness("run", "--device", "cpu", "--repeats", "0", "--strategy", "gather_cast", "--scenario", "b1-l500",
                            golden_dir=root), f"outputs.safetensors: {name}")


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` (but the refresh lock), by its path there: what a command left on disk."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != golden.LOCK}


def test_empty_old_folders_of_a_killed_refresh_are_removed(tmp_path):
    """A refresh killed (or failed) before its first rename leaves a .<case>.old-* holding only its mark: the next
    refresh removes it with the other leftovers it marked; folders of such names without the mark, or holding a file
    of the user's, are not the harness's and stay."""
    root = _golden_copy(tmp_path, [CASE])
    users = [f".{CASE}.new-mine", f".{CASE}.old-full", f".{CASE}.old-nest", f".{CASE}.older"]  # names only: the user's
    for name in users:
        (root / name).mkdir()
    empty, killed, used = (golden._marked_folder(root, f".{CASE}.{kind}-") for kind in ("old", "new", "new"))
    (killed / golden.MANIFEST).write_text("{}")  # what a killed refresh leaves: removed (twin)
    (used / "NOTES.txt").write_text("mine\n")  # a marked folder the user has since put a file of theirs into
    (root / f".{CASE}.old-full" / "NOTES.txt").write_text("mine\n")
    (root / f".{CASE}.new-mine" / "NOTES.txt").write_text("mine\n")
    shutil.copytree(root / CASE, root / f".{CASE}.old-nest" / CASE)  # a golden copy beside the user's own file
    (root / f".{CASE}.old-nest" / "NOTES.txt").write_text("mine\n")
    proc = harness("golden", "refresh", "--case", CASE, golden_dir=root)
    assert proc.returncode == 0 and f"removed {empty.name}, left by a killed refresh" in proc.stdout, proc.stdout + proc.stderr
    assert f"removed {killed.name}, left by a killed refresh" in proc.stdout
    assert sorted(p.name for p in root.iterdir() if p.name != golden.LOCK) == sorted([*users, used.name, "cases.toml", CASE])
    assert (root / f".{CASE}.new-mine" / "NOTES.txt").read_text() == "mine\n" and (root / f".{CASE}.old-nest" / CASE).is_dir()
    assert (used / "NOTES.txt").read_text() == "mine\n"


def test_verify_deletes_nothing_not_even_a_killed_refreshs_leftovers(tmp_path):
    """`cp -r G/<case> G/.<case>.new-mybackup`, then golden verify (a read-only command): it exited 0 and removed the
    whole backup as "left by a killed refresh". verify now deletes nothing, a marked leftover of a refresh included."""
    root = _golden_copy(tmp_path, [CASE])
    shutil.copytree(root / CASE, root / f".{CASE}.new-mybackup")
    for marked in (False, True):
        if marked:
            (golden._marked_folder(root, f".{CASE}.new-") / golden.OUTPUTS).write_bytes(b"half written")
            golden._marked_folder(root, f".{CASE}.old-")
        before = _tree(root)
        proc = harness("golden", "verify", "--case", CASE, golden_dir=root)
        assert proc.returncode == 0 and "removed" not in proc.stdout, proc.stdout + proc.stderr
        assert _tree(root) == before


def test_refresh_removes_only_the_folders_it_marked_as_its_own(tmp_path):
    """A refresh removes a .<case>.new-*/.old-* only when it holds the mark a refresh writes first, naming that folder:
    the user's backup copy of the case, an unmarked empty old folder, an unmarked previous golden and a copy of a
    marked leftover under another name all stay, named in one line. Twin: the marked leftover itself is removed."""
    root = _golden_copy(tmp_path, [CASE])
    shutil.copytree(root / CASE, root / f".{CASE}.new-mybackup")
    (root / f".{CASE}.old-bare").mkdir()
    shutil.copytree(root / CASE, root / f".{CASE}.old-mine" / CASE)
    kept = [f".{CASE}.new-mybackup", f".{CASE}.old-bare", f".{CASE}.old-mine"]

    def refresh(*removed: str) -> None:
        before = {k: v for k, v in _tree(root).items() if k.startswith(tuple(kept))}
        proc = harness("golden", "refresh", "--case", CASE, golden_dir=root)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert [line for line in proc.stdout.splitlines() if "removed" in line] == [
            f"{CASE}: removed {name}, left by a killed refresh" for name in removed]
        assert {k: v for k, v in _tree(root).items() if k.startswith(tuple(kept))} == before
        assert [line for line in proc.stdout.splitlines() if "alone" in line] == [
            f"{CASE}: left {', '.join(kept)} alone: not marked as a refresh's own, or holding other files"]

    refresh()
    marked = golden._marked_folder(root, f".{CASE}.new-")
    shutil.copytree(marked, root / f".{CASE}.new-copied")  # its mark names the folder it was copied from
    kept.insert(0, f".{CASE}.new-copied")
    refresh(marked.name)
    assert not marked.exists()


@pytest.mark.parametrize("action", ["verify", "refresh"])
def test_an_empty_case_list_is_bad_input(tmp_path, action):
    """`case = []` checks nothing: exit 2 naming cases.toml's case, as a missing `case` key does."""
    (tmp_path / "cases.toml").write_text("case = []\n")
    _one_error_line(harness("golden", action, golden_dir=tmp_path), "cases.toml: case", "one or more")


def test_refresh_force_refuses_a_linked_case_folder(tmp_path):
    """golden/<case> a link to a folder elsewhere (or a file): verify reads through it, refresh --force neither
    replaces it by a folder nor writes through it: exit 2 naming it, nothing changed."""
    root = _golden_copy(tmp_path, [CASE])
    _resign(root, lambda m: m.update(seed=2))  # a change refresh --force would write
    elsewhere = tmp_path / "elsewhere" / CASE
    elsewhere.parent.mkdir()
    (root / CASE).rename(elsewhere)
    (root / CASE).symlink_to(elsewhere)
    before = _contents(elsewhere)
    assert harness("golden", "verify", "--case", CASE, golden_dir=root).returncode == 1
    (elsewhere / "outputs.obtained.safetensors").unlink()
    _one_error_line(harness("golden", "refresh", "--case", CASE, "--force", golden_dir=root), CASE, "a link")
    assert (root / CASE).is_symlink() and _contents(elsewhere) == before
    (root / CASE).unlink()
    (root / CASE).write_text("mine\n")
    _one_error_line(harness("golden", "refresh", "--case", CASE, "--force", golden_dir=root), CASE, "a file")
    assert (root / CASE).read_text() == "mine\n"


@pytest.mark.parametrize("linked", [True, False], ids=["linked", "twin-real-folder"])
def test_refresh_without_force_writes_nothing_through_a_linked_case_folder(tmp_path, linked):
    """Without --force a changed golden behind a linked case folder got its obtained file written through the link
    (exit 1: 'CHANGED, not written'). Refused before either path: exit 2 naming the link, the target untouched.
    Twin: the same golden in a real folder is reported changed (exit 1) with its obtained file."""
    root = _golden_copy(tmp_path, [CASE])
    stored = golden.load(CASE, root)
    stored.tensors["s0.l1.out_fp32"][0, 0, :4] += 0.25
    golden.write(stored, CASE, root)  # re-signed and changed
    target = root / CASE
    if linked:
        target = root / "realcase"
        (root / CASE).rename(target)
        (root / CASE).symlink_to("realcase")
    before = _contents(target)
    proc = harness("golden", "refresh", "--case", CASE, golden_dir=root)
    if linked:
        _one_error_line(proc, f"{root / CASE}: a link")
        assert _contents(target) == before and (root / CASE).is_symlink()
    else:
        assert proc.returncode == 1 and "CHANGED, not written" in proc.stdout, proc.stdout + proc.stderr
        assert sorted(_contents(target)) == sorted([*before, "outputs.obtained.safetensors"])


def test_a_golden_folder_that_takes_no_obtained_file_does_not_fail_the_run(tmp_path, monkeypatch):
    """A read-only case folder (or a full disk): a strategy that misses its golden fails (exit 1) and verify
    reports the change (exit 1), each saying the obtained file was not written; neither stops at exit 2 'cannot write'."""
    import errno

    from harness import fsio

    root = _golden_copy(tmp_path, [CASE])
    stored = golden.load(CASE, root)
    stored.tensors["s0.l1.out_fp32"][0, 0, :4] += 0.25
    golden.write(stored, CASE, root)  # re-signed and changed: the run misses it, verify's recomputation differs
    real_open = fsio.os.open

    def read_only(path, *args, **kwargs):
        if ".obtained.safetensors.tmp-" in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(fsio.os, "open", read_only)
    run = harness("run", "--device", "cpu", "--repeats", "0", "--strategy", "stock", "--scenario", "b1-l500", golden_dir=root)
    assert run.returncode == 1 and "check failed: stock" in run.stderr, run.stdout + run.stderr
    assert "obtained outputs not written" in run.stdout and "Permission denied" in run.stdout, run.stdout
    verify = harness("golden", "verify", "--case", CASE, golden_dir=root)
    assert verify.returncode == 1 and "1 case(s) differ" in verify.stderr, verify.stdout + verify.stderr
    assert "obtained outputs not written" in verify.stdout and not list((root / CASE).glob("*.obtained.*"))


@pytest.mark.parametrize("name,reshape", [
    ("s0.l0.lse", lambda t: t.T.contiguous()), ("s0.l1.out_fp32", lambda t: t[:, :4].contiguous()),
    ("s0.l0.out_bf16", lambda t: t[..., :256].contiguous()), ("s0.l1.out_bf16", lambda t: t.repeat(2, 1, 1)),
], ids=["lse-transposed", "out_fp32-half-the-heads", "out_bf16-half-the-width", "out_bf16-twice-the-rows"])
def test_a_resigned_golden_of_other_shapes_is_refused_not_blamed_on_the_strategies(tmp_path, name, reshape):
    """A stored tensor of the right dtype and rank but another shape: `run` refuses the golden (exit 2 naming the
    tensor), it does not fail every strategy with 'no golden element compared'; verify reports it reshaped."""
    root = _golden_copy(tmp_path, [CASE])
    stored = golden.load(CASE, root)
    stored.tensors[name] = reshape(stored.tensors[name])
    golden.write(stored, CASE, root)  # re-signed
    _one_error_line(harness("run", "--device", "cpu", "--repeats", "0", "--strategy", "gather_cast", "--scenario", "b1-l500",
                            golden_dir=root), f"{root / CASE}: does not cover the case", f"{name} is shaped")
    assert not list((root / CASE).glob("*.obtained.*"))
    verify = harness("golden", "verify", "--case", CASE, golden_dir=root)
    assert verify.returncode == 1 and f"{name}: missing or reshaped" in verify.stdout, verify.stdout + verify.stderr


@pytest.mark.parametrize("name", ["s0.l7.out_fp32", "s1.positions", "notes"])
def test_a_resigned_golden_with_a_tensor_it_does_not_check_is_one_line(tmp_path, name):
    """outputs.safetensors holds exactly the tensors of the manifest's checked list: one more (another layer's, another
    step's, anything) is no golden a refresh writes, and verify must not call it ok: exit 2 naming the file and tensor."""
    root = _golden_copy(tmp_path, [CASE])
    stored = golden.load(CASE, root)
    stored.tensors[name] = stored.tensors["s0.l0.out_fp32"].clone()
    golden.write(stored, CASE, root)  # re-signed
    _one_error_line(harness("golden", "verify", "--case", CASE, golden_dir=root), f"outputs.safetensors: {name}", "not a tensor")
    _one_error_line(harness("run", "--device", "cpu", "--repeats", "0", "--strategy", "gather_cast", "--scenario", "b1-l500",
                            golden_dir=root), f"outputs.safetensors: {name}")


@pytest.mark.parametrize("name,value", [("s0.l0.out_fp32", float("nan")), ("s0.l1.out_bf16", float("inf")), ("s0.l0.lse", -float("inf"))])
def test_a_resigned_golden_holding_nan_or_infinity_is_one_line(tmp_path, name, value):
    """A non-finite stored value is no float64 reference's: run must not fail every strategy against it, nor verify
    report it as a mere change; both exit 2 naming the file and tensor."""
    root = _golden_copy(tmp_path, [CASE])
    stored = golden.load(CASE, root)
    stored.tensors[name].view(-1)[0] = value
    golden.write(stored, CASE, root)  # re-signed
    _one_error_line(harness("golden", "verify", "--case", CASE, golden_dir=root), f"outputs.safetensors: {name}", "NaN or infinity")
    _one_error_line(harness("run", "--device", "cpu", "--repeats", "0", "--strategy", "gather_cast", "--scenario", "b1-l500",
                            golden_dir=root), f"outputs.safetensors: {name}", "NaN or infinity")


def test_a_backup_of_the_users_is_never_moved_into_the_missing_case_folder(tmp_path):
    """`mv G/<case> G/.<case>.old-mine/`: verify and run renamed the unmarked backup into the case folder, saying
    nothing, and refresh --force then overwrote it: its bytes were nowhere. Only a folder a refresh marked is put back:
    verify and run say the case folder is missing, naming the backup they left; refresh writes a new case beside it."""
    root = _golden_copy(tmp_path, [CASE])
    backup = root / f".{CASE}.old-mine"
    backup.mkdir()
    (root / CASE).rename(backup / CASE)
    before = _tree(root)
    kept = lambda: {k: v for k, v in _tree(root).items() if k.startswith(backup.name)}  # noqa: E731
    mine = kept()
    for args in (("golden", "verify", "--case", CASE), RUN):
        _one_error_line(harness(*args, golden_dir=root), str(root / CASE / golden.MANIFEST), "its case folder too",
                        f"{backup.name} left alone")
        assert _tree(root) == before
    proc = harness("golden", "refresh", "--case", CASE, "--force", golden_dir=root)
    assert proc.returncode == 0 and "written (new case)" in proc.stdout, proc.stdout + proc.stderr
    assert f"{CASE}: left {backup.name} alone" in proc.stdout
    assert kept() == mine
    golden.load(CASE, root)


@pytest.mark.parametrize("renamed", [False, True], ids=["before-the-last-rename", "after-it"])
def test_a_refresh_killed_mid_swap_leaves_only_what_the_next_refresh_removes(tmp_path, monkeypatch, renamed):
    """A refresh killed (SIGKILL: no cleanup) between the swap's renames left .<case>.new-* a full golden without its
    mark: every later refresh called it the user's and kept it. The new golden is unmarked only once it is the case
    folder: verify then reads a golden, and the next refresh removes every leftover. Twin: killed after the last
    rename, before the mark left the case folder."""
    class Killed(BaseException):
        pass

    root = _golden_copy(tmp_path, [CASE])
    stored, real = golden.load(CASE, root), golden.os.replace

    def dies(src, dst):  # at the swap's last rename, the new golden's into the case folder
        last = Path(src).name.startswith(f".{CASE}.new-")
        if not last or renamed:
            real(src, dst)
        if last:
            raise Killed

    monkeypatch.setattr(golden.os, "replace", dies)
    monkeypatch.setattr(golden.shutil, "rmtree", lambda *a, **k: None)
    with pytest.raises(Killed):
        golden.write(stored, CASE, root)
    monkeypatch.undo()
    assert harness("golden", "verify", "--case", CASE, golden_dir=root).returncode == 0
    proc = harness("golden", "refresh", "--case", CASE, golden_dir=root)
    assert proc.returncode == 0 and "alone" not in proc.stdout and "removed" in proc.stdout, proc.stdout + proc.stderr
    assert sorted(p.name for p in root.iterdir() if p.name != golden.LOCK) == ["cases.toml", CASE]
    assert sorted(p.name for p in (root / CASE).iterdir()) == [golden.MANIFEST, golden.OUTPUTS]
