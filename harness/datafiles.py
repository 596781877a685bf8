"""Reading the project's data files (JSON results and manifests, TOML scenarios and tables):
any problem is one HarnessError line naming the file."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from harness.errors import HarnessError

UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _read_text(path: Path) -> str:
    """The file as UTF-8 text (a UTF-8 BOM is dropped); UTF-16 is named as such, not "not text"."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise HarnessError(str(path), "no such file") from None
    except OSError as exc:
        raise HarnessError(str(path), f"cannot read: {exc.strerror}") from None
    if raw[:2] in UTF16_BOMS or (len(raw) > 1 and 0 in raw[:2] and max(raw[:2]) in range(9, 127)):  # BOM, or ASCII + NUL
        raise HarnessError(str(path), "UTF-16 text (Windows 'Unicode'); save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise HarnessError(str(path), f"not UTF-8 text (byte {exc.start})") from None


def read_json(path: str | Path):
    path = Path(path)
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise HarnessError(str(path), f"not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise HarnessError(str(path), "JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        raise HarnessError(str(path), f"not valid JSON: {exc}") from None


def read_toml(path: str | Path) -> dict:
    path = Path(path)
    try:
        return tomllib.loads(_read_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise HarnessError(str(path), f"malformed TOML: {exc}") from None
    except RecursionError:
        raise HarnessError(str(path), "TOML nested too deeply") from None
