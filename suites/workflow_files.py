"""The repository's GitHub Actions workflows as the tests read them, and the git environment of their throwaway repos."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

WORKFLOWS = Path(__file__).resolve().parents[1] / ".github" / "workflows"
# commits in a throwaway repository: a fixed identity, none of the machine's or the user's git configuration
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def load(path: Path) -> dict:
    """One workflow file, its `on` key as written (YAML 1.1 reads the key `on` as True)."""
    doc = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))
    return doc


def workflow(name: str) -> dict:
    return load(WORKFLOWS / name)


def workflows() -> dict[str, dict]:
    """Every workflow of the repository, by file name."""
    return {p.name: load(p) for p in sorted(WORKFLOWS.glob("*.yml"))}


def triggers(doc: dict) -> set[str]:
    on = doc["on"]
    return {on} if isinstance(on, str) else set(on)
