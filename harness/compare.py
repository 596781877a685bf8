"""Compare two results JSON files (base vs head) and gate on regressions.

A numeric metric regresses when it moves the wrong way by more than the factor f
(lower-is-better: head > base * (1 + f); higher-is-better: head * (1 + f) < base).
A verdict regresses when it goes from pass to fail or error. Rows on one side only
are reported as added/removed, never as regressions. When both rows carry an IQR,
a change past the factor that stays inside iqr_base + iqr_head is "noisy", not a
regression (same-commit reruns move that much).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.datafiles import read_json
from harness.errors import HarnessError
from harness.results import SCHEMA

KEY_FIELDS = ("preset", "scale", "scenario", "strategy", "backend", "metric")
BETTER = ("lower", "higher", None)
BAD_VERDICTS = ("fail", "error")
REGRESSED = "regressed"
STATUS_STYLE = {
    REGRESSED: "bold red",
    "improved": "green",
    "fixed": "green",
    "changed": "yellow",
    "noisy": "yellow",
    "incomparable": "yellow",
    "added": "cyan",
    "removed": "cyan",
}


@dataclass(frozen=True)
class Change:
    """One row key as seen on both sides; base/head are the row dicts or None."""

    key: tuple
    base: dict | None
    head: dict | None
    status: str  # regressed, noisy, improved, fixed, changed, incomparable, added, removed, unchanged
    ratio: float | None = None
    beyond_noise: bool | None = None  # None: no IQR on both sides


@dataclass(frozen=True)
class Comparison:
    changes: list[Change]
    max_regression: float

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.status == REGRESSED]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0


def parse_factor(text: str | float) -> float:
    """'10%' or 0.10 -> 0.10. A bare number must be a fraction below 1 (1.10 is ambiguous)."""
    where = "--max-regression"
    raw = str(text).strip()
    percent = raw.endswith("%")
    try:
        value = float(raw[:-1] if percent else raw)
    except ValueError:
        raise HarnessError(where, f"not a factor: {raw!r} (use e.g. 10% or 0.10)") from None
    if percent:
        value /= 100.0
    elif value >= 1.0:
        raise HarnessError(where, f"{raw!r} is ambiguous: write a percentage ({value * 100:g}%) or a fraction below 1")
    if not math.isfinite(value) or value < 0:
        raise HarnessError(where, f"must be a finite non-negative factor, got {raw!r}")
    return value


def is_number(value) -> bool:
    """A finite int or float (not a bool): what a numeric metric value may be."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond float range
        return False


def _check_row(row, where: str) -> tuple:
    if not isinstance(row, dict):
        raise HarnessError(where, f"must be an object, got {type(row).__name__}")
    for name in KEY_FIELDS:
        if not isinstance(row.get(name), str):
            raise HarnessError(f"{where}.{name}", "missing or not a string")
    if "value" not in row:
        raise HarnessError(f"{where}.value", "missing")
    if row.get("better") not in BETTER:
        raise HarnessError(f"{where}.better", f"must be 'lower', 'higher' or null, got {row.get('better')!r}")
    if row.get("better") is not None and row["value"] is not None and not is_number(row["value"]):
        raise HarnessError(f"{where}.value", f"numeric metric needs a finite number or null, got {row['value']!r}")
    if row.get("iqr") is not None and not is_number(row["iqr"]):
        raise HarnessError(f"{where}.iqr", f"must be a finite number or null, got {row['iqr']!r}")
    return tuple(row[name] for name in KEY_FIELDS)


def index_rows(doc, where: str) -> dict[tuple, dict]:
    """Validate a results document and map each row key to its row."""
    if not isinstance(doc, dict):
        raise HarnessError(where, f"top level must be an object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise HarnessError(f"{where}: schema", f"expected {SCHEMA!r}, got {doc.get('schema')!r}")
    rows = doc.get("rows")
    if not isinstance(rows, list):
        raise HarnessError(f"{where}: rows", "missing or not a list")
    index = {}
    for i, row in enumerate(rows):
        key = _check_row(row, f"{where}: rows[{i}]")
        if key in index:
            raise HarnessError(f"{where}: rows[{i}]", f"duplicate row {'/'.join(key)}")
        index[key] = row
    return index


def load_results(path: str | Path) -> dict:
    """Read and validate one results file; errors name the file and field."""
    from harness.schema import ResultsFile, validate

    path = Path(path)
    doc = read_json(path)
    index_rows(doc, str(path))
    validate(doc, ResultsFile, path)
    return doc


def _noise(base: dict, head: dict) -> bool | None:
    if base.get("iqr") is None or head.get("iqr") is None:
        return None
    return abs(head["value"] - base["value"]) > base["iqr"] + head["iqr"]


def _numeric(key: tuple, base: dict, head: dict, f: float) -> Change:
    b, h = base["value"], head["value"]
    if b is None or h is None:
        return Change(key, base, head, "unchanged" if b == h else "changed")
    ratio = h / b if b else (None if h == b else math.inf)
    lower = head["better"] == "lower"
    worse, better = (h > b * (1 + f), h * (1 + f) < b) if lower else (h * (1 + f) < b, h > b * (1 + f))
    beyond_noise = _noise(base, head)
    if worse and beyond_noise is False:
        status = "noisy"  # past the factor but inside the two runs' combined IQR: not a regression
    else:
        status = REGRESSED if worse else "improved" if better else "unchanged"
    return Change(key, base, head, status, ratio, beyond_noise)


def _verdict(key: tuple, base: dict, head: dict) -> Change:
    b, h = base["value"], head["value"]
    if b == h:
        status = "unchanged"
    elif b == "pass" and h in BAD_VERDICTS:
        status = REGRESSED
    elif h == "pass" and b in BAD_VERDICTS:
        status = "fixed"
    else:
        status = "changed"
    return Change(key, base, head, status)


def _change(key: tuple, base: dict | None, head: dict | None, f: float) -> Change:
    if base is None:
        return Change(key, None, head, "added")
    if head is None:
        return Change(key, base, None, "removed")
    if base.get("better") != head.get("better") or base.get("unit") != head.get("unit"):
        return Change(key, base, head, "incomparable")
    if head.get("better") is None:
        return _verdict(key, base, head)
    return _numeric(key, base, head, f)


def compare_results(base: dict, head: dict, max_regression: float) -> Comparison:
    """Compare two results documents row by row (max_regression is a fraction, 0.10 = 10%)."""
    b, h = index_rows(base, "base"), index_rows(head, "head")
    changes = [_change(k, b.get(k), h.get(k), max_regression) for k in sorted(b.keys() | h.keys())]
    return Comparison(changes, max_regression)


def _fmt(row: dict | None) -> str:
    if row is None:
        return "-"
    value, unit = row["value"], row.get("unit")
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return f"{text} {unit}" if unit and value is not None else text


def _fmt_ratio(ratio: float | None) -> str:
    return "" if ratio is None else "inf" if math.isinf(ratio) else f"{ratio:.3f}x"


def _fmt_noise(beyond: bool | None) -> str:
    return "" if beyond is None else "beyond IQR" if beyond else "within IQR"


def comparison_table(comparison: Comparison) -> Table:
    """A rich table of every row whose status is not 'unchanged'."""
    pct = f"{comparison.max_regression * 100:g}%"
    table = Table(title=f"results comparison (max regression {pct})")
    for name in ("preset/scale/scenario", "strategy", "backend", "metric", "base", "head", "ratio", "status", "noise"):
        table.add_column(name, justify="right" if name in ("base", "head", "ratio") else "left")
    for c in comparison.changes:
        if c.status == "unchanged":
            continue
        preset, scale, scenario, strategy, backend, metric = c.key
        status = f"[{STATUS_STYLE[c.status]}]{c.status}[/]"
        table.add_row(f"{preset}/{scale}/{scenario}", strategy, backend, metric, _fmt(c.base), _fmt(c.head),
                      _fmt_ratio(c.ratio), status, _fmt_noise(c.beyond_noise))
    return table


def _summary(comparison: Comparison) -> str:
    counts: dict[str, int] = {}
    for c in comparison.changes:
        counts[c.status] = counts.get(c.status, 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return f"{len(comparison.changes)} rows: {parts}" if comparison.changes else "no rows on either side"


def main_compare(base_path, head_path, max_regression_text) -> int:
    """CLI body: 0 no regression, 1 regression, 2 bad input (one line on stderr)."""
    try:
        factor = parse_factor(max_regression_text)
        comparison = compare_results(load_results(base_path), load_results(head_path), factor)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    console = Console(width=None if sys.stdout.isatty() else 200)
    if any(c.status != "unchanged" for c in comparison.changes):
        console.print(comparison_table(comparison))
    console.print(_summary(comparison))
    if comparison.regressions:
        console.print(f"[bold red]REGRESSION[/]: {len(comparison.regressions)} metric(s) beyond {factor * 100:g}% or pass -> fail")
    return comparison.exit_code
