#!/usr/bin/env python3
"""Mirror ci/workflows/*.yml into .github/workflows/ (GitHub runs only that folder).

usage: python ci/sync_workflows.py           copy, and delete copies whose source is gone
       python ci/sync_workflows.py --check   exit 1, listing the differences, if out of sync
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "ci" / "workflows"
TARGET = ROOT / ".github" / "workflows"
PATTERNS = ("*.yml", "*.yaml")


def _workflows(folder: Path) -> dict[str, Path]:
    return {p.name: p for pattern in PATTERNS for p in folder.glob(pattern)} if folder.is_dir() else {}


def differences(source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """What would change in `target` to mirror `source`, one line each."""
    src, dst = _workflows(source), _workflows(target)
    out = [f"missing: {target.name}/{n}" for n in sorted(src.keys() - dst.keys())]
    out += [f"differs: {target.name}/{n}" for n in sorted(src.keys() & dst.keys())
            if src[n].read_bytes() != dst[n].read_bytes()]
    out += [f"stale:   {target.name}/{n} (no {source.name}/{n})" for n in sorted(dst.keys() - src.keys())]
    return out


def sync(source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """Make `target` mirror `source`; returns what changed."""
    changes = differences(source, target)
    target.mkdir(parents=True, exist_ok=True)
    src = _workflows(source)
    for name, path in src.items():
        shutil.copyfile(path, target / name)
    for name, path in _workflows(target).items():
        if name not in src:
            path.unlink()
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report; exit 1 when out of sync")
    args = parser.parse_args(argv)
    if args.check:
        diffs = differences()
        for line in diffs:
            print(line)
        if diffs:
            print("workflows out of sync: run python ci/sync_workflows.py", file=sys.stderr)
        return 1 if diffs else 0
    for line in sync():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
