"""Reading the project's data files (JSON results and manifests, TOML scenarios and tables):
any problem is one HarnessError line naming the file."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Callable

from harness.errors import HarnessError


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise HarnessError(str(path), "no such file") from None
    except UnicodeDecodeError:
        raise HarnessError(str(path), "not a text file") from None
    except OSError as exc:
        raise HarnessError(str(path), f"cannot read: {exc.strerror}") from None


def read_json(path: str | Path):
    path = Path(path)
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise HarnessError(str(path), f"not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def read_toml(path: str | Path) -> dict:
    path = Path(path)
    try:
        return tomllib.loads(_read_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise HarnessError(str(path), f"malformed TOML: {exc}") from None


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call write(tmp) for a temporary file beside `path`, then move it into place: readers never
    see a half-written file, and a failed write leaves the previous file untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
