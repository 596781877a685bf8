"""A refresh killed while it deletes a folder of its own leaves only what the next refresh recognises and removes.

The kill: every unlink, rmdir, rename and replace after the deletion begins is a point where the process may die
(SIGKILL: nothing more runs, no `finally`, no `except`). Each point is tried in turn, in a fresh golden folder beside
folders of the user's; verify must then delete nothing, and the next refresh must remove every remainder and leave
the user's folders as they were. shutil.rmtree removed a marked folder in the directory's order: killed after the
mark went, the remainder (a partial golden, or an empty folder) was the user's for ever."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from harness.verify import golden
from suites.test_cli import harness
from suites.test_outputs_and_goldens import CASE, _golden_copy

OBTAINED = f"{Path(golden.OUTPUTS).stem}.obtained.safetensors"  # a golden file a swap also deletes
MAX_POINTS = 40  # far more than any deletion here makes


class Killed(BaseException):
    """The process died here."""


class Kill:
    """Patches os.unlink/rmdir/rename/replace: once armed, the `at`-th call dies, and so does every call after it."""

    def __init__(self, monkeypatch, at: int, arm_on_swap: bool = False):
        self.at, self.count, self.armed, self.dead = at, 0, False, False
        self.arm_on_swap = arm_on_swap
        for name in ("unlink", "rmdir", "rename", "replace"):
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))

    def _wrap(self, real):
        def call(*args, **kwargs):
            if golden.LOCK in os.fspath(args[0]):  # the file lock's own files: not the deletion's
                return real(*args, **kwargs)
            if self.dead:
                raise Killed
            if self.armed:
                self.count += 1
                if self.count == self.at:
                    self.dead = True
                    raise Killed
            result = real(*args, **kwargs)
            if self.arm_on_swap and real.__name__ == "replace" and Path(args[0]).name.startswith(f".{CASE}.new-"):
                self.armed = True  # the new golden is the case folder: what follows is the old one's deletion
            return result
        return call


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under `root` but the refresh lock."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
            for p in sorted(root.rglob("*")) if p.name != golden.LOCK}


def _users(root: Path) -> list[str]:
    """Folders and a file of the user's named like a refresh's: an unmarked backup of the case, an unmarked empty
    folder, and a file named like a mark moved aside that names no folder. Their names."""
    backup = root / f".{CASE}.old-mine"
    backup.mkdir()
    shutil.copytree(root / CASE, backup / CASE)
    (root / f".{CASE}.new-bare").mkdir()
    (root / f"{golden.MARK}.{CASE}.old-notes").write_text("mine\n")
    return [f".{CASE}.new-bare", f".{CASE}.old-mine", f"{golden.MARK}.{CASE}.old-notes"]


def _killed_swap(root: Path) -> None:
    """A --force refresh swaps the golden in, then deletes the previous one (and the obtained file beside it)."""
    (root / CASE / OBTAINED).write_bytes(b"obtained")
    golden.write(golden.load(CASE, root), CASE, root)


def _killed_recovery(root: Path) -> None:
    """A refresh removes what an earlier killed one left: a previous golden stranded in its marked old folder, and a
    half-written new folder."""
    stranded = golden._marked_folder(root, f".{CASE}.old-")
    shutil.copytree(root / CASE, stranded / CASE)
    half = golden._marked_folder(root, f".{CASE}.new-")
    shutil.copy(root / CASE / golden.OUTPUTS, half / golden.OUTPUTS)
    shutil.copy(root / CASE / golden.MANIFEST, half / golden.MANIFEST)
    golden.clean_leftovers(CASE, root)


def _killed_failed_write(root: Path, monkeypatch, kill: Kill) -> None:
    """A refresh whose manifest write fails (a full disk) deletes its half-written new folder."""
    def full(*args, **kwargs):
        kill.armed = True
        raise golden.HarnessError("manifest.json", "No space left on device")

    monkeypatch.setattr(golden, "write_text", full)
    golden.write(golden.load(CASE, root), CASE, root)


@pytest.mark.parametrize("deletion", ["swap", "recovery", "failed-write"])
def test_a_refresh_killed_while_deleting_leaves_only_what_the_next_refresh_removes(tmp_path, deletion):
    points = 0
    for at in range(1, MAX_POINTS):
        (tmp_path / str(at)).mkdir()
        root = _golden_copy(tmp_path / str(at), [CASE])
        users = _users(root)
        mine = {k: v for k, v in _tree(root).items() if k.startswith(tuple(users))}
        with pytest.MonkeyPatch.context() as mp:
            kill = Kill(mp, at, arm_on_swap=deletion == "swap")
            kill.armed = deletion == "recovery"
            try:
                if deletion == "swap":
                    _killed_swap(root)
                elif deletion == "recovery":
                    _killed_recovery(root)
                else:
                    _killed_failed_write(root, mp, kill)
            except Killed:
                pass
            except golden.HarnessError:
                assert deletion == "failed-write"  # its deletion ran through: no kill point left
            if not kill.dead:
                break
        points += 1
        where = f"killed at the deletion's call {at}"
        before = _tree(root)
        proc = harness("golden", "verify", "--case", CASE, golden_dir=root)
        assert proc.returncode == 0, f"{where}: {proc.stdout}{proc.stderr}"
        assert _tree(root) == before, f"{where}: verify deleted or moved something"
        proc = harness("golden", "refresh", "--case", CASE, golden_dir=root)
        assert proc.returncode == 0, f"{where}: {proc.stdout}{proc.stderr}"
        assert [line for line in proc.stdout.splitlines() if "alone" in line] == [
            f"{CASE}: left {', '.join(users[:2])} alone: not marked as a refresh's own, or holding other files"], \
            f"{where}: {proc.stdout}"
        assert any("left by a killed refresh" in line for line in proc.stdout.splitlines()), f"{where}: {proc.stdout}"
        left = sorted(p.name for p in root.iterdir() if p.name != golden.LOCK)
        assert left == sorted([*users, "cases.toml", CASE]), f"{where}: {left}"
        assert {k: v for k, v in _tree(root).items() if k.startswith(tuple(users))} == mine, f"{where}: the user's changed"
        assert golden.MARK not in os.listdir(root / CASE), where
        golden.load(CASE, root)
    assert points >= 3, f"only {points} kill points: the deletion was not reached"


def test_a_mark_moved_aside_is_removed_and_its_folder_only_while_empty(tmp_path):
    """A deletion killed after it moved the emptied folder's mark aside: the next refresh removes the mark and the
    empty folder it names, or the mark alone once the folder is gone; a folder the user has since put a file into
    stays, unmarked (theirs). verify deletes none of it, and with the case folder missing does not call the marked
    empty folder the user's."""
    root = _golden_copy(tmp_path, [CASE])
    empty, used, gone = (golden._marked_folder(root, f".{CASE}.old-") for _ in range(3))
    for folder in empty, used, gone:
        os.rename(folder / golden.MARK, golden._aside(folder))
    gone.rmdir()
    (used / "NOTES.txt").write_text("mine\n")
    shutil.move(root / CASE, tmp_path / "elsewhere")
    before = _tree(root)
    proc = harness("golden", "verify", "--case", CASE, golden_dir=root)
    assert proc.returncode == 2 and f"{used.name} left alone" in proc.stderr and empty.name not in proc.stderr, proc.stderr
    assert _tree(root) == before
    shutil.move(tmp_path / "elsewhere", root / CASE)
    proc = harness("golden", "refresh", "--case", CASE, golden_dir=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    removed = [f"{CASE}: removed {name}, left by a killed refresh" 
               for name in (empty.name, golden._aside(used).name, golden._aside(gone).name)]
    assert sorted(line for line in proc.stdout.splitlines() if "removed" in line) == sorted(removed), proc.stdout
    assert f"{CASE}: left {used.name} alone" in proc.stdout
    assert sorted(p.name for p in root.iterdir() if p.name != golden.LOCK) == sorted(["cases.toml", CASE, used.name])
    assert (used / "NOTES.txt").read_text() == "mine\n"
