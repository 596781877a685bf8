"""Reading the project's data files (JSON results and manifests, TOML scenarios and tables):
any problem is one HarnessError line naming the file."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path

from harness.errors import HarnessError

MAX_INT_DIGITS = 18  # an integer written longer lies past every bound the harness reads (and int() refuses 4,300 digits)

UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
MAX_BYTES = 256 << 20  # larger is no file of the harness's (an endless stream such as /dev/zero would fill memory)


def read_text(path: Path) -> str:
    """The file as UTF-8 text (a UTF-8 BOM is dropped; at most MAX_BYTES); UTF-16 is named as such, not "not text".
    A pipe (FIFO) is refused before it is opened: with no writer, opening one waits forever."""
    try:
        if stat.S_ISFIFO(os.stat(path).st_mode):
            raise HarnessError(str(path), "a pipe (FIFO), not a file; nothing was read (save it to a file)")
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise HarnessError(str(path), "no such file") from None
    except OSError as exc:
        raise HarnessError(str(path), f"cannot read: {exc.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise HarnessError(str(path), f"more than {MAX_BYTES >> 20} MiB: not a results file, manifest, scenario or table")
    if raw[:2] in UTF16_BOMS or (len(raw) > 1 and 0 in raw[:2] and max(raw[:2]) in range(9, 127)):  # BOM, or ASCII + NUL
        raise HarnessError(str(path), "UTF-16 text (Windows 'Unicode'); save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise HarnessError(str(path), f"not UTF-8 text (byte {exc.start})") from None


class DuplicateKey(Exception):
    """A JSON object that gives one key twice (json.loads would keep the last one silently)."""


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


def _not_text(value, where: str = "top level") -> str | None:
    """The path of the first key or string that is no Unicode text (a lone surrogate escape such
    as \\ud800: nothing can print it), else None."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return where
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        at = f"{where}[{key}]" if isinstance(key, int) else key if where == "top level" else f"{where}.{key}"
        if bad := (_not_text(key, at) if isinstance(key, str) else None) or _not_text(item, at):
            return bad
    return None


def read_json(path: str | Path):
    """A JSON file's document: a key given twice in one object, or a string that is no Unicode text, is refused."""
    path = Path(path)
    try:
        doc = json.loads(read_text(path), object_pairs_hook=unique_keys)
        bad = _not_text(doc)
    except DuplicateKey as exc:
        raise HarnessError(f"{path}: {exc.args[0]}", "duplicate key: given twice in one object, of which a reader would see only the last") from None
    except json.JSONDecodeError as exc:
        raise HarnessError(str(path), f"not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise HarnessError(str(path), "JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        raise HarnessError(str(path), f"not valid JSON: {exc}") from None
    if bad:
        raise HarnessError(f"{path}: {bad}", "a lone surrogate escape (\\ud800-\\udfff): not Unicode text")
    return doc


def read_toml(path: str | Path) -> dict:
    path = Path(path)
    try:
        return tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise HarnessError(str(path), f"malformed TOML: {exc}") from None
    except RecursionError:
        raise HarnessError(str(path), "TOML nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        raise HarnessError(str(path), f"malformed TOML: {exc}") from None
