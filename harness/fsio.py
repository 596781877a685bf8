"""Writing output files safely: the one writer for results, dumps, goldens, bundles and reports.

An existing file is never replaced unless the user said so (`--force`): `check_writable` refuses it
before any work, so a run cannot destroy a baseline, a report or any other file already on disk; and
a path it found free is written only while it still is (a file or a link made there while the run worked,
by the user or a second run, is kept and the write refused). `write_files` writes several files as one.

A path is written THROUGH a symlink (its final target is updated, the link stays); a link that leads nowhere makes
its target, but only in a folder that exists (no folder is made where a link leads). A regular
file (or a new one) is replaced atomically: a temporary file beside the target, then one
rename, so readers never see half a file and a failed write leaves the previous one intact.
A standard stream's name (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N, or a link to one) is written to
that open descriptor, whatever is behind it (a pipe, a terminal, a file: appended to when opened for append), never
replaced nor refused as existing. Another non-regular target (a named pipe) is streamed to; a block device (a disk's
raw bytes) or a socket is refused. New files get the usual mode
(0666 less the umask), never a temporary file's 0600. Failures are one HarnessError line.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
from pathlib import Path

from harness.errors import HarnessError, check_interrupted

_FOUND_FREE: dict[Path, Path] = {}  # path check_writable found free without --force -> the file it named then: never
# replaced when written, nor written elsewhere through a link made there meanwhile
_FD_NAME = re.compile(r"/(?:dev|proc/self)/fd/(\d+)")
_STD_NAMES = {"/dev/stdout": "/dev/fd/1", "/dev/stderr": "/dev/fd/2"}


def umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _target(path: Path) -> Path:
    """The file a write to `path` must change: the end of its symlink chain."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _loops(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def _fd(path: Path) -> int | None:
    """The open descriptor `path` names (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N, or a link to one), else
    None. Links are followed one at a time: resolved at once, the name ends at the file behind the descriptor."""
    name = os.path.abspath(path)
    for _ in range(40):  # the kernel's limit on a chain of links
        if match := _FD_NAME.fullmatch(_STD_NAMES.get(name, name)):
            return int(match[1])
        if not os.path.islink(name):
            return None
        name = os.path.normpath(os.path.join(os.path.dirname(name), os.readlink(name)))
    return None


def _is_stream(path: Path) -> bool:
    """Written to as it is, never staged: an open descriptor's name, or a target that is not a regular file."""
    if _fd(path) is not None:
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # missing, or a parent that is not a folder: checked when it is created
        return False


def _disk_or_socket(path: Path) -> str:
    """What `path` is when it is a block device (a write would overwrite the disk's raw bytes) or a socket (it cannot
    be opened): no stream to write to; else ''."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    return "a block device (a disk)" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else ""


def check_writable(path: str | Path, flag: str, force: bool = False) -> None:
    """Fail before any work when `path` cannot be written (a folder, an unwritable or missing
    parent, an over-long name) or names a file that exists (unless `force`, the `--force` option);
    streams such as /dev/stdout are fine."""
    path = Path(path)
    try:
        _check_writable(path, flag, force)
    except OSError as exc:
        raise HarnessError(flag, f"{path}: {exc.strerror or exc}") from None


def _check_writable(path: Path, flag: str, force: bool) -> None:
    if (fd := _fd(path)) is not None:  # written to as it is open: never replaced, never 'exists'
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise HarnessError(flag, f"{path} is not open for writing")
        return
    if path.is_symlink() and _loops(path):
        raise HarnessError(flag, f"{path} is a link that leads back to itself; nothing was written")
    if path.is_dir():
        raise HarnessError(flag, f"{path} is a folder, not a file")
    if kind := _disk_or_socket(path):
        raise HarnessError(flag, f"{path} is {kind}, not a file, pipe or terminal; nothing was written")
    if _is_stream(path):
        if not os.access(path, os.W_OK):
            raise HarnessError(flag, f"{path} is not writable")
        return
    if path.exists() and not force:
        raise HarnessError(flag, f"{path} exists; nothing was written (choose a new path, or --force replaces it)")
    target = _target(path)
    if force:
        _FOUND_FREE.pop(Path(os.path.abspath(path)), None)
    else:
        _FOUND_FREE[Path(os.path.abspath(path))] = Path(os.path.abspath(target))
    if path.is_symlink() and not target.parent.exists():
        raise HarnessError(flag, f"{path} is a link to {os.readlink(path)}, whose folder {target.parent} does not exist; "
                                 "nothing was written")
    existing = check_new_dir(target.parent, flag)  # created when written: a refusal later leaves no empty folder behind
    limit = os.pathconf(existing, "PC_NAME_MAX")
    if len(os.fsencode(f".{target.name}.tmp-{os.getpid()}")) > limit:
        raise HarnessError(flag, f"file name {target.name[:40]!r}... is too long (limit {limit} bytes with the temporary prefix)")


def refuse_link(path: Path, flag: str) -> None:
    """For a report's own files in its output folder: --force replaces them, never a file a link there leads to
    (check_writable writes through links, as a user's --json link to elsewhere asks)."""
    if path.is_symlink():
        raise HarnessError(flag, f"{path} is a link to {os.path.realpath(path)}; nothing was written")


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _same_file(a: Path, b: Path) -> bool:
    """One file under two names: the same path after symlinks and relative parts, or a hard link."""
    if _real(a) == _real(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # either one missing
        return False


def refuse_overwriting_inputs(outputs, inputs, protected) -> None:
    """Before any work: fail (one HarnessError naming the option and path) when an output path is
    one of the run's inputs, or lies inside a protected folder such as the goldens.

    outputs: (option, path) pairs; inputs: (what, path) pairs; protected: (what, folder) pairs."""
    inputs = list(inputs)
    folders = [(what, _real(Path(f))) for what, f in protected]
    for flag, out in outputs:
        out = Path(out)
        real = _real(out)
        for what, folder in folders:
            if real == folder or folder in real.parents:
                raise HarnessError(flag, f"{out} lies inside {what} {folder}: outputs are never written there")
        for what, path in inputs:
            if _same_file(out, Path(path)):
                raise HarnessError(flag, f"{out} is {what} {path}: outputs never overwrite inputs")


def refuse_filled_dir(folder: Path, flag: str, force: bool, writes: str) -> None:
    """An output folder is new or empty unless `force`, which writes `writes` into it: a folder that already holds
    files is never written into unasked."""
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise HarnessError(flag, f"{folder} already holds files; --force writes {writes} into it")


def check_new_dir(folder: str | Path, flag: str) -> Path:
    """Fail unless `folder` is a writable folder or can be created (nothing is created); the folder, or its
    nearest existing ancestor."""
    folder = Path(folder)
    existing = next(p for p in (folder, *folder.absolute().parents) if os.path.lexists(p))
    if existing.is_symlink() and not existing.exists():
        raise HarnessError(flag, f"{existing} is a link to {os.readlink(existing)}, which does not exist; nothing was written")
    if not existing.is_dir():
        raise HarnessError(flag, f"{existing} exists and is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise HarnessError(flag, f"{existing} is not writable")
    return existing


def write_bytes(path: str | Path, data: bytes, flag: str | None = None) -> Path:
    """Write `data` to `path` (through symlinks; atomically for regular files; a path check_writable
    found free only while nothing is there: linked into place, never renamed over). Returns the path.
    An error names `flag` (the option that gave the path) before the path."""
    write_files({Path(path): data}, flag)
    return Path(path)


def write_files(files: dict[Path, bytes], flag: str | None = None) -> None:
    """Write several files as one (a report and its plots): every regular file is first staged in full beside its
    target and every target checked, then all are moved into place, so a failure or an interrupt leaves each file as
    it was. One while moving (a file made at a target in the moment since its check) takes back the new files moved
    in; the error names those it replaced or streamed to, which cannot be taken back."""
    check_interrupted()  # a Ctrl-C or SIGTERM that something caught on the way (torch importing numpy): nothing is written
    staged: list[tuple[Path, Path | None, bytes]] = []  # (path, its staged temporary file or None: a stream)
    at, moved, written = None, 0, []
    try:
        try:
            for at, data in files.items():
                staged.append((at, None if _is_stream(at) else _stage(at, data), data))
            for at, tmp, _ in staged:  # every target, before the first is moved in
                _check_free(at, tmp)
            for at, tmp, data in staged:
                _place(at, tmp, data)
                moved += 1
        except BaseException:
            written = [str(path) for path, tmp, _ in staged[:moved] if not _take_back(path, tmp)]
            raise
        finally:
            for _, tmp, _ in staged:
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
    except FileExistsError:
        raise HarnessError(f"{flag} {at}" if flag else str(at), f"a file appeared there while the run worked: it was kept "
                           f"and {_written(written)} (choose a new path, or --force replaces it)") from None
    except OSError as exc:
        raise HarnessError(f"{flag} {at}" if flag else str(at),
                           f"cannot write: {exc.strerror or exc}" + (f"; {_written(written)}" if written else "")) from None


def _written(paths: list[str]) -> str:
    return f"only {', '.join(paths)} {'was' if len(paths) == 1 else 'were'} written" if paths else "nothing was written"


def _stage(path: Path, data: bytes) -> Path:
    """`data` in a new temporary file beside the file `path` names, flushed to disk."""
    target = _target(path)
    if not path.is_symlink():  # never a folder where a link leads (check_writable refuses a link into a missing one)
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _check_free(path: Path, tmp: Path | None) -> None:
    """A path check_writable found free must still be free and name the same file: a file or a link made there
    meanwhile is kept (FileExistsError)."""
    given, target = Path(os.path.abspath(path)), _target(path)
    if tmp is not None and given in _FOUND_FREE and (Path(os.path.abspath(target)) != _FOUND_FREE[given]
                                                     or tmp.parent != target.parent or os.path.lexists(target)):
        raise FileExistsError(path)


def _place(path: Path, tmp: Path | None, data: bytes) -> None:
    """Move a staged file to the file `path` names (a stream: write `data` to it, an open descriptor as it is open);
    a path check_writable found free only while it still is (FileExistsError)."""
    if tmp is None:
        if (fd := _fd(path)) is not None:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            return
        with open(path, "wb") as f:
            f.write(data)
        return
    given, target = Path(os.path.abspath(path)), _target(path)
    if given in _FOUND_FREE:
        _check_free(path, tmp)
        _place_new(tmp, target)
        del _FOUND_FREE[given]
    else:
        os.replace(tmp, target)


def _place_new(tmp: Path, target: Path) -> None:
    """Move `tmp` to `target` unless something is there (FileExistsError): a hard link fails atomically
    when `target` exists; where links are not supported, a check right before the rename."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise
    except OSError:
        if os.path.lexists(target):
            raise FileExistsError(target) from None
        os.replace(tmp, target)


def _take_back(path: Path, tmp: Path | None) -> bool:
    """Remove the file `_place` moved in at a free path (a hard link of its staged file, still there); False for a
    file it replaced or a stream it wrote to."""
    try:
        if tmp is None or not os.path.samefile(tmp, _target(path)):
            return False
    except OSError:  # the staged file was renamed into place: it replaced one, or links are not supported
        return False
    _target(path).unlink()
    return True


def write_text(path: str | Path, text: str, flag: str | None = None) -> Path:
    return write_bytes(path, text.encode(), flag)


def share_folder(folder: str | Path) -> None:
    """Give a folder made by tempfile.mkdtemp (0700) the usual mode, 0777 less the umask."""
    os.chmod(folder, 0o777 & ~umask())


def refuse_idle_force(force: bool, *outputs: tuple[str, object]) -> None:
    """--force names what it may replace: given with none of those `outputs` ((option, value), ...), it would
    replace nothing, and a user who passed it thinking otherwise gets one line instead of a silent exit 0."""
    if force and not any(value for _, value in outputs):
        raise HarnessError("--force", f"replaces only {' / '.join(name for name, _ in outputs)} files that already exist; "
                                      "none was named")
